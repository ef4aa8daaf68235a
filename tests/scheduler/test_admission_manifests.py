"""The admission policy as the manifests install it (``deploy/admission``, included by ``deploy/base`` and
``deploy/extender``): rendered with the testbed's kubectl, the policy names the ServiceAccounts the manifests
run as, an overlay of the scheduler and the node agent carries it once, and the rename patch its own comment
documents renames the writers and still compiles on the API server. What the policy does to requests is
``test_admission_policy``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import ADMISSION, DEPLOY, POLICY, kubectl, rendered

AGENT = DEPLOY / "node-agent"
def objects_of(testbed: ControlPlaneState, directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered(testbed, directory)}


def writers(policy: dict[str, Any]) -> dict[str, str]:
    """The policy's variables that list who may write: name -> CEL expression."""
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"] if v["name"].endswith("Writers")}


@pytest.mark.parametrize("directory", ["base", "extender"])
def test_the_documented_install_carries_the_policy_for_its_own_accounts(testbed: ControlPlaneState,
                                                                         directory: str) -> None:
    objects = objects_of(testbed, DEPLOY / directory)
    policy = objects["ValidatingAdmissionPolicy", POLICY]["spec"]
    binding = objects["ValidatingAdmissionPolicyBinding", POLICY]["spec"]
    assert binding == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in policy["matchConstraints"]["resourceRules"]}
    assert rules == {(("CREATE", "UPDATE"), ("pods", "pods/status", "pods/ephemeralcontainers", "pods/resize")),
                     (("CREATE",), ("pods/binding", "bindings"))}
    # the identities the policy names are the ones the manifests run as
    pod_spec = objects["Deployment", "kubecell-scheduler"]["spec"]["template"]["spec"]
    account = objects["ServiceAccount", pod_spec["serviceAccountName"]]["metadata"]
    agent = objects_of(testbed, AGENT)
    agent_spec = agent["DaemonSet", "kubecell-node-agent"]["spec"]["template"]["spec"]
    agent_account = agent["ServiceAccount", agent_spec["serviceAccountName"]]["metadata"]
    assert writers(objects["ValidatingAdmissionPolicy", POLICY]) == {
        "recordWriters": f"['system:serviceaccount:{account['namespace']}:{account['name']}']",
        "ackWriters": f"['system:serviceaccount:{agent_account['namespace']}:{agent_account['name']}']"}
    assert ("ValidatingAdmissionPolicy", POLICY) not in agent   # see deploy/admission/kustomization.yaml


def overlay(tmp_path: Path, text: str) -> Path:
    """A kustomization of the test's own, next to nothing in deploy/ (kustomize needs relative paths)."""
    (tmp_path / "kustomization.yaml").write_text(text.replace("DEPLOY", os.path.relpath(DEPLOY, tmp_path)))
    return tmp_path


def test_an_overlay_of_the_scheduler_and_the_node_agent_holds_the_policy_once(testbed: ControlPlaneState,
                                                                             tmp_path: Path) -> None:
    objects = rendered(testbed, overlay(tmp_path, "resources: [DEPLOY/extender, DEPLOY/node-agent]\n"))
    policies = [o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert sorted(policies) == [POLICY, "kubecell-node-agent-own-node"], "the records' policy once, and the agent's own"


def test_the_documented_rename_patch_renames_the_writers(testbed: ControlPlaneState, tmp_path: Path) -> None:
    """The overlay the manifest's own comment documents, with the namespace renamed as well."""
    lines = (ADMISSION / "validatingadmissionpolicy.yaml").read_text().splitlines()
    start = lines.index("#   patches:")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#   "))
    documented = "\n".join(line[len("#   "):] for line in lines[start:end])
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered(
        testbed, overlay(tmp_path, f"namespace: gpu-scheduling\nresources: [DEPLOY/base]\n{documented}\n"))}
    assert writers(objects["ValidatingAdmissionPolicy", POLICY]) == {
        "recordWriters": "['system:serviceaccount:gpu-scheduling:kubecell-scheduler']",
        "ackWriters": "['system:serviceaccount:gpu-nodes:kubecell-node-agent']"}
    subjects = objects["ClusterRoleBinding", "kubecell-scheduler"]["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "kubecell-scheduler", "namespace": "gpu-scheduling"}]
    # kustomize puts the namespace on the cluster-scoped policy too, which the API server ignores; and the
    # renamed CEL compiles (a server dry run of the two objects)
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump_all([objects[kind, POLICY] for kind in
                                        ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]))
    result = kubectl(testbed, "apply", "--dry-run=server", "-f", str(file), "-o", "json")
    assert [item["metadata"].get("namespace") for item in json.loads(result.stdout)["items"]] == [None, None]
