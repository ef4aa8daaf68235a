"""``kubecell scheduler``: the engine driven by a real API server.

The package only drives: pods become the engine's jobs (``jobs``, ``intake``), the engine's decisions become
allocation records, Bindings, Evictions and Events (``binder``, through ``kubecell.kube.actions``), and the API
server's objects are the only state that survives a restart (``restore``). Every decision is the engine's.
``extender`` serves the same loop to kube-scheduler as an HTTP extender and owns the decisions it holds until
kube-scheduler binds; ``observe`` reads the loop through a narrow read-only view (snapshot, metrics, the
dashboard, ``inspect``).
"""
