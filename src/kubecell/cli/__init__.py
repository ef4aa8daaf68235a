"""The composition roots: every command line (``kubecell ...``), and the scheduler as a process (``service``),
which put the drivers, the Kubernetes adapter and the testbed together. Nothing imports this package."""
