"""A claim's selectors run in slices of a scheduling pass, never the claim's whole time at once: a selector made
to run just under the 50 ms a device is allowed held the scheduler's only loop for the claim's whole time (25 s
over 8,000 devices), once per new claim. Now each pass spends at most ``PASS_SELECTOR_SECONDS`` on selectors it
has not run before; a claim not through is read again at the next pass, from where it stopped, and is refused
only once its own time (``claim_seconds``) is spent."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from kubecell.kube.dra import cel
from kubecell.kube.dra.claims import ClaimError
from kubecell.kube.dra.slices import published_devices
from kubecell.kube.rest import Kube
from kubecell.scheduler.claim_devices import Devices
from kubecell.scheduler.claims import ClaimBroker, ClaimsDeferred
from kubecell.scheduler.cluster import Mirror
from tests.kube.dra import CLASSES, claim, gpu_device, node_slice, request

DEVICES = 60
PASS = 0.1


def slow(tag: int) -> str:
    """A selector of some 10-30 ms a device here (under the 50 ms a device is allowed), ``tag`` making it new:
    0.5-1.5 s over the 60 devices: several passes of ``PASS`` on a fast machine too."""
    numbers = "[" + ",".join(str(i) for i in range(150)) + "]"
    return f'{numbers}.all(x, x >= -{tag}) && device.attributes["gpu.kubecell.io"].index >= 0'


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> tuple[ClaimBroker, Devices]:
    # The selectors here take 10-30 ms a device on an idle machine, and more on a loaded one (a full CI run
    # took one past the 50 ms a device is allowed, and the claim was refused); what these tests measure is
    # the pass's and the claim's time, so the per-device limit is lifted out of their way.
    monkeypatch.setattr(cel, "DEVICE_SECONDS", 5.0)
    cel._clear_caches()
    mirror = Mirror()
    mirror.deviceclasses = dict(CLASSES)
    listed, _ = published_devices([node_slice("node-a", [gpu_device(i) for i in range(DEVICES)])])
    return ClaimBroker(mirror, cast(Kube, None)), Devices({}, {}, (), tuple(listed))


def in_passes(broker: ClaimBroker, devices: Devices, body: dict[str, Any], most: int = 200) -> tuple[Any, list[float]]:
    """Read ``body`` pass after pass until it is through or refused: (the demand or the refusal, each pass's
    seconds)."""
    took: list[float] = []
    starts: list[bool] = []
    for _ in range(most):
        started = time.monotonic()
        try:
            with broker.selector_pass(PASS):
                found: Any = broker._demand(body, devices)
        except ClaimsDeferred as deferred:
            took.append(time.monotonic() - started)
            starts.append(deferred.started)
            continue
        except ClaimError as refused:
            found = refused
        took.append(time.monotonic() - started)
        assert all(starts), "each pass ran this claim's selectors (the only claim)"
        return found, took
    raise AssertionError(f"not through in {most} passes")


def test_a_slow_claim_is_read_over_several_passes_each_short(
        broker: tuple[ClaimBroker, Devices], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubecell.kube.dra.claims.CLAIM_SELECTOR_SECONDS", 60.0)  # never refused here
    found, took = in_passes(*broker, claim(request(selectors=(slow(1),))))
    assert not isinstance(found, ClaimError), found
    assert found.count == 1
    assert found.allowed is None, "every device qualifies, as read at once"
    assert len(took) >= 3, f"{sum(took):.2f} s of selectors in {len(took)} passes of {PASS} s"
    # A pass stops at its deadline, between devices or inside one (the clock is read every 256 steps), so it
    # runs over by at most one device's evaluation: 50 ms at most, here.
    assert max(took[:-1]) < PASS + 0.3, took


def test_progress_is_kept_between_passes_and_the_claims_own_time_still_ends_it(
        broker: tuple[ClaimBroker, Devices], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubecell.kube.dra.claims.CLAIM_SELECTOR_SECONDS", 0.0)
    monkeypatch.setattr("kubecell.kube.dra.claims.CLAIM_SELECTOR_SECONDS_PER_DEVICE", 0.005)  # 0.3 s in all
    body = claim(request(selectors=(slow(2),)))
    found, took = in_passes(*broker, body)
    assert isinstance(found, ClaimError), found
    assert "ran out of the time a claim is given" in found.reason, found
    assert 0.3 <= sum(took) < 0.3 + 5 * PASS, f"refused once its own 0.3 s were spent over passes: {took}"
    started = time.monotonic()
    with broker[0].selector_pass(PASS), pytest.raises(ClaimError, match="ran out of the time"):
        broker[0]._demand(body, broker[1])
    assert time.monotonic() - started < 0.25, "a refusal is kept, not paid for again (running took 0.3 s)"


def test_a_pass_whose_time_is_spent_defers_a_new_claim_without_running_it(
        broker: tuple[ClaimBroker, Devices], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubecell.kube.dra.claims.CLAIM_SELECTOR_SECONDS", 60.0)
    claims, devices = broker
    claims._demand(claim(request(), name="warm"), devices)  # the class's selector, run on every device
    with claims.selector_pass(PASS):
        with pytest.raises(ClaimsDeferred) as first:
            claims._demand(claim(request(selectors=(slow(3),)), name="first"), devices)
        assert first.value.started
        assert first.value.key == "ns/first"
        started = time.monotonic()
        with pytest.raises(ClaimsDeferred) as second:
            claims._demand(claim(request(selectors=(slow(4),)), name="second"), devices)
        assert not second.value.started
        assert time.monotonic() - started < 0.25
        assert not cel.is_compiled(slow(4)), "no time left: not even parsed (the longest take seconds)"
        # a claim whose selectors' results are all kept (the class's alone) takes no time: read at once
        assert claims._demand(claim(request(count=2), name="plain"), devices).count == 2


def test_outside_a_pass_and_on_other_threads_a_claim_is_read_at_once(
        broker: tuple[ClaimBroker, Devices], monkeypatch: pytest.MonkeyPatch) -> None:
    """The binder plans claims on the loop after the pass and a restore reads them before any: both get the
    claim's whole time; a pass open on the loop is not another thread's."""
    monkeypatch.setattr("kubecell.kube.dra.claims.CLAIM_SELECTOR_SECONDS", 60.0)
    claims, devices = broker
    assert claims._demand(claim(request(selectors=(slow(5),))), devices).count == 1
    answers: list[Any] = []

    def read_elsewhere() -> None:
        try:
            answers.append(claims._demand(claim(request(selectors=(slow(6),))), devices))
        except Exception as error:  # shown by the assertion below, not lost with the thread
            answers.append(error)

    with claims.selector_pass(0.0):
        worker = threading.Thread(target=read_elsewhere)
        worker.start()
        worker.join(60)
    assert [getattr(answer, "count", answer) for answer in answers] == [1]
