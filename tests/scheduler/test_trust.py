"""Allocation records as a hostile tenant could write them, on the real testbed, with no admission policy in
the way (the defence that must hold without ``deploy/admission``): a forged record is carried out only when it
is a decision kubecell would make, a record naming another node never double-books a GPU, and one pod nobody
can read never stops the scheduler."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from functools import partial

from kubecell.core.engine.job import JobClass
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.binder import Binder
from kubecell.scheduler.observe.inspect import build_report
from kubecell.scheduler.restore import UNTRUSTED
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.trust_support import (
    alone,
    create_pod,
    forged_record,
    free_whole_gpus,
    held_on,
    node_obj,
    pod,
    warnings_of,
    write_record,
)
from tests.support import wait_for


def record_of(kube: Kube, namespace: str, name: str) -> dict[str, object] | None:
    text = (pod(kube, namespace, name)["metadata"].get("annotations") or {}).get(ANNOTATION_ALLOCATION)
    return json.loads(text) if text else None


def bound_node(kube: Kube, namespace: str, name: str) -> str:
    return str(pod(kube, namespace, name)["spec"].get("nodeName") or "")


def test_a_forged_record_naming_another_vc_is_never_carried_out(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 2: a complete record a tenant wrote on their own pending pod, claiming a guaranteed GPU of a
    VC that is not theirs (and does not exist). The restarted scheduler must decide the pod itself."""
    target = create_pod(kube, namespace, "forged", {"nvidia.com/gpu": "1"})
    node = node_obj(kube, "philly-063")
    write_record(kube, namespace, "forged", forged_record(target, node, (7,), job=alone(target), vc="evil"))
    running = start_scheduler(testbed)
    wait_for("the pod to be placed by kubecell", lambda: bound_node(kube, namespace, "forged"))
    record = record_of(kube, namespace, "forged")
    assert record is not None
    assert (record["scheduler"], record["vc"]) == ("kubecell", "default"), record
    assert any("virtual cluster 'evil'" in m for m in warnings_of(kube, namespace, "forged", UNTRUSTED))
    assert running.scheduler.engine is not None
    assert "evil" not in running.scheduler.engine.usage


