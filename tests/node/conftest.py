"""The node agent's tests that need the API server use the Kubernetes tests' fixtures."""

from tests.k8s.conftest import namespace, start_scheduler

__all__ = ["namespace", "start_scheduler"]
