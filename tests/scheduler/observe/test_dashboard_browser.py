"""The dashboard in a real browser (Debian's headless chromium through Selenium) against a kubecell scheduler
on the testbed: the map shows exactly the GPUs the API server's allocation records hold, a pod placed while
the page is open appears without a reload, and the screenshots show a drawn map."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubecell.cli.serving import Served, serve
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import parse_record
from kubecell.kube.rest import Kube
from kubecell.scheduler.observe.inspect import build_report
from kubecell.scheduler.observe.snapshot import GpuCell, NodeCell, PendingJob, Snapshot, VcState
from kubecell.scheduler.observe.web import browser
from kubecell.scheduler.observe.web.app import build_app
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_scheduler import bound, make_pod
from tests.support import wait_for

pytestmark = pytest.mark.skipif(browser.missing() is not None,
                                reason=f"no headless browser for the dashboard test: {browser.missing()}")

Cell = tuple[str, int, int]
"""(node, GPU index, milli allocated)."""


def recorded_cells(kube: Kube) -> set[Cell]:
    """Per GPU, the milli the allocation records of all bound pods in the cluster add up to."""
    milli: dict[tuple[str, int], int] = defaultdict(int)
    for pod in kube.get("/api/v1/pods")["items"]:
        meta = pod["metadata"]
        text = (meta.get("annotations") or {}).get(ANNOTATION_ALLOCATION)
        if not text or not pod["spec"].get("nodeName") or meta.get("deletionTimestamp"):
            continue
        record = parse_record(text, pod=f"{meta['namespace']}/{meta['name']}", uid=meta["uid"])
        for grant in record.gpus:
            milli[record.node, grant.index] += grant.milli
    return {(node, index, m) for (node, index), m in milli.items() if m}


def snapshot_from_api(kube: Kube, cycle: int) -> Snapshot:
    """A Snapshot built from the API objects (through the inspector's report), for a scheduler that does not
    publish its own yet."""
    report = build_report(kube.get("/api/v1/nodes")["items"], kube.get("/api/v1/pods")["items"])
    vc_of = {row.pod: row.vc for row in report.pods}
    gpus = tuple(GpuCell(node.name, g.index, g.model, g.healthy, g.milli_allocated, g.memory_allocated_mib,
                         g.memory_total_mib, tuple(dict.fromkeys(vc_of.get(p, "?") for p in g.pods)), tuple(g.pods))
                 for node in report.nodes for g in node.gpus)
    vcs = tuple(VcState(v.name, v.guaranteed_gpus, v.in_use_milli.get("guaranteed", 0) / 1000,
                        v.in_use_milli.get("borrowed", 0) / 1000, v.in_use_milli.get("opportunistic", 0) / 1000,
                        0, v.pods) for v in report.vcs)
    pending = tuple(PendingJob(p.pod, "", (p.pod,), 0.0, 0.0, p.reason, "") for p in report.pending)
    return Snapshot(time.time(), cycle, True, False, tuple(NodeCell(n.name, n.excluded) for n in report.nodes),
                    gpus, vcs, pending)


class ApiPublisher:
    """Publishes ``snapshot_from_api`` on the scheduler every half second (stand-in for its own publishing)."""

    def __init__(self, kube: Kube, target: Any) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(kube, target), daemon=True)
        self.thread.start()

    def _run(self, kube: Kube, target: Any) -> None:
        cycle = 0
        while not self.stop.wait(0.5 if cycle else 0):
            cycle += 1
            target.snapshot = snapshot_from_api(kube, cycle)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def dashboard(testbed: ControlPlaneState, kube: Kube, start_scheduler: type[RunningScheduler]) -> Iterator[Served]:
    running = start_scheduler(testbed)
    scheduler: Any = running.scheduler
    publisher = None
    if not isinstance(getattr(scheduler, "snapshot", None), Snapshot):
        try:
            wait_for("the scheduler's first snapshot", lambda: isinstance(getattr(scheduler, "snapshot", None),
                                                                         Snapshot), timeout=3)
        except AssertionError:
            publisher = ApiPublisher(kube, scheduler)
    served = serve(build_app(running.scheduler, None), "127.0.0.1", 0)
    try:
        yield served
    finally:
        served.stop()
        if publisher is not None:
            publisher.close()


def map_cells(driver: Any) -> set[Cell] | None:
    """What the map trace holds: (node, GPU, milli) of every cell with a share taken; None while the page has
    not drawn the map yet (a probe polled from the page's first moment must not fail on a plot not there)."""
    data = driver.execute_script(
        "const m = document.getElementById('map'); const t = m && m.data && m.data[0];"
        " return t ? {x: t.x, y: t.y, c: t.customdata} : null;")
    if data is None:
        return None
    return {(node, int(data["x"][col]), int(milli)) for node, row in zip(data["y"], data["c"], strict=True)
            for col, milli in enumerate(row) if milli}


def check_screenshot(driver: Any, path: Path) -> None:
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    page = browser.distinct_colours(path)
    size = driver.execute_script("return document.getElementById('map')._fullLayout._size")
    left, top, _, _ = browser.element_box(driver, "map")
    ratio = driver.execute_script("return devicePixelRatio")
    cells = (left + int(size["l"] * ratio), top + int(size["t"] * ratio),
             left + int((size["l"] + size["w"]) * ratio), top + int((size["t"] + size["h"]) * ratio))
    inside = browser.distinct_colours(path, cells)
    assert page > 50, f"{path.name}: only {page} colours on the whole page"
    assert inside >= 4, f"{path.name}: the map's cells hold {inside} colours (free, gaps, and VC fill levels expected)"


def test_the_map_shows_the_recorded_gpus_and_follows_new_pods(
        testbed: ControlPlaneState, kube: Kube, namespace: str, dashboard: Served, tmp_path: Path) -> None:
    asks = {"half-0": {"kubecell.io/gpu-milli": "500"}, "half-1": {"kubecell.io/gpu-milli": "500"},
            "quarter": {"kubecell.io/gpu-milli": "250"}, "whole": {"nvidia.com/gpu": "1"},
            "pair": {"nvidia.com/gpu": "2"}}
    for name, limits in asks.items():
        make_pod(kube, namespace, name, limits)
    wait_for("the pods to be bound", lambda: bound(kube, namespace, *asks))
    expected = recorded_cells(kube)
    assert sum(m for *_, m in expected) >= 4250
    with browser.chromium() as driver:
        driver.get(f"{dashboard.url}/?rows=1000")
        browser.wait_until(driver, "the map to show the recorded GPUs", lambda d: map_cells(d) == expected)
        assert driver.find_element("id", "map").get_attribute("data-allocated-gpus") == str(len(expected))
        assert driver.find_element("id", "banner").get_attribute("hidden") is not None
        check_screenshot(driver, tmp_path / "dashboard-1.png")

        driver.execute_script("window.__same_page = true;")
        make_pod(kube, namespace, "late", {"nvidia.com/gpu": "4"})
        wait_for("the late pod to be bound", lambda: bound(kube, namespace, "late"))
        expected = recorded_cells(kube)
        browser.wait_until(driver, "the late pod on the map", lambda d: map_cells(d) == expected)
        assert driver.execute_script("return window.__same_page === true"), "the page must not have reloaded"
        check_screenshot(driver, tmp_path / "dashboard-2.png")
