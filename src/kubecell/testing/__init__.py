"""Test infrastructure that ships with kubecell: machinery the test suite (and anyone checking an engine
change) uses, not part of the scheduler or the simulator. ``kubecell.testing.scenarios`` runs the YAML
conformance scenarios of ``tests/core/engine/scenarios/``."""
