"""The pure scheduling core: model, allocation book, placement, tenancy, engine.

Nothing under this package performs I/O or imports the simulator, Kubernetes or the node agent.
"""
