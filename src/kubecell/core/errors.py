"""Error types shared by the core and its drivers.

Every error a user can cause carries enough context to fix it without reading a traceback:
where (file, row, field or object), what was wrong, and what would have been accepted. The CLI
prints ``str(error)`` on one line and exits non-zero; only programming errors produce tracebacks.
"""

from __future__ import annotations


class KubecellError(Exception):
    """Base class of every error kubecell raises on purpose."""


class InvalidInputError(KubecellError):
    """Input that kubecell cannot accept: malformed file, bad field value, unknown name.

    ``location`` is a human-readable place such as ``nodes.csv:17`` or ``tenants.yaml: vcs.alpha``;
    ``field`` names the offending field; ``accepted`` says what would have been valid.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        field: str | None = None,
        accepted: str | None = None,
    ) -> None:
        self.message = message
        self.location = location
        self.field = field
        self.accepted = accepted
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.location:
            parts.append(self.location)
        if self.field:
            parts.append(f"field '{self.field}'")
        head = ": ".join(parts)
        text = f"{head}: {self.message}" if head else self.message
        if self.accepted:
            text += f" (accepted: {self.accepted})"
        return text


class UnknownPolicyError(InvalidInputError):
    """A placement policy name that is not registered."""


class AllocationError(KubecellError):
    """An allocation that would break an invariant of the allocation book (oversubscription, a GPU
    that does not exist, a duplicate allocation id). Raised before any state is changed."""
