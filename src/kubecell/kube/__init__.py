"""The Kubernetes adapter that no driver owns: what the scheduler, the node agent and the operator tools all need
to talk to an API server and to read what is written there.

REST and watch (``rest``, ``watch``), the names kubecell uses (``names``), pod reads and writes (``pods``,
``actions``), allocation records and the rule for trusting one (``records``, ``trust``), node inventory and MIG
(``inventory_schema``, ``inventory``, ``mig``, ``gfd``, ``advertised``), leader election (``leader``,
``leader_label``), manifest apply (``apply``), VirtualClusters and the one rule for which tenants are in force
(``virtualclusters``, ``tenant_source``, ``accepted``), pod dialects cut by source system (``dialects``) and
node constraints (``constraints``). Everything here is translation around the pure core: it imports
``kubecell.core`` and ``kubecell.inputs``, never a driver.
"""
