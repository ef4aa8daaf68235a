"""Tests of the node agent's DRA driver, gpu.kubecell.io."""
