"""The node agent's tests that need the API server use the Kubernetes tests' fixtures."""

from tests.cluster_fixtures import namespace, start_scheduler

__all__ = ["namespace", "start_scheduler"]
