"""The dashboard without a browser: the columnar payload built from hand-made snapshots, its size at 5,000
nodes, the app's answers before the first snapshot and during a rebuild, and the event stream."""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any, cast

import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from kubecell.cli.serving import serve
from kubecell.scheduler.observe.snapshot import Decision, GpuCell, NodeCell, PendingJob, Snapshot, VcState
from kubecell.scheduler.observe.web import dashboard
from kubecell.scheduler.observe.web.app import build_app
from kubecell.scheduler.observe.web.payload import SCHEMA, build_payload, build_summary, encode
from kubecell.scheduler.observe.web.synthetic import synthetic_snapshot
from kubecell.scheduler.scheduler import Scheduler

A100, V100 = ("A100", 81920), ("V100", 32768)


def gpu(node: str, index: int, milli: int = 0, owners: tuple[str, ...] = (), pods: tuple[str, ...] = (),
        model: tuple[str, int] = A100, healthy: bool = True) -> GpuCell:
    return GpuCell(node, index, model[0], healthy, milli, 0, model[1], owners, pods)


def small(*, rebuilding: bool = False, cycle: int = 7) -> Snapshot:
    """Two nodes: n1 with a GPU shared by two VCs, a whole GPU and an unhealthy free one; n2 cordoned, V100s."""
    gpus = (gpu("n1", 1, 1000, ("team-b",), ("b/train-0",)),  # out of order on purpose
            gpu("n1", 0, 750, ("team-a", "team-b"), ("a/infer-0", "b/infer-1")),
            gpu("n1", 2, healthy=False),
            gpu("n2", 0, model=V100), gpu("n2", 1, 250, ("team-a",), ("a/infer-0",), model=V100))
    return Snapshot(
        taken_at=100.0, cycle=cycle, leading=True, rebuilding=rebuilding,
        nodes=(NodeCell("n1", "", rack="r1"), NodeCell("n2", "cordoned", rack="r1")), gpus=gpus,
        vcs=(VcState("team-a", 2, 0.75, 0, 0, 1, 1), VcState("team-b", 1, 1, 0.25, 0, 0, 2)),
        pending=(PendingJob("a/big", "team-a", ("a/big-0",), 8.0, 12.5, "0/2 nodes fit", "capacity"),),
        decisions=(Decision(99.0, "b/train", "team-b", "placed", ("n1",), ("n1/1",), 0.5),),
        fragmentation=0.25, unallocated_gpus=3.0, running_jobs=3)


def test_the_payload_is_columnar_with_name_tables() -> None:
    p = build_payload(small())
    assert p["schema"] == SCHEMA
    assert p["nodes"] == {"name": ["n1", "n2"], "rack": [0, 0], "gpuStart": [0, 3, 5]}
    assert p["racks"] == ["r1"]
    gpus = p["gpus"]
    assert gpus["index"] == [0, 1, 2, 0, 1], "GPUs grouped by node, by index within it"
    assert gpus["milli"] == [750, 1000, 0, 0, 250]
    assert p["vcNames"] == ["team-a", "team-b"]
    assert gpus["owner"] == [0, 1, -1, -1, 0]
    assert p["coOwners"] == {"0": [1]}, "the second VC on the shared GPU"
    assert [p["kinds"]["model"][k] for k in gpus["kind"]] == ["A100", "A100", "A100", "V100", "V100"]
    assert p["kinds"]["memoryMib"] == [81920, 32768]
    pods = [[p["podNames"][i] for i in gpus["pods"][a:b]] for a, b in zip(gpus["podStart"], gpus["podStart"][1:],
                                                                           strict=False)]
    assert pods == [["a/infer-0", "b/infer-1"], ["b/train-0"], [], [], ["a/infer-0"]]
    assert p["podNames"].count("a/infer-0") == 1, "a pod's name is sent once, however many GPUs it holds"
    assert p["unhealthy"] == [2]
    assert p["excluded"] == {"1": "cordoned"}
    assert p["summary"] == {"totalGpus": 5, "allocatedGpus": 2.0, "allocatedCells": 3, "unallocatedGpus": 3.0,
                            "fragmentation": 0.25, "runningJobs": 3, "pendingJobs": 1, "unhealthyGpus": 1,
                            "excludedNodes": 1}
    assert p["vcs"]["allocated"] == [0.75, 1.25]
    assert p["pending"]["reason"] == ["0/2 nodes fit"]
    assert p["decisions"]["score"] == [0.5]
    assert b"\n" not in encode(p), "an SSE data line must hold the payload whole"


def test_a_gpu_of_an_unlisted_node_still_shows() -> None:
    snapshot = Snapshot(1.0, 1, True, False, nodes=(), gpus=(gpu("ghost", 0, 500, ("a",), ("x/y",)),))
    p = build_payload(snapshot)
    assert p["nodes"]["name"] == ["ghost"]
    assert p["gpus"]["milli"] == [500]


def test_5000_nodes_stay_small_and_quick() -> None:
    snapshot = synthetic_snapshot(5000, 8)
    started = time.perf_counter()
    body = encode(build_payload(snapshot))
    elapsed = time.perf_counter() - started
    p = json.loads(body)
    assert all(len(p["gpus"][key]) == 40_000 for key in ("index", "kind", "milli", "memoryMib", "owner"))
    assert all(isinstance(v, int) for v in p["gpus"]["owner"][:100]), "owners are indices, not names"
    assert len(p["vcNames"]) == 5
    assert len(p["kinds"]["model"]) <= 3
    assert len(body) < 3_000_000, f"{len(body):,} bytes raw"
    assert len(gzip.compress(body, 6)) < 600_000
    assert elapsed < 5.0, f"{elapsed:.2f} s to build and encode (about 0.1 s on a laptop core)"


