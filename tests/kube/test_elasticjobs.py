"""ElasticJob specs read with limits (a table of hostile inputs, then Hypothesis: nothing but the typed error,
whatever the object), and the objects a job stands for: its worker Pods (the torchrun contract, the gang,
the owner) and its rendezvous host and Service."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.kube import elasticjob_objects as objects
from kubecell.kube import elasticjobs as ej
from kubecell.kube.dialects.pod import pod_demand
from kubecell.kube.names import ANNOTATION_GROUP, ANNOTATION_GROUP_MAX, ANNOTATION_GROUP_MIN, ANNOTATION_GROUP_SIZE


def template(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "train"}, "annotations": {"note": "kept"}},
            "spec": {"containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1",
                                     "command": ["torchrun", "train.py"],
                                     "env": [{"name": "LR", "value": "0.1"}, {"name": "PET_NNODES", "value": "9"}],
                                     "resources": {"limits": {"nvidia.com/gpu": "4"}}}], **spec}}


def job(name: str = "bert", **spec: Any) -> dict[str, Any]:
    body = {"minReplicas": 1, "maxReplicas": 4, "replicas": 2, "template": template()}
    body.update(spec)
    return {"apiVersion": "kubecell.io/v1alpha1", "kind": "ElasticJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": "0f6c-uid", "generation": 3},
            "spec": {k: v for k, v in body.items() if v is not None}}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ------------------------------------------------------------------ reading
def test_a_job_is_read_with_its_defaults() -> None:
    spec = ej.read_elastic_job(job())
    assert (spec.key, spec.uid, spec.generation) == ("team-a/bert", "0f6c-uid", 3)
    assert (spec.min_replicas, spec.max_replicas, spec.replicas, spec.replicas_stated) == (1, 4, 2, True)
    assert (spec.max_restarts, spec.rendezvous_port, spec.rendezvous_timeout_seconds) == (3, 29400, 900)
    assert (spec.termination_grace_period_seconds, spec.nproc_per_node, spec.batch_size) == (30, 4, None)
    assert spec.restart_seconds is None, "the scheduler's default"


def test_absent_replicas_mean_min_replicas_until_defaulted() -> None:
    spec = ej.read_elastic_job(job(replicas=None, minReplicas=2))
    assert (spec.replicas, spec.replicas_stated) == (2, False)


def test_stated_fields_win_over_defaults() -> None:
    spec = ej.read_elastic_job(job(maxRestarts=0, rendezvousPort=1234, nprocPerNode=2, rendezvousTimeoutSeconds=60,
                                   terminationGracePeriodSeconds=120, batchSize={"min": 32, "max": 512},
                                   restartSeconds=250, template=template(terminationGracePeriodSeconds=5)))
    assert (spec.max_restarts, spec.rendezvous_port, spec.nproc_per_node, spec.rendezvous_timeout_seconds) == (
        0, 1234, 2, 60)
    assert spec.termination_grace_period_seconds == 120
    assert spec.batch_size == ej.BatchSize(32, 512)
    assert spec.restart_seconds == 250
    from_template = ej.read_elastic_job(job(template=template(terminationGracePeriodSeconds=5)))
    assert from_template.termination_grace_period_seconds == 5


def test_the_spec_is_a_private_copy() -> None:
    obj = job()
    spec = ej.read_elastic_job(obj)
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = "changed"
    assert spec.template["spec"]["containers"][0]["image"] == "pytorch/pytorch:2.5.1"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"x": value}
    return value


HOSTILE = [
    ("min above max", job(minReplicas=5, maxReplicas=2, replicas=None), "spec.minReplicas", "above maxReplicas 2"),
    ("min missing", job(minReplicas=None), "spec.minReplicas", "is missing"),
    ("max missing", job(maxReplicas=None), "spec.maxReplicas", "is missing"),
    ("min zero", job(minReplicas=0), "spec.minReplicas", "outside 1..4096"),
    ("negative min", job(minReplicas=-3), "spec.minReplicas", "outside 1..4096"),
    ("max above 4096", job(maxReplicas=4097), "spec.maxReplicas", "outside 1..4096"),
    ("absurd max", job(maxReplicas=10**5000), "spec.maxReplicas", "digits"),
    ("min as text", job(minReplicas="2"), "spec.minReplicas", "not a whole number"),
    ("min as a float", job(minReplicas=2.0), "spec.minReplicas", "not a whole number"),
    ("min as a bool", job(minReplicas=True), "spec.minReplicas", "not a whole number"),
    ("replicas above max", job(replicas=5), "spec.replicas", "outside minReplicas..maxReplicas"),
    ("replicas below min", job(minReplicas=2, replicas=1), "spec.replicas", "outside minReplicas..maxReplicas"),
    ("negative restarts", job(maxRestarts=-1), "spec.maxRestarts", "outside 0..1000"),
    ("port zero", job(rendezvousPort=0), "spec.rendezvousPort", "outside 1..65535"),
    ("port above 65535", job(rendezvousPort=70000), "spec.rendezvousPort", "outside 1..65535"),
    ("timeout too short", job(rendezvousTimeoutSeconds=1), "spec.rendezvousTimeoutSeconds", "outside 10..86400"),
    ("grace too long", job(terminationGracePeriodSeconds=10**9), "spec.terminationGracePeriodSeconds", "outside"),
    ("restart negative", job(restartSeconds=-1), "spec.restartSeconds", "outside 0..86400"),
    ("restart a day and more", job(restartSeconds=86401), "spec.restartSeconds", "outside 0..86400"),
    ("restart a boolean", job(restartSeconds=True), "spec.restartSeconds", "True"),
    ("batch min above max", job(batchSize={"min": 64, "max": 8}), "spec.batchSize", "min 64 is above max 8"),
    ("batch not a mapping", job(batchSize=[1, 2]), "spec.batchSize", "not a mapping"),
    ("batch without max", job(batchSize={"min": 1}), "spec.batchSize.max", "is missing"),
    ("template missing", job(template=None), "spec.template", "is missing"),
    ("template a list", job(template=[1]), "spec.template", "not a mapping"),
    ("template without spec", job(template={"metadata": {}}), "spec.template.spec", "is missing"),
    ("no containers", job(template={"spec": {"containers": []}}), "spec.template.spec.containers", "[]"),
    ("container not a mapping", job(template={"spec": {"containers": ["x"]}}),
     "spec.template.spec.containers[0]", "not a mapping"),
    ("container without image", job(template={"spec": {"containers": [{"name": "a"}]}}),
     "spec.template.spec.containers[0].image", "None"),
    ("container badly named", job(template={"spec": {"containers": [{"name": "A B", "image": "i"}]}}),
     "spec.template.spec.containers[0].name", "'A B'"),
    ("env not a list", job(template={"spec": {"containers": [{"name": "a", "image": "i", "env": "X=1"}]}}),
     "spec.template.spec.containers[0].env", "X=1"),
    ("restartPolicy Always", job(template=template(restartPolicy="Always")), "spec.template.spec.restartPolicy",
     "could never succeed"),
    ("labels not text", job(template={"metadata": {"labels": {"a": 1}}, "spec": template()["spec"]}),
     "spec.template.metadata.labels", "text"),
    ("template nested too deep", job(template={**template(), "extra": deep(40)}), "spec.template.extra",
     "nests deeper than 32"),
    ("template too big", job(template={**template(), "extra": list(range(100_001))}), "spec.template",
     "more than 100000 values"),
    ("template with a NaN", job(template={**template(), "extra": float("nan")}), "spec.template.extra", "finite"),
    ("name too long", job(name="a" * 59), "metadata.name", "at most 58"),
    ("name not DNS", job(name="Bert_1"), "metadata.name", "DNS-1035"),
    ("name with a newline", job(name="bert\n"), "metadata.name", "DNS-1035"),
    ("no uid", {**job(), "metadata": {"name": "bert", "namespace": "team-a"}}, "metadata.uid", "None"),
    ("spec a string", {**job(), "spec": "x"}, "spec", "'x'"),
    ("no spec", {k: v for k, v in job().items() if k != "spec"}, "spec", "is missing"),
    ("metadata a list", {**job(), "metadata": []}, "metadata", "[]"),
    ("not an object", ["x"], "ElasticJob", "not an object"),
]


@pytest.mark.parametrize(("obj", "field", "says"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_a_hostile_spec_is_refused_naming_the_field(obj: Any, field: str, says: str) -> None:
    with pytest.raises(ej.ElasticJobSpecError) as caught:
        ej.read_elastic_job(obj)
    text = str(caught.value)
    assert field in text, text
    assert says in text, text
    assert len(text) < 2000


def test_the_error_says_what_is_accepted() -> None:
    with pytest.raises(ej.ElasticJobSpecError) as caught:
        ej.read_elastic_job(job(minReplicas=5, maxReplicas=2, replicas=None))
    assert str(caught.value) == ("ElasticJob team-a/bert: field 'spec.minReplicas': is 5, above maxReplicas 2 "
                                 "(accepted: at most maxReplicas (2))")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4), max_leaves=20)
FIELDS = ["minReplicas", "maxReplicas", "replicas", "template", "maxRestarts", "rendezvousPort",
          "rendezvousTimeoutSeconds", "nprocPerNode", "batchSize", "terminationGracePeriodSeconds", "restartSeconds"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), JSON | st.integers(-5, 5000), max_size=6), st.booleans())
def test_anything_in_a_spec_is_read_or_refused_with_the_typed_error(changes: dict[str, Any], keep: bool) -> None:
    obj = job() if keep else {**job(), "spec": {}}
    obj["spec"].update(changes)
    try:
        spec = ej.read_elastic_job(obj)
    except ej.ElasticJobSpecError as error:
        refused = str(error)
        assert refused.startswith("ElasticJob")
        return
    for index in range(spec.replicas):  # whatever was read builds valid JSON objects
        json.dumps(objects.worker_pod(spec, index))
    json.dumps(objects.rendezvous_pod(spec))
    json.dumps(objects.rendezvous_service(spec))


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_object_is_read_or_refused_with_the_typed_error(obj: Any) -> None:
    with contextlib.suppress(ej.ElasticJobSpecError):
        ej.read_elastic_job(obj)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_template_is_read_or_refused_with_the_typed_error(value: Any) -> None:
    for obj in (job(template=value), job(template={"spec": {"containers": [value]}}),
                job(template={"spec": {**template()["spec"], "restartPolicy": value}})):
        try:
            spec = ej.read_elastic_job(obj)
        except ej.ElasticJobSpecError:
            continue
        json.dumps(objects.worker_pod(spec, 0))


# ------------------------------------------------------------------ building
def test_a_worker_pod_carries_the_torchrun_contract() -> None:
    spec = ej.read_elastic_job(job(batchSize={"min": 32, "max": 256}))
    pod = objects.worker_pod(spec, 1, run=2)
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == ("bert-worker-1", "team-a")
    assert meta["labels"] == {"app": "train", "kubecell.io/elastic-job": "bert", "kubecell.io/elastic-role": "worker",
                              "kubecell.io/worker-index": "1", "kubecell.io/rendezvous-run": "2",
                              "kubecell.io/template-hash": objects.template_hash(spec.template)}
    assert meta["ownerReferences"] == [{"apiVersion": "kubecell.io/v1alpha1", "kind": "ElasticJob", "name": "bert",
                                        "uid": "0f6c-uid", "controller": True, "blockOwnerDeletion": True}]
    assert meta["annotations"] == {"note": "kept", ANNOTATION_GROUP: "bert", ANNOTATION_GROUP_SIZE: "2",
                                   ANNOTATION_GROUP_MIN: "1", ANNOTATION_GROUP_MAX: "4"}
    env = env_of(pod["spec"]["containers"][0])
    assert env == {"LR": "0.1", "PET_NNODES": "1:4", "PET_NPROC_PER_NODE": "4", "PET_RDZV_BACKEND": "c10d",
                   "PET_RDZV_ENDPOINT": "bert-rdzv:29400", "PET_RDZV_ID": "0f6c-uid-2",
                   "PET_RDZV_CONF": "is_host=false", "PET_MAX_RESTARTS": "3",
                   "PET_LOCAL_ADDR": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                   "KUBECELL_ELASTIC_JOB": "bert", "KUBECELL_WORKER_INDEX": "1",
                   "KUBECELL_POD_NAME": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
                   "KUBECELL_POD_NAMESPACE": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
                   "KUBECELL_BATCH_SIZE_MIN": "32", "KUBECELL_BATCH_SIZE_MAX": "256"}
    assert [e["name"] for e in pod["spec"]["containers"][0]["env"]].count("PET_NNODES") == 1  # ours replaces theirs
    assert pod["spec"]["schedulerName"] == "kubecell"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    assert pod["spec"]["containers"][0]["command"] == ["torchrun", "train.py"]


def test_a_worker_names_the_template_it_was_made_from() -> None:
    """The digest is a valid label value that follows the template's content, never its key order, so the
    controller replaces workers when, and only when, the template changed."""
    spec = ej.read_elastic_job(job())
    digest = objects.worker_pod(spec, 0)["metadata"]["labels"]["kubecell.io/template-hash"]
    assert len(digest) == 16
    assert all(c in "0123456789abcdef" for c in digest)
    assert objects.worker_pod(spec, 3, run=5)["metadata"]["labels"]["kubecell.io/template-hash"] == digest
    reordered = dict(reversed(list(template().items())))
    assert objects.template_hash(reordered) == digest
    assert objects.template_hash(ej.read_elastic_job(job(replicas=3, maxReplicas=8)).template) == digest
    changed = template()
    changed["spec"]["containers"][0]["image"] = "pytorch/pytorch:2.9.1"
    assert objects.template_hash(changed) != digest


def test_each_restart_is_a_new_rendezvous_run() -> None:
    spec = ej.read_elastic_job(job())
    ids = {env_of(objects.worker_pod(spec, 0, run)["spec"]["containers"][0])["PET_RDZV_ID"] for run in (0, 1, 2)}
    assert ids == {"0f6c-uid-0", "0f6c-uid-1", "0f6c-uid-2"}
    with pytest.raises(ValueError, match="run -1"):
        objects.worker_pod(spec, 0, -1)


def test_the_template_decides_its_scheduler_and_restart_policy() -> None:
    spec = ej.read_elastic_job(job(template=template(schedulerName="default-scheduler", restartPolicy="OnFailure")))
    pod = objects.worker_pod(spec, 0)
    assert (pod["spec"]["schedulerName"], pod["spec"]["restartPolicy"]) == ("default-scheduler", "OnFailure")


def test_building_never_changes_the_spec() -> None:
    spec = ej.read_elastic_job(job())
    before = copy.deepcopy(dict(spec.template))
    objects.worker_pod(spec, 0)["spec"]["containers"][0]["env"].append({"name": "X"})
    objects.rendezvous_pod(spec)
    assert spec.template == before


def test_the_workers_are_one_threshold_gang_for_kubecells_scheduler() -> None:
    """The scheduler's own reader sees every worker in gang team-a/bert with headcount replicas and minimum
    minReplicas (the dialect of kubecell.kube.dialects.kubecell)."""
    spec = ej.read_elastic_job(job(minReplicas=2, replicas=3))
    for index in range(3):
        pod = objects.worker_pod(spec, index)
        pod["metadata"]["uid"] = f"uid-{index}"
        demand = pod_demand(pod)
        assert demand.group is not None
        assert (demand.group.key, demand.group.size, demand.group.minimum) == ("team-a/bert", 3, 2)
        assert demand.request.gpu_count == 4


def test_the_rendezvous_lives_apart_from_every_worker() -> None:
    spec = ej.read_elastic_job(job(rendezvousPort=29500,
                                   template=template(tolerations=[{"key": "gpu", "operator": "Exists"}],
                                                     nodeSelector={"pool": "train"})))
    service, host = objects.rendezvous_service(spec), objects.rendezvous_pod(spec)
    assert service["metadata"]["name"] == host["metadata"]["name"] == "bert-rdzv"
    assert service["spec"]["selector"] == host["metadata"]["labels"] == {"kubecell.io/elastic-job": "bert",
                                                                         "kubecell.io/elastic-role": "rendezvous"}
    assert service["spec"]["ports"] == [{"name": "c10d", "port": 29500, "targetPort": 29500, "protocol": "TCP"}]
    assert "kubecell.io/worker-index" not in service["spec"]["selector"]  # no worker, index 0 included, hosts it
    container = host["spec"]["containers"][0]
    assert container["image"] == "pytorch/pytorch:2.5.1"
    assert "TCPStore" in container["command"][-1]
    assert "is_master=True" in container["command"][-1]
    assert "nvidia.com/gpu" not in json.dumps(host)  # no GPU, no gang
    assert ANNOTATION_GROUP not in host["metadata"].get("annotations", {})
    assert host["spec"]["restartPolicy"] == "Always"
    assert host["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert host["spec"]["nodeSelector"] == {"pool": "train"}
    assert service["metadata"]["ownerReferences"][0]["uid"] == host["metadata"]["ownerReferences"][0]["uid"]


def test_the_rendezvous_host_may_have_an_image_of_its_own() -> None:
    spec = ej.read_elastic_job(job(rendezvousImage="registry.example/torch-slim:2.9"))
    host = objects.rendezvous_pod(spec)
    assert host["spec"]["containers"][0]["image"] == "registry.example/torch-slim:2.9"
    workers = objects.worker_pod(spec, 0, 0)
    assert workers["spec"]["containers"][0]["image"] == "pytorch/pytorch:2.5.1", "the workers keep theirs"
    for bad, says in ((7, "spec.rendezvousImage"), ("", "spec.rendezvousImage"), ("x" * 4097, "spec.rendezvousImage")):
        with pytest.raises(ej.ElasticJobSpecError, match=says):
            ej.read_elastic_job(job(rendezvousImage=bad))


def test_the_rendezvous_program_serves_a_store_until_sigterm() -> None:
    compile(objects.RENDEZVOUS_SCRIPT, "<rendezvous>", "exec")
    assert 'os.environ["KUBECELL_RDZV_PORT"]' in objects.RENDEZVOUS_SCRIPT


def test_nproc_per_node_defaults_to_the_whole_gpus_asked() -> None:
    def nproc(resources: dict[str, Any]) -> int:
        body = {"spec": {"containers": [{"name": "t", "image": "i", "resources": resources}]}}
        return ej.read_elastic_job(job(template=body)).nproc_per_node

    assert nproc({"limits": {"kubecell.io/gpu": 8}}) == 8
    assert nproc({"requests": {"nvidia.com/gpu": "2"}}) == 2
    assert nproc({"limits": {"kubecell.io/gpu-milli": "500"}}) == 1
    assert nproc({"limits": {"nvidia.com/gpu": "2.5"}}) == 1
    assert nproc({"limits": {"nvidia.com/gpu": "\u00b2"}}) == 1  # a digit to str.isdigit, not to int(): it raised
    assert nproc({}) == 1


def test_the_selector_is_the_workers() -> None:
    assert ej.worker_selector("bert") == "kubecell.io/elastic-job=bert,kubecell.io/elastic-role=worker"


@pytest.mark.parametrize(("status", "model"), [
    ({"gpuModel": "A100"}, "A100"),
    ({"gpuModel": "rtx2080ti"}, "rtx2080ti"),
    ({"gpuModel": "V100M32", "phase": "Running"}, "V100M32"),
    ({}, None),
    ({"gpuModel": ""}, None),
    ({"gpuModel": 7}, None),
    ({"gpuModel": ["A100"]}, None),
    ({"gpuModel": "A" * 64}, None),
    ({"gpuModel": "A100,V100"}, None),
    ({"gpuModel": "-A100"}, None),
    ("Running", None),
])
def test_the_kept_gpu_model_is_read_defensively(status: Any, model: str | None) -> None:
    assert ej.kept_gpu_model({"status": status}) == model
    assert ej.kept_gpu_model({}) is None


@pytest.mark.parametrize(("name", "uid"), [
    ("../../b/elasticjobs/victim", "U-victim"),   # urllib3 resolves '..': the request would reach namespace b
    ("victim/scale", "U-victim"),
    ("Victim", "U-victim"),
    ("v" * (ej.MAX_NAME_CHARS + 1), "U-victim"),
    ("victim", "../x"),
    ("victim", "u" * 129),
])
def test_an_owner_reference_no_elasticjob_could_have_makes_the_pod_owned_by_none(name: str, uid: str) -> None:
    """The API server checks only that an owner reference's name and uid are not empty."""
    owner = {"apiVersion": ej.API_VERSION, "kind": ej.KIND, "name": name, "uid": uid, "controller": True}
    assert ej.elastic_owner({"metadata": {"namespace": "a", "ownerReferences": [owner]}}) is None
    good = "0d9f3c1e-1b2a-4c5d-8e7f-112233445566"
    fine = {**owner, "name": "victim", "uid": good}
    assert ej.elastic_owner({"metadata": {"namespace": "a", "ownerReferences": [fine]}}) == \
        ej.ElasticRef("a", "victim", good)
