"""Opening and closing nodes to new work without touching what runs there.

A Kubernetes node that is cordoned or stops being Ready keeps its pods: nothing may be evicted for it, and
their capacity stays counted, but nothing new may land there. For the engine that is neither a failure
(``Engine.set_node_health`` stops the jobs of a failed node) nor a change of the cluster's shape (which
would rebuild the engine and re-check every guarantee): the book closes the node (``AllocationBook.
set_node_open``), the tenancy state counts its GPUs as bad (HiveD's doomed-cell rule then says which
guarantee cannot be met meanwhile), and the queue looks again. Opening reverses each step.
"""

from __future__ import annotations

from kubecell.core.engine.session import Session


def set_node_open(session: Session, name: str, open_: bool) -> bool:
    """Open or close node ``name`` to new work; returns whether anything changed. Unknown names raise
    ``InvalidInputError`` (``AllocationBook.node``)."""
    book = session.book
    index = book.node(name)
    if bool(book.node_open[index]) == open_:
        return False
    book.set_node_open(index, open_)
    session.tenancy.refresh_health()
    session.queue.mark_dirty()
    return True


def set_node_lost(session: Session, name: str) -> None:
    """Hold node ``name`` as lost hardware: failed, its GPUs bad (their cells doomed where guarantees needed them),
    and, unlike ``Engine.set_node_health``, nothing stopped, since nothing runs there that the engine could move
    (work recorded on it is adopted where it is, and leaves with its pods)."""
    book = session.book
    book.set_node_health(book.node(name), False)
    session.tenancy.refresh_health()
    session.queue.mark_dirty()
