"""Telling a waiting pod why it waits: its PodScheduled condition and a FailedScheduling Event, without a write
storm when thousands of pods wait (see :class:`Teller`)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from kubecell.kube import pods
from kubecell.kube.actions import Actions, retry


class Teller:
    """Says why a pod waits: the PodScheduled condition and a FailedScheduling Event.

    A pod's story is told again when it changes, but not every time a number in it moves: the node
    counts of a waiting pod ("0/5000 nodes fit one member: 4,212 insufficient GPUs, ...") change with
    every arrival, and rewriting thousands of waiting pods each cycle would be a write storm. So a new
    kind of reason (the message with its numbers blanked) is told at once, with an Event; the same kind
    with new numbers only refreshes the condition, at most every ``refresh_seconds``."""

    def __init__(self, actions: Actions, *, refresh_seconds: float = 30.0, quiet: bool = False) -> None:
        self.actions = actions
        self.refresh_seconds = refresh_seconds
        self.quiet = quiet
        """Extender mode: kube-scheduler writes the pod's condition and Events from the reasons kubecell's
        filter gives it; the story is only kept here (``told``) for that filter to read."""
        self.told: dict[str, tuple[str, float]] = {}

    def tell(self, pod: Mapping[str, Any], message: str, *, reason: str = "Unschedulable", event: bool = True) -> None:
        uid, now = pods.uid(pod), time.monotonic()
        if self.quiet:
            self.told[uid] = (message, now)
            return
        last = self.told.get(uid)
        if last is not None:
            if last[0] == message:
                return
            if _kind(last[0]) == _kind(message):
                if now - last[1] < self.refresh_seconds:
                    return
                event = False  # the same story with new numbers: the condition only
        self.told[uid] = (message, now)
        retry("explain", lambda: self.actions.unschedulable(pod, message, reason=reason, event=event))

    def forget(self, uid: str) -> None:
        self.told.pop(uid, None)


def _kind(message: str) -> str:
    return _NUMBERS.sub("#", message)


_NUMBERS = re.compile(r"\d[\d,.]*")
