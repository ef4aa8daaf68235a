"""Readers of the hand-written inputs: cluster descriptions, tenant configurations (and, through
``kubecell.testing.scenarios``, conformance scenarios), all YAML, all through one ``YamlDocument``.

A neutral home between the pure core and its drivers: the simulator, the Kubernetes driver and the
scenario runner all read the same formats, and ``kubecell.core`` never imports this package (the core
takes parsed data and, for line numbers, a locator callback).
"""
