"""Hostile input to the scheduler's side of DRA: slices a node writes to cost the scheduler's loop or to make a
selector see other values than kubecell checked, and selectors made to fill the evaluator's caches.

Each test fails on the code before its fix (found by a hostile review): a pool of thousands of devices was
checked for names published twice in quadratic time; the compile cache held 1,024 syntax trees of up to
~10 MiB each; the result cache kept each expression's text per entry and took ``True`` and ``1`` for one
value."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from kubecell.kube.dra import cel
from kubecell.kube.dra import slices as slices_module
from kubecell.kube.dra.cel import CelDevice, SelectorError, compile_selector
from kubecell.kube.dra.slices import MAX_SLICES_PER_POOL, PublishedDevice, published_devices
from kubecell.kube.dra_names import DRIVER
from tests.kube.dra import gpu_device, node_slice


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    """Each test starts and ends with empty CEL caches, so none sees another's entries."""
    cel._clear_caches()
    yield
    cel._clear_caches()


# -- slices -------------------------------------------------------------------------------------------------


def test_a_pool_of_thousands_of_devices_is_checked_for_names_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check for a device named twice in a pool used ``list.count`` per device: 16,384 devices (the most
    kubecell's own layout has) took 6 s of the scheduler's loop at every slice change, 128k devices minutes.
    Parsing is replaced by a stub here so that only the check is timed."""
    def cheap(raw: Any, node: str, pool: str) -> PublishedDevice:
        name = str(raw["name"])
        return PublishedDevice.make(node, pool, name, f"GPU-{name}", "gpu", {}, {})

    monkeypatch.setattr(slices_module, "_device", cheap)
    count = MAX_SLICES_PER_POOL
    pool = [node_slice("evil", [{"name": f"gpu-{part}-{i}"} for i in range(128)], count=count, name=f"evil-{part}")
            for part in range(count)]
    started = time.perf_counter()
    devices, problems = published_devices(pool)
    elapsed = time.perf_counter() - started
    assert len(devices) == 128 * count
    assert problems == []
    assert elapsed < 2.5, f"{elapsed:.1f} s to check one pool of {128 * count} devices"


def test_a_pool_of_more_slices_than_the_agent_writes_is_left_out_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server bounds a slice (128 devices), not a pool: a node's agent can write thousands of slices
    for its own pool. None of their devices is parsed; the pool is one problem."""
    parsed: list[str] = []
    real = slices_module._device

    def counting(raw: Any, node: str, pool: str) -> PublishedDevice:
        parsed.append(node)
        return real(raw, node, pool)

    monkeypatch.setattr(slices_module, "_device", counting)
    count = MAX_SLICES_PER_POOL + 1
    evil = [node_slice("evil", [gpu_device(part, node="evil")], count=count, name=f"evil-{part}")
            for part in range(count)]
    devices, problems = published_devices([*evil, node_slice("good", [gpu_device(0, node="good")])])
    assert [(d.node, d.name) for d in devices] == [("good", "gpu-0")]
    assert parsed == ["good"]
    assert problems == [f"pool evil (generation 1) has {count} slice(s) for resourceSliceCount {count}; "
                        f"kubecell's agent writes at most {MAX_SLICES_PER_POOL}: left out"]


def test_a_pool_within_the_limit_is_read() -> None:
    count = 3
    pool = [node_slice("big", [gpu_device(part, node="big")], count=count, name=f"big-{part}") for part in range(count)]
    devices, problems = published_devices(pool)
    assert problems == []
    assert [d.name for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]


@pytest.mark.parametrize("section", ["attributes", "capacity"])
def test_a_name_given_with_and_without_the_driver_domain_is_refused(section: str) -> None:
    """``uuid`` and ``gpu.kubecell.io/uuid`` are one name to a selector: kubecell confirmed the bare one
    against the node's inventory while a selector saw whichever sorted last (another GPU's UUID, say)."""
    device = gpu_device(0, uuid="GPU-mine")
    if section == "attributes":
        device["attributes"][f"{DRIVER}/uuid"] = {"string": "GPU-someone-elses"}
        bare = "uuid"
    else:
        device["capacity"][f"{DRIVER}/memory"] = {"value": "80Gi"}
        bare = "memory"
    devices, problems = published_devices([node_slice("node-a", [device])])
    assert devices == []
    kind = "attribute" if section == "attributes" else "capacity"
    assert problems == [f"ResourceSlice node-a-{DRIVER}-1: device gpu-0: {kind} {bare!r} is named both with and "
                        f"without the domain {DRIVER}; a selector sees one of them: left out"]


def test_names_of_other_domains_are_still_read() -> None:
    device = gpu_device(0)
    device["attributes"]["example.com/uuid"] = {"string": "other"}
    device["attributes"][f"{DRIVER}/extra"] = {"int": 1}
    (published,), problems = published_devices([node_slice("node-a", [device])])
    assert problems == []
    assert published.uuid == "GPU-node-a-0"
    assert published.attribute(f"{DRIVER}/extra") == 1


# -- the CEL caches -----------------------------------------------------------------------------------------


def _list_selector(i: int, elements: int) -> str:
    """A selector the API server accepts whose syntax tree is as large as its text allows (a list literal)."""
    return f"[{i}" + ",1" * elements + "].size() > 0"


def test_the_compile_cache_is_bounded_by_tree_size_not_only_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10 KiB list-literal selector parses into ~10,000 nodes, ~10 MiB kept; 1,024 of them (distinct claims
    of one user) were kept whole: ~10 GiB in the scheduler. Here the node budget is made small so that a few
    small selectors overflow it; what stays kept must stay within it."""
    monkeypatch.setattr(cel, "COMPILE_CACHE_NODES", 3_000, raising=False)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(10):
            compile_selector(_list_selector(i, 400))  # ~800 nodes, ~0.7 MiB each
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 4 * 2**20, f"{kept / 2**20:.1f} MiB kept by 10 compiled selectors with room for 3,000 nodes"
    # still a cache: what fits is served again, not compiled again
    small = 'device.driver == "gpu.kubecell.io"'
    assert compile_selector(small) is compile_selector(small)


def test_refusals_are_still_kept() -> None:
    wrong = "device.nothing == 1"
    with pytest.raises(SelectorError) as first:
        compile_selector(wrong)
    with pytest.raises(SelectorError) as second:
        compile_selector(wrong)
    assert first.value is second.value


def test_the_result_cache_does_not_keep_the_expressions_text() -> None:
    """Results are kept per (expression, device), 65,536 of them: keyed by the text itself, a small cluster
    let them hold as many distinct 10 KiB selectors (640 MiB) after their claims were gone."""
    device = CelDevice.of(DRIVER, {"uuid": "GPU-0"})
    padding = "x" * 9_000
    for i in range(20):
        compile_selector(f'device.driver != "{padding}{i}"').matches(device)
    assert len(cel._RESULTS) == 20
    longest = max(len(part) for key in cel._RESULTS for part in key if isinstance(part, (str, bytes)))
    assert longest <= 64, f"a result's key holds {longest} characters"


def test_a_result_is_never_served_to_a_device_whose_value_has_another_type() -> None:
    """``True == 1`` in Python (and they hash alike), not in CEL: a device republished with ``flag: 1`` got the
    answer kept for ``flag: true``, where the allocator fails the selector."""
    selector = compile_selector(f'device.attributes["{DRIVER}"].flag == true')
    assert selector.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "flag": True}))
    with pytest.raises(SelectorError, match="no matching overload"):
        selector.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "flag": 1}))
    listed = compile_selector(f'device.attributes["{DRIVER}"].flags.exists(f, f == true)')
    assert listed.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "flags": (True,)}))
    with pytest.raises(SelectorError, match="no matching overload"):
        listed.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "flags": (1,)}))


def test_equal_devices_share_one_result() -> None:
    selector = compile_selector(f'device.attributes["{DRIVER}"].index == 0')
    assert selector.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "index": 0}))
    assert selector.matches(CelDevice.of(DRIVER, {"uuid": "GPU-0", "index": 0}))
    assert len(cel._RESULTS) == 1


def _versioned(piece: dict[str, Any], uid: str, version: str) -> dict[str, Any]:
    piece["metadata"]["uid"], piece["metadata"]["resourceVersion"] = uid, version
    return piece


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = slices_module._device

    def counted(raw: Any, node: str, pool: str) -> PublishedDevice:
        parsed.append(node)
        return real(raw, node, pool)

    monkeypatch.setattr(slices_module, "_device", counted)
    return parsed


def test_slices_of_nodes_kubecell_does_not_know_are_left_out_before_their_devices_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any holder of the agents' role may write slices for made-up nodes; every slice event read all of their
    devices (about 180 µs each) before the scheduler dropped them for want of an inventory."""
    parsed = _counting(monkeypatch)
    written = [node_slice("known", [gpu_device(i, node="known") for i in range(4)]),
               node_slice("made-up", [gpu_device(i, node="made-up") for i in range(100)])]
    devices, problems = published_devices(written, nodes={"known"})
    assert {d.node for d in devices} == {"known"}
    assert set(parsed) == {"known"}, "not a device of the made-up node parsed"
    assert any("node made-up is not one kubecell knows" in p for p in problems), problems


def test_a_slice_unchanged_since_the_last_read_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = _counting(monkeypatch)
    cache: dict[tuple[str, str], Any] = {}
    a = _versioned(node_slice("a", [gpu_device(i, node="a") for i in range(8)]), "uid-a", "1")
    b = _versioned(node_slice("b", [gpu_device(i, node="b") for i in range(8)]), "uid-b", "1")
    first, _ = published_devices([a, b], cache=cache)
    assert len(parsed) == 16
    again, _ = published_devices([a, b], cache=cache)
    assert again == first
    assert len(parsed) == 16, "nothing changed, nothing parsed"
    b = _versioned(node_slice("b", [gpu_device(i, node="b") for i in range(4)]), "uid-b", "2")
    changed, _ = published_devices([a, b], cache=cache)
    assert parsed[16:] == ["b"] * 4, "only the changed slice is read again"
    assert len(changed) == 12
    assert set(cache) == {("uid-a", "1"), ("uid-b", "2")}, "the cache holds the slices of the last read only"
