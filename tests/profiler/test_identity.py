"""name_family: generated suffixes go, what a person chose stays, and no input breaks it."""

from __future__ import annotations

import pytest

from kubecell.profiler.identity import MAX_FAMILY, family_of, name_family

CASES = [
    # the examples
    ("bert-finetune-20261124-1530", "bert-finetune"),
    ("bert-finetune-7", "bert-finetune"),
    # Kubernetes' generated names
    ("pi-x7k2p", "pi"),  # a Job's pod
    ("web-5d4f8b7c9d-x7k2p", "web"),  # a Deployment's pod: template hash, random suffix
    ("web-5d4f8b7c9d", "web"),  # its ReplicaSet
    ("backup-28912345", "backup"),  # a CronJob's Job (scheduled minute)
    ("backup-28912345-q9zvn", "backup"),
    ("db-0", "db"),  # a StatefulSet's pod
    ("train-worker-3", "train"),
    ("train-master-0", "train"),
    ("resnet-ps-12", "resnet"),
    ("mpi-bench-launcher-bz4xw", "mpi-bench"),
    # timestamps, counters, ids
    ("sweep-20261124t153000z", "sweep"),
    ("sweep-2026-11-24", "sweep"),
    ("nightly-1764000000", "nightly"),
    ("bert-run12", "bert"),
    ("bert-run-12", "bert"),
    ("bert-attempt3-worker-1", "bert"),
    ("job-3f2a9c1e-8b7d-4e6f-a1b2-c3d4e5f60718", "job"),
    ("job-3f2a9c1e8b7d4e6fa1b2c3d4e5f60718", "job"),
    ("build-9fceb02", "build"),  # a short commit
    ("llm_eval_0042", "llm_eval"),
    ("llm.eval.3", "llm.eval"),
    # what must stay
    ("bert-finetune", "bert-finetune"),
    ("bert-worker", "bert-worker"),  # a role word without an index is part of the name
    ("llama-3-70b", "llama-3-70b"),
    ("gpt2-medium", "gpt2-medium"),
    ("resnet50", "resnet50"),
    ("inference-server", "inference-server"),
    ("cafe-facade", "cafe-facade"),  # hex letters without a digit are words
    ("bert-v2", "bert-v2"),
    ("a100-probe", "a100-probe"),
    # case, separators, adversarial input
    ("BERT-Finetune-7", "bert-finetune"),
    ("  bert-7  ", "bert"),
    ("bert--7", "bert"),
    ("bert-7-", "bert"),
    ("-bert-7", "bert"),
    ("", ""),
    ("-", ""),
    ("---", ""),
    ("7", "7"),
    ("12345678", "12345678"),  # all digits: the first part is never dropped
    ("2026-11-24", "2026"),
    ("x7k2p", "x7k2p"),
    ("x7k2p-x7k2p", "x7k2p"),
    ("é-7", "é"),
    ("日本語-ジョブ-3", "日本語-ジョブ"),
]


@pytest.mark.parametrize(("name", "family"), CASES)
def test_name_family(name: str, family: str) -> None:
    assert name_family(name) == family


def test_family_of_a_family_is_itself() -> None:
    for name, _ in CASES:
        family = name_family(name)
        assert name_family(family) == family


def test_longest_kubernetes_name() -> None:
    name = "a" * 60 + "-" + "b" * 186 + "-x7k2p"
    assert len(name) == 253
    assert name_family(name) == "a" * 60 + "-" + "b" * 186


def test_long_inputs_are_bounded() -> None:
    assert name_family("a" * 10_000) == "a" * MAX_FAMILY
    assert name_family("-".join(["7"] * 5_000)) == "7"
    assert len(name_family("a-" * 5_000 + "b")) <= MAX_FAMILY
    assert not name_family(("a" * 252) + "-b").endswith("-")


def test_cut_never_ends_in_a_separator() -> None:
    assert name_family("a" * 252 + "-bcd") == "a" * 252


def test_a_pod_with_only_a_generated_name_prefix_is_of_that_familys() -> None:
    """An admission webhook sees a pod created with ``generateName`` before it has a name; the profiler later
    files the same pod by its name, so both must give one family."""
    prefix = {"metadata": {"generateName": "train-", "namespace": "team-a"}}
    named = {"metadata": {"name": "train-x7k2p", "generateName": "train-", "namespace": "team-a"}}
    assert family_of(prefix) == family_of(named) == ("team-a", "train")


def test_a_gangs_pods_are_looked_up_under_the_family_the_profiler_files_the_gang_by() -> None:
    """Pods without an owner that declare a gang are one job named after the gang: the scheduler and the webhook
    must look its history up under that family, not under each pod's own name ('llama-ft-launcher')."""
    from kubecell.profiler.jobs import group_pods

    pods = [{"metadata": {"name": name, "namespace": "team-a", "uid": f"u-{name}",
                          "annotations": {"kubecell.io/group": "llama-ft", "kubecell.io/group-size": "2"}},
             "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Pending"}} for name in ("llama-ft-launcher", "llama-ft-worker-0")]
    (job,) = group_pods(pods)
    assert {family_of(pod) for pod in pods} == {("team-a", name_family(job.owner_name))} == {("team-a", "llama-ft")}
