"""Why-pending sentences reduced to a few kinds, for a metrics label and the dashboard's queue grouping.

The engine explains every waiting job in one specific sentence (``kubecell.core.engine.explain``); a
Prometheus label must not carry such text (every number in it would be a new series). ``reason_kind``
maps a sentence to one of ``REASON_KINDS`` by the rule that stopped the job, first match wins in the
order of ``_RULES`` (the more specific rules first: a job whose guarantee is in use *and* finds no idle
capacity to borrow waits for capacity, which is what an operator can act on).
"""

from __future__ import annotations

import re

REASON_KINDS = ("new", "binding", "config", "never_fits", "constraints", "reservation", "gang", "capacity",
                "quota", "victims", "other")
"""``new``: not tried yet; ``binding``: its last Binding was refused; ``config``: its VC is unknown or was
removed; ``never_fits``: no node or guarantee could ever hold it; ``constraints``: its node constraints
or GPU model rule out the nodes with room; ``reservation``: the room is reserved for a starving job;
``gang``: some members fit but not the gang's minimum; ``capacity``: no room now; ``quota``: its VC's
guarantee or borrowing limit is used up; ``victims``: waiting for preempted work to leave."""

_BREAKDOWN = re.compile(r"nodes fit one member: \d+ ([^,;()]+)")
_ROOMIEST = re.compile(r"the roomiest node takes (\d+) member")

_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("new", ("submitted; waiting for the next scheduling cycle", "not yet considered")),
    ("binding", ("binding failed", "reservation timed out before the job was bound")),
    ("config", ("unknown virtual cluster", "was removed by a configuration reload")),
    ("never_fits", ("could ever hold", "guarantees ")),
    ("victims", ("waiting for capacity freed by preemption", "waiting for its victims")),
)


def reason_kind(sentence: str, *, members: int = 1) -> str:
    """The kind of a why-pending sentence (one of ``REASON_KINDS``); ``members``: the job's headcount
    (a shortfall of a multi-member job where single members still fit is a ``gang`` wait)."""
    text = sentence.split(": pending: ", 1)[-1]  # engine.queries.explain prefixes "<job>: pending: "
    for kind, needles in _RULES:
        if any(needle in text for needle in needles):
            return kind
    top = _BREAKDOWN.search(text)
    if top is not None:
        first = top.group(1).strip()
        if first.startswith(("not allowed by the job's node constraints", "no GPU of the requested model")):
            return "constraints"
        if first.startswith("reserved for a starving job"):
            return "reservation"
    roomiest = _ROOMIEST.search(text)
    if roomiest is not None:
        return "gang" if members > 1 and int(roomiest.group(1)) > 0 else "capacity"
    if "no idle capacity" in text or "no free cell" in text:
        return "capacity"
    if "guarantee in use" in text or "borrowing limit" in text or "may borrow at most" in text \
            or "does not borrow" in text or "waits for guaranteed capacity" in text or "unused quota" in text:
        return "quota"
    return "other"
