"""The one error the job history raises on purpose, and the words for a driver's error.

A driver's exception text carries SQL, parameters and a link to the SQLAlchemy docs; a user running the
profiler needs only what went wrong and where, on one line."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from kubecell.core.errors import KubecellError


class ProfilerStoreError(KubecellError):
    """The job history cannot be opened, read or written: a bad URL, an unreachable server, a file that is not a
    job history, a schema newer than this code, a record it cannot keep."""


class JobOfAnotherNamespaceError(ProfilerStoreError):
    """A job whose key the history holds already for a job of another namespace. Owners' uids are unique in a
    cluster, so this is a pod whose owner reference names another namespace's owner (the API server checks
    neither its kind, name nor uid): it is refused, and the job kept is not replaced."""


def describe(error: BaseException) -> str:
    """The driver's own message, first line only, without the statement and parameters SQLAlchemy appends."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        text = str(error.orig)
    elif isinstance(error, SQLAlchemyError):
        text = str(error.args[0]) if error.args else type(error).__name__
    else:
        text = str(error) or type(error).__name__
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
