"""An API client for a scheduler that runs with no API server: the extender bench and the loop's own tests feed
it nodes and pods as watch events. Every read finds nothing (404), as on an empty cluster, and every write is
refused, so whatever tries one fails loudly instead of pretending it was written."""

from __future__ import annotations

from typing import Any, NoReturn

from kubecell.kube.rest import ApiError


class OfflineKube:
    """Stands in for :class:`~kubecell.kube.rest.Kube` (``cast`` it): reads 404, writes 405."""

    def get(self, path: str, **query: Any) -> NoReturn:
        raise ApiError(404, "NotFound", f"no API server: {path} is not there", method="GET", path=path)

    def _refused(self, method: str, path: str) -> NoReturn:
        raise ApiError(405, "MethodNotAllowed", f"no API server: {method} {path} is not written", method=method,
                       path=path)

    def create(self, path: str, body: Any, **query: Any) -> NoReturn:
        self._refused("POST", path)

    def replace(self, path: str, body: Any, **query: Any) -> NoReturn:
        self._refused("PUT", path)

    def patch(self, path: str, body: Any, **query: Any) -> NoReturn:
        self._refused("PATCH", path)

    def delete(self, path: str, body: Any = None, **query: Any) -> NoReturn:
        self._refused("DELETE", path)

    def close(self) -> None:
        """Nothing to close."""