def test_a_forged_record_for_a_vc_that_does_not_exist_is_rolled_back(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """The same forgery made consistent with the pod (it names the VC itself): the VC still does not exist,
    so the record is not a decision kubecell could make; the pod waits, told why, and holds nothing."""
    target = create_pod(kube, namespace, "ghost-vc", {"nvidia.com/gpu": "1"}, annotations={"kubecell.io/vc": "evil"})
    node = node_obj(kube, "philly-063")
    write_record(kube, namespace, "ghost-vc", forged_record(target, node, (6,), job=alone(target), vc="evil"))
    running = start_scheduler(testbed)
    wait_for("the record to be removed", lambda: record_of(kube, namespace, "ghost-vc") is None)
    assert not bound_node(kube, namespace, "ghost-vc")
    messages = wait_for("the pod to be told", lambda: warnings_of(kube, namespace, "ghost-vc", UNTRUSTED))
    assert any("does not exist" in m for m in messages)
    assert not [name for name, _, _ in held_on(running.scheduler, "philly-063") if namespace in name]


def test_a_forged_record_past_the_node_selector_is_rolled_back(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    target = create_pod(kube, namespace, "pinned", {"nvidia.com/gpu": "1"},
                        spec={"nodeSelector": {"kubernetes.io/hostname": "philly-062"}})
    write_record(kube, namespace, "pinned",
                 forged_record(target, node_obj(kube, "philly-061"), (0,), job=alone(target)))
    start_scheduler(testbed)
    wait_for("the pod to be bound", lambda: bound_node(kube, namespace, "pinned"))
    assert bound_node(kube, namespace, "pinned") == "philly-062", "a forged record must not bypass nodeSelector"
    assert any("node constraints" in m for m in warnings_of(kube, namespace, "pinned", UNTRUSTED))


def test_a_record_copied_onto_another_pod_is_never_used(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """A record written for one pod (its podUID) pasted onto another pending pod."""
    first = create_pod(kube, namespace, "original", {"nvidia.com/gpu": "1"})
    create_pod(kube, namespace, "copy", {"nvidia.com/gpu": "1"})
    text = forged_record(first, node_obj(kube, "philly-060"), (3,), job=alone(first))
    write_record(kube, namespace, "copy", text)
    start_scheduler(testbed)
    wait_for("the copy to be placed afresh", lambda: bound_node(kube, namespace, "copy"))
    record = record_of(kube, namespace, "copy")
    assert record is not None
    assert record["podUID"] == pod(kube, namespace, "copy")["metadata"]["uid"]
    assert record["scheduler"] == "kubecell"


def test_a_forged_record_asking_more_gpus_than_the_pod_is_rolled_back(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """A 1-GPU pod whose record claims all 8 GPUs of a node (to keep others off it)."""
    target = create_pod(kube, namespace, "greedy", {"nvidia.com/gpu": "1"})
    write_record(kube, namespace, "greedy",
                 forged_record(target, node_obj(kube, "philly-059"), tuple(range(8)), job=alone(target)))
    start_scheduler(testbed)
    wait_for("the pod to be placed", lambda: bound_node(kube, namespace, "greedy"))
    record = record_of(kube, namespace, "greedy")
    assert record is not None
    assert len(record["gpus"]) == 1  # type: ignore[arg-type]
    assert any("asks for 1 whole GPU" in m for m in warnings_of(kube, namespace, "greedy", UNTRUSTED))


def test_two_forged_records_on_one_gpu_never_double_book_it(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    node = node_obj(kube, "philly-058")
    for name in ("twin-a", "twin-b"):
        target = create_pod(kube, namespace, name, {"nvidia.com/gpu": "1"})
        write_record(kube, namespace, name, forged_record(target, node, (5,), job=alone(target)))
    running = start_scheduler(testbed)
    wait_for("both pods to be bound", lambda: all(bound_node(kube, namespace, n) for n in ("twin-a", "twin-b")))
    slots = set()
    for name in ("twin-a", "twin-b"):
        record = record_of(kube, namespace, name)
        assert record is not None
        slots |= {(record["node"], gpu["index"]) for gpu in record["gpus"]}  # type: ignore[attr-defined]
    assert len(slots) == 2, f"one GPU given twice: {slots}"
    assert running.scheduler.engine is not None
    running.scheduler.engine.check_invariants()


def test_a_record_naming_another_node_is_counted_where_the_pod_runs(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 3: a bound pod whose record is edited to name another node. The pod's GPUs are held on the
    node it runs on, and the node its record names stays free: no 16 of 8 GPUs, no full-but-empty node."""
    first = start_scheduler(testbed)
    names = [f"w-{i}" for i in range(8)]
    for name in names:
        create_pod(kube, namespace, name, {"nvidia.com/gpu": "1"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": "philly-057"}})
    wait_for("the node to be filled", lambda: all(bound_node(kube, namespace, n) == "philly-057" for n in names))
    first.close()
    moved = record_of(kube, namespace, "w-0")
    assert moved is not None
    moved["node"] = "philly-056"
    write_record(kube, namespace, "w-0", json.dumps(moved))
    second = start_scheduler(testbed)
    assert free_whole_gpus(second.scheduler, "philly-057") == 0, held_on(second.scheduler, "philly-057")
    assert free_whole_gpus(second.scheduler, "philly-056") == 8, held_on(second.scheduler, "philly-056")
    assert any("runs on philly-057" in m for m in warnings_of(kube, namespace, "w-0", UNTRUSTED))
    create_pod(kube, namespace, "late", {"nvidia.com/gpu": "1"},
               spec={"nodeSelector": {"kubernetes.io/hostname": "philly-057"}})
    wait_for("the late pod to be told the node is full", lambda: warnings_of(kube, namespace, "late"))
    assert not bound_node(kube, namespace, "late")
    assert second.scheduler.engine is not None
    second.scheduler.engine.check_invariants()


def test_an_unreadable_record_is_held_by_the_scheduler_and_by_inspect(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """A bound pod whose record was overwritten with garbage: both the scheduler and ``inspect`` count its GPUs
    (as whole GPUs, the most it could use), never show them free."""
    first = start_scheduler(testbed)
    create_pod(kube, namespace, "scrambled", {"nvidia.com/gpu": "2"},
               spec={"nodeSelector": {"kubernetes.io/hostname": "philly-055"}})
    wait_for("the pod to be bound", lambda: bound_node(kube, namespace, "scrambled"))
    first.close()
    write_record(kube, namespace, "scrambled", "{not json")
    second = start_scheduler(testbed)
    assert free_whole_gpus(second.scheduler, "philly-055") == 6
    report = build_report([node_obj(kube, "philly-055")], [pod(kube, namespace, "scrambled")])
    (node,) = report.nodes
    assert node.milli_allocated == 2000, "inspect must show the GPUs the scheduler holds"
    (row,) = report.pods
    assert "not JSON" in row.error


def test_one_pod_nobody_can_read_never_stops_scheduling(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 1: a group size of 5,000 digits (Python refuses to turn it into an int) used to kill the
    scheduler at every start while the pod existed. The pod is told what is wrong; everyone else is placed."""
    running = start_scheduler(testbed)
    create_pod(kube, namespace, "huge", {"nvidia.com/gpu": "1"},
               annotations={"kubecell.io/group": "g", "kubecell.io/group-size": "9" * 5000})
    create_pod(kube, namespace, "hived-bomb", {},
               annotations={"hivedscheduler.microsoft.com/pod-scheduling-spec":
                            "virtualCluster: vc\nleafCellNumber: " + "1" * 5000})
    create_pod(kube, namespace, "fine", {"nvidia.com/gpu": "1"})
    wait_for("the ordinary pod to be bound", lambda: bound_node(kube, namespace, "fine"))
    for name in ("huge", "hived-bomb"):
        wait_for(f"{name} to be told", partial(warnings_of, kube, namespace, name))
        assert not bound_node(kube, namespace, name)
    assert running.thread.is_alive()
    running.close()
    second = start_scheduler(testbed)  # a restart reads the same pods again
    assert second.thread.is_alive()
    report = build_report(kube.get("/api/v1/nodes")["items"][:2],
                          kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"])
    assert {p.pod for p in report.pending} >= {f"{namespace}/huge", f"{namespace}/hived-bomb"}


def test_a_conflict_is_success_only_for_a_pod_bound_to_that_very_node(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """A 409 on a Binding means "already bound": kubecell counts it as its own bind only after reading the pod
    bound to the node it chose (a lost answer of its own earlier bind), never when another client bound it
    elsewhere."""
    running = start_scheduler(testbed)
    target = create_pod(kube, namespace, "raced", {}, scheduler="nobody")
    kube.create(f"/api/v1/namespaces/{namespace}/pods/raced/binding",
                {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "raced", "namespace": namespace},
                 "target": {"apiVersion": "v1", "kind": "Node", "name": "philly-054"}})
    binder: Binder = running.scheduler.binder
    uid = target["metadata"]["uid"]
    _, _, _, elsewhere = binder._bind_one(("job", uid, target, "philly-053", None))
    assert elsewhere is not None, "bound elsewhere: the decision must be undone"
    assert elsewhere.conflict
    _, _, _, same = binder._bind_one(("job", uid, target, "philly-054", None))
    assert same is None, "bound to this very node: an earlier bind of the same decision"


def test_a_record_kubecell_wrote_passes_every_check(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """The checks must not distrust kubecell's own records: a pod naming its VC explicitly is restored in the
    class it was recorded in, with no Warning."""
    first = start_scheduler(testbed)
    create_pod(kube, namespace, "keeper", {"nvidia.com/gpu": "1"}, annotations={"kubecell.io/vc": "default"})
    wait_for("the pod to be bound", lambda: bound_node(kube, namespace, "keeper"))
    first.close()
    record = record_of(kube, namespace, "keeper")
    assert record is not None
    assert record["class"] == JobClass.GUARANTEED.value
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    (job,) = [j for j in engine.running.values() if j.name.startswith(f"{namespace}/keeper@")]
    assert job.job_class == JobClass.GUARANTEED
    assert not warnings_of(kube, namespace, "keeper", UNTRUSTED)


def test_a_forged_record_on_a_gated_pod_is_never_bound(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    target = create_pod(kube, namespace, "gated-forged", {"nvidia.com/gpu": "1"},
                        spec={"schedulingGates": [{"name": "example.com/quota"}]})
    write_record(kube, namespace, "gated-forged",
                 forged_record(target, node_obj(kube, "philly-052"), (2,), job=alone(target)))
    running = start_scheduler(testbed)
    wait_for("the record to be removed", lambda: record_of(kube, namespace, "gated-forged") is None)
    assert not bound_node(kube, namespace, "gated-forged")
    assert not [n for n, _, _ in held_on(running.scheduler, "philly-052") if namespace in n]


def test_the_scheduler_survives_hostile_pods_arriving_under_load(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Bounded in count and time: 40 pods, half of them hostile in a different way, created from two threads
    while the scheduler runs; every ordinary pod is bound and the loop never stops."""
    running = start_scheduler(testbed)
    hostile = [
        {"kubecell.io/gpu-models": "x" * 5000},
        {"kubecell.io/group": "g", "kubecell.io/group-size": "²"},
        {"kubecell.io/group": "g", "kubecell.io/group-size": "3", "kubecell.io/group-min": "-1"},
        {"kubecell.io/isolation": "\x00"},
        {"hivedscheduler.microsoft.com/pod-scheduling-spec": "a: &a [*a, *a, *a]"},
        {"hivedscheduler.microsoft.com/pod-scheduling-spec": "[" * 2000},
        {"kubecell.io/topology": "rack" * 1000},
        {"sharedgpu/gpu_request": "1e999999999"},
        {ANNOTATION_ALLOCATION: "[]"},
        {"kubecell.io/opportunistic": "maybe"},
    ]
    errors: list[BaseException] = []

    def make(offset: int) -> None:
        try:
            for i in range(offset, 40, 2):
                notes = hostile[i // 2 % len(hostile)] if i % 4 < 2 else {}
                labels = {k: v for k, v in notes.items() if k.startswith("sharedgpu/")}
                annotations = {k: v for k, v in notes.items() if not k.startswith("sharedgpu/")}
                with contextlib.suppress(ApiError):  # the API server itself refuses some label values
                    create_pod(kube, namespace, f"p-{i}", {"kubecell.io/gpu-milli": "100"},
                               annotations=annotations, labels=labels)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=make, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    ordinary = [f"p-{i}" for i in range(40) if i % 4 >= 2]
    wait_for("every ordinary pod to be bound", lambda: all(bound_node(kube, namespace, n) for n in ordinary), 60)
    assert running.thread.is_alive()
    assert running.scheduler.engine is not None
    running.scheduler.engine.check_invariants()


def test_a_gang_member_with_an_edited_record_is_held_where_it_runs(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """One member of a running gang has its record edited to claim half its GPUs: that member is held as found
    (whole GPUs, where it runs), the other restored as recorded, and the node stays full."""
    first = start_scheduler(testbed)
    notes = {"kubecell.io/group": "pair", "kubecell.io/group-size": "2"}
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "philly-045"}}
    for name in ("m-0", "m-1"):
        create_pod(kube, namespace, name, {"nvidia.com/gpu": "4"}, annotations=notes, spec=pinned)
    wait_for("the gang bound", lambda: all(bound_node(kube, namespace, n) for n in ("m-0", "m-1")))
    first.close()
    edited = record_of(kube, namespace, "m-0")
    assert edited is not None
    edited["gpus"] = edited["gpus"][:2]  # type: ignore[index]
    write_record(kube, namespace, "m-0", json.dumps(edited))
    second = start_scheduler(testbed)
    held = held_on(second.scheduler, "philly-045")
    assert free_whole_gpus(second.scheduler, "philly-045") == 0, held
    assert [name for name, _, _ in held if name.startswith(f"external:{namespace}/m-0")], held
    assert any("asks for 4 whole GPU" in m for m in warnings_of(kube, namespace, "m-0", UNTRUSTED))
    time.sleep(2)  # cycles pass: the member held as found is never taken for a free pod and decided again
    assert record_of(kube, namespace, "m-0") == edited
    engine = second.scheduler.engine
    assert engine is not None
    engine.check_invariants()


def test_a_running_pod_whose_owner_edits_its_vc_is_reclaimable_after_a_restart(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """The owner of a running pod edits its ``kubecell.io/vc`` (no admission policy in the way) and the scheduler
    restarts. Its record, which kubecell wrote, no longer names the pod's VC. Before, the pod was then held as
    another scheduler's (never evicted, charged to no VC): one edit made it unreclaimable. It now forfeits its
    standing: restored alone as opportunistic work on the GPUs it holds, and the next pod that needs them takes
    them."""
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "philly-041"}}
    first = start_scheduler(testbed)
    target = create_pod(kube, namespace, "edited", {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the pod bound", lambda: bound_node(kube, namespace, "edited"))
    first.close()
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/edited", {"metadata": {"annotations": {"kubecell.io/vc": "mine"}}})
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    job = engine.jobs.get(alone(target))
    assert job is not None, held_on(second.scheduler, "philly-041")
    assert job.job_class == JobClass.OPPORTUNISTIC
    assert job.vc == "default", "the record's VC, never the one its owner wrote"
    assert free_whole_gpus(second.scheduler, "philly-041") == 0
    assert not [name for name, _, _ in held_on(second.scheduler, "philly-041") if name.startswith("external:")]
    assert any("opportunistic" in m and "'mine'" in m for m in warnings_of(kube, namespace, "edited", UNTRUSTED))
    (row,) = list(build_report([node_obj(kube, "philly-041")], [pod(kube, namespace, "edited")]).pods)
    assert (row.job_class, row.vc, row.gpus) == ("opportunistic", "default", tuple(range(8))), row
    create_pod(kube, namespace, "claimant", {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the claimant placed on the GPUs reclaimed from the edited pod",
             lambda: bound_node(kube, namespace, "claimant") == "philly-041")
    assert "edited" not in {p["metadata"]["name"] for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
                            if not p["metadata"].get("deletionTimestamp")}
    engine.check_invariants()


def test_a_gang_member_moved_to_another_gang_keeps_running_alone_and_the_gang_keeps_its_standing(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """One member of a running pair is moved to another gang by its owner (``kubecell.io/group`` edited) before a
    restart: that member runs on alone as opportunistic work, the other is restored as its gang, as recorded."""
    first = start_scheduler(testbed)
    notes = {"kubecell.io/group": "pair", "kubecell.io/group-size": "2"}
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "philly-042"}}
    made = {name: create_pod(kube, namespace, name, {"nvidia.com/gpu": "4"}, annotations=notes, spec=pinned)
            for name in ("m-0", "m-1")}
    wait_for("the gang bound", lambda: all(bound_node(kube, namespace, n) for n in made))
    recorded_class = JobClass(record_of(kube, namespace, "m-1")["class"])  # type: ignore[index]
    first.close()
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/m-0", {"metadata": {"annotations": {"kubecell.io/group": "solo"}}})
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    moved = engine.jobs.get(alone(made["m-0"]))
    assert moved is not None
    assert moved.job_class == JobClass.OPPORTUNISTIC
    (gang,) = [job for name, job in engine.jobs.items() if name.startswith(f"{namespace}/pair#")]
    assert gang.job_class == recorded_class
    assert len(gang.running_members) == 1
    assert free_whole_gpus(second.scheduler, "philly-042") == 0
    assert not [name for name, _, _ in held_on(second.scheduler, "philly-042") if name.startswith("external:")]
    engine.check_invariants()
