"""kubecell: a GPU-cluster scheduler for deep-learning workloads on Kubernetes.

The pure scheduling core lives in :mod:`kubecell.core`; drivers (simulator, Kubernetes scheduler,
node agent) translate the outside world into core types and never hold scheduling logic.
"""

__version__ = "0.1.0"
