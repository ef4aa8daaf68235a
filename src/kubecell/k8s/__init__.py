"""The Kubernetes adapter: API names, node inventory, pod dialects, allocation records and the drivers
(scheduler, extender) that connect the pure core to a real API server. Nothing in ``kubecell.core``
imports this package; everything here is thin translation around the core's one decision path.
"""