class FakeScheduler(SimpleNamespace):
    """What the web app reads of a scheduler: ``ready`` and the published ``snapshot``."""


def fake(snapshot: Snapshot | None = None) -> Any:
    return FakeScheduler(ready=threading.Event(), snapshot=snapshot, cycles=0, engine=None,
                         actions=SimpleNamespace(writes=0))


def app_for(scheduler: Any, **kwargs: Any) -> TestClient:
    return TestClient(build_app(cast(Scheduler, scheduler), None, **kwargs))


def test_no_snapshot_yet_is_a_clear_503() -> None:
    client = app_for(fake())
    answer = client.get("/api/snapshot")
    assert answer.status_code == 503
    assert "no snapshot yet" in answer.json()["detail"]
    page = client.get("/")
    assert page.status_code == 503
    assert "No snapshot yet" in page.text
    assert "text/html" in page.headers["content-type"]
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 503


def test_during_a_rebuild_the_last_snapshot_is_served_with_the_flag() -> None:
    scheduler = fake(small(rebuilding=True))
    scheduler.ready.set()
    client = app_for(scheduler)
    answer = client.get("/api/snapshot")
    assert answer.status_code == 200
    assert answer.json()["rebuilding"] is True
    assert answer.headers["x-kubecell-cycle"] == "7"
    assert client.get("/").status_code == 200
    assert client.get("/readyz").status_code == 200


def test_the_page_and_its_assets_are_served_compressed() -> None:
    client = app_for(fake(small()))
    page = client.get("/")
    assert 'id="map"' in page.text
    assert "/vendor/plotly.min.js" in page.text
    script = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert script.status_code == 200
    assert script.headers["content-encoding"] == "gzip"
    assert b"plotly" in script.content[:2000]  # the client decoded it
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.get("/api/snapshot", headers={"Accept-Encoding": "gzip"}).headers["content-encoding"] == "gzip"


def test_extra_routes_are_served_beside_the_dashboard() -> None:
    route = Route("/scheduler/filter", lambda request: PlainTextResponse("extender"), methods=["POST"])
    client = app_for(fake(), extra_routes=[route])
    assert client.post("/scheduler/filter").text == "extender"
    assert client.get("/healthz").status_code == 200


def read_event(stream: Any) -> dict[str, Any]:
    """The next ``snapshot`` event's data (comments and other fields skipped)."""
    event = ""
    for raw in stream:
        line = raw.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event == "snapshot":
            return cast(dict[str, Any], json.loads(line[5:]))
    raise AssertionError("the stream ended")


def test_the_stream_pushes_a_newly_published_snapshot() -> None:
    scheduler = fake(small(cycle=1))
    served = serve(build_app(cast(Scheduler, scheduler), None), "127.0.0.1", 0)
    try:
        assert served.port > 0
        with urllib.request.urlopen(f"{served.url}/api/stream", timeout=10) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            first = read_event(stream)
            assert first["cycle"] == 1
            assert "gpus" not in first, "events carry the summary, not the map"
            scheduler.snapshot = small(cycle=2, rebuilding=True)
            second = read_event(stream)
            assert (second["cycle"], second["rebuilding"]) == (2, True)
            assert second["summary"]["allocatedGpus"] == 2.0
    finally:
        started = time.monotonic()
        served.stop()
        assert time.monotonic() - started < 5, "stop must not hang on an open stream"


def test_event_streams_are_capped_and_share_one_summary_per_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, every open stream built the summary for itself, and streams had no cap of their own: hundreds
    of them filled the port's connections and kube-scheduler's calls and the probes were answered 503."""
    monkeypatch.setattr(dashboard, "MAX_STREAMS", 3)
    built: list[Snapshot] = []

    def counted(snapshot: Snapshot) -> dict[str, Any]:
        built.append(snapshot)
        return build_summary(snapshot)

    monkeypatch.setattr(dashboard, "build_summary", counted)
    scheduler = fake(small(cycle=1))
    served = serve(build_app(cast(Scheduler, scheduler), None), "127.0.0.1", 0)
    streams = []
    try:
        for _ in range(3):
            streams.append(urllib.request.urlopen(f"{served.url}/api/stream", timeout=10))
            assert read_event(streams[-1])["cycle"] == 1
        assert len(built) == 1, "one summary for the three streams"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{served.url}/api/stream", timeout=10)
        assert refused.value.code == 503
        assert "too many event streams" in refused.value.read().decode()
        with urllib.request.urlopen(f"{served.url}/healthz", timeout=10) as health:
            assert health.status == 200
        streams.pop().close()  # a page went away: its slot comes back
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                streams.append(urllib.request.urlopen(f"{served.url}/api/stream", timeout=10))
                break
            except urllib.error.HTTPError:
                time.sleep(0.3)
        assert len(streams) == 3
        assert read_event(streams[-1])["cycle"] == 1
    finally:
        for stream in streams:
            stream.close()
        served.stop()


def test_serve_refuses_a_port_in_use() -> None:
    served = serve(build_app(cast(Scheduler, fake()), None), "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="in use"):
            serve(build_app(cast(Scheduler, fake()), None), "127.0.0.1", served.port)
    finally:
        served.stop()
