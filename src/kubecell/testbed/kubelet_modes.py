"""Which of the testbed's kubelets serves a node: one label, read by both.

The fake kubelet (:mod:`kubecell.testbed.kubelet`) serves every testbed node but those labelled
``kubecell.io/testbed-runs=processes``, which the process kubelet (:mod:`kubecell.testbed.process_kubelet`)
serves: it runs their pods as real host processes. A label on the Node, rather than a list each kubelet
keeps, makes the choice visible (``kubectl get nodes -L kubecell.io/testbed-runs``) and lets the two
kubelets, in different processes, agree without talking to each other. This module is kept free of
imports so that the fake kubelet starts as fast as before.
"""

from __future__ import annotations

RUNS_LABEL = "kubecell.io/testbed-runs"
"""Node label: which testbed kubelet serves the node."""
RUNS_PROCESSES = "processes"
"""The value for the process kubelet (absent: the fake kubelet)."""
OWNED_SELECTOR = f"{RUNS_LABEL}={RUNS_PROCESSES}"
