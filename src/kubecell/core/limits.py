"""The largest amounts kubecell accepts, derived from how the allocation book stores them.

The book (``book.py``) keeps every amount in numpy ``int64`` arrays, whose largest value is 2^63 - 1;
a larger Python integer cannot even be stored (numpy raises ``OverflowError``). Storing is not enough:
the book and the engine also *add* amounts up: a cluster's total CPU (the dominant-share fairness of
``engine/ledger.py``), a gang's total (``members`` x the member's request), members a node could take
summed over all nodes (the gang PreFilter). So every single amount is limited to 2^40, and a gang to
2^22 members: a gang's total is then at most 2^62, half of what int64 holds, and so is a sum of
2^40-sized amounts over up to 2^22 nodes, far more nodes than the book's (nodes x GPU slots) arrays can
hold in memory. 2^40 is still far beyond any real machine: about a billion cores in milli-CPU, an
exbibyte in MiB.

Every input adapter checks its numbers against these limits with the accepted range in the message
(``file:line: field 'memory_mib': ... (accepted: 0..1099511627776)``), and ``make_node``, ``Request``
and ``JobSpec`` check them once more, so no input can reach the book with a number it cannot hold.
"""

from __future__ import annotations

import numbers

from kubecell.core.errors import InvalidInputError

AMOUNT_BITS = 40
"""Every CPU, memory or GPU-memory amount is at most 2^AMOUNT_BITS (see the module docstring)."""

MAX_CPU_MILLI = 1 << AMOUNT_BITS
"""Largest CPU amount of a node or a request, in milli-CPU (2^40: about 1.1 billion cores)."""

MAX_MEMORY_MIB = 1 << AMOUNT_BITS
"""Largest host-memory amount of a node or a request, in MiB (2^40 MiB = 1 EiB)."""

MAX_GPU_MEMORY_MIB = 1 << AMOUNT_BITS
"""Largest memory of one GPU, or GPU memory asked of one GPU, in MiB. It is also the capacity the book
gives a GPU whose memory is unknown (``book.UNENFORCED_GPU_MEMORY_MIB``), so that every request that
passes this check fits such a GPU, as the book promises."""

MAX_GANG_MEMBERS = 1 << (63 - 1 - AMOUNT_BITS)
"""Most members of one gang (2^22 = 4,194,304): members x a member's amount stays at most 2^62, half
of what the book's int64 holds, so a gang's total fits with room to add it to others."""

MAX_GPUS_PER_NODE = 64
"""Most GPUs on one node. Not a dtype limit: the book gives every node as many GPU slots as the widest
node has, so one absurd node would multiply the memory of every per-GPU array; 64 is several times
the largest machines built (8 or 16 GPUs)."""


def check_amount(value: int, high: int, *, what: str, field: str, location: str | None, low: int = 0) -> int:
    """Return ``value`` if it lies in ``low..high``; else raise naming the field and the accepted range.

    ``what`` says what the number is, with its unit (e.g. ``"host memory (MiB)"``), because the core's
    callers have no file line to point at and the field name alone does not say the unit.
    """
    if not is_whole(value):  # (1.5 GPUs or 2.5 members passed the range and crashed a cycle, as an IndexError)
        raise InvalidInputError(f"{what} {value!r} is not a whole number", location=location, field=field,
                                accepted=f"a whole number in {low}..{high}")
    if low <= value <= high:
        return value
    raise InvalidInputError(f"{what} {value} is out of range", location=location, field=field,
                            accepted=f"{low}..{high}")


def is_whole(value: object) -> bool:
    """An integer (a numpy integer too), never a bool or a float, even ``1.0``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
