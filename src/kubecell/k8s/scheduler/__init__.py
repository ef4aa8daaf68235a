"""``kubecell scheduler``: the engine driven by a real API server.

The package only translates: pods become the engine's jobs (``jobs``), the engine's decisions become
allocation records, Bindings, Evictions and Events (``actions``), and the API server's objects are the
only state that survives a restart (``scheduler.rebuild``). Every decision is the engine's.
"""
