"""Expectations: the ``expect_*`` steps, each a check of the engine's state that fails with what was
expected and what the engine holds.

Checks are about outcomes (which job runs, in which class, on one node or rack, inside which cells, who
was evicted, why a job waits), never about incidental GPU indices, so a scenario survives tie-breaking
changes. A failed check raises ``ScenarioFailure`` with the job's full state; a check that cannot be
evaluated (unknown job, class or cell type) raises ``ScenarioInputError``: the scenario is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubecell.core.engine.job import Job, JobClass, JobPhase
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.topology import Cell
from kubecell.testing.scenarios.context import StepContext
from kubecell.testing.scenarios.format import as_int, as_number, as_str, as_str_list

GENERIC_REASONS = ("not yet considered", "submitted; waiting for the next scheduling cycle")
"""Wait reasons that explain nothing: a waiting job a cycle has seen must have a specific one."""


def _contains_all(text: str, wanted: Sequence[str]) -> list[str]:
    low = text.lower()
    return [w for w in wanted if w.lower() not in low]


class Expectations(StepContext):
    """The ``expect_*`` step handlers (``do_<action>``), over a running scenario's state."""

    def _class(self, value: Any) -> JobClass:
        try:
            return JobClass(str(value).lower())
        except ValueError:
            raise self.invalid(f"unknown class {value!r}", field="class",
                               accepted=", ".join(c.value for c in JobClass)) from None

    def _phase(self, value: Any) -> JobPhase:
        try:
            return JobPhase(str(value).lower())
        except ValueError:
            raise self.invalid(f"unknown phase {value!r}", field="phase",
                               accepted=", ".join(p.value for p in JobPhase)) from None

    def _bool(self, args: Mapping[str, Any], key: str) -> bool | None:
        value = args.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.invalid(f"{key} must be true or false", field=key)
        return value

    def do_expect_bound(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        state = self.describe(job)
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED) or not job.running_members:
            raise self.fail(f"expected {job.name} to be bound, but it is not: {state}")
        if "phase" in args and job.phase != self._phase(args["phase"]):
            raise self.fail(f"expected {job.name} in phase {args['phase']}: {state}")
        if "class" in args and job.job_class != self._class(args["class"]):
            raise self.fail(f"expected {job.name} to run as {args['class']}: {state}")
        if "members" in args and job.size != as_int(args["members"], self.location(), "members", 0):
            raise self.fail(f"expected {job.name} to run {args['members']} member(s): {state}")
        slots = self.gpus_of(job)
        if "gpus" in args:
            held = sum(milli for _, _, milli in slots) / MILLI_PER_GPU
            if abs(held - as_number(args["gpus"], self.location(), "gpus")) > 1e-9:
                raise self.fail(f"expected {job.name} to hold {args['gpus']} GPU(s), it holds {held:g}: {state}")
        nodes = self.nodes_of(job)
        if "nodes" in args and len(nodes) != as_int(args["nodes"], self.location(), "nodes", 1):
            raise self.fail(f"expected {job.name} on {args['nodes']} node(s), it is on {sorted(nodes)}: {state}")
        same_node = self._bool(args, "same_node")
        if same_node is not None and (len(nodes) == 1) != same_node:
            raise self.fail(f"expected {job.name} {'on one node' if same_node else 'on several nodes'}, "
                            f"it is on {sorted(nodes)}: {state}")
        same_rack = self._bool(args, "same_rack")
        if same_rack is not None:
            racks = {(n.zone, n.rack) for n in self.engine.book.nodes if n.name in nodes}
            if (len(racks) == 1 and all(r for _, r in racks)) != same_rack:
                raise self.fail(f"expected {job.name} {'in one rack' if same_rack else 'across racks'}, "
                                f"racks {sorted(r for _, r in racks)}: {state}")
        if "node_in" in args:
            allowed = set(as_str_list(args["node_in"], self.location(), "node_in"))
            if not nodes <= allowed:
                raise self.fail(f"expected {job.name} only on {sorted(allowed)}, it is on {sorted(nodes)}: {state}")
        if "node_not_in" in args:
            banned = set(as_str_list(args["node_not_in"], self.location(), "node_not_in"))
            if nodes & banned:
                raise self.fail(f"expected {job.name} off {sorted(banned)}, it is on {sorted(nodes)}: {state}")
        if "within_cell" in args:
            self._expect_within_cell(job, as_str(args["within_cell"], self.location(), "within_cell"), slots)
        if "same_gpu_as" in args:
            other = self.job(args["same_gpu_as"])
            mine = {(n, g) for n, g, _ in slots}
            theirs = {(n, g) for n, g, _ in self.gpus_of(other)}
            if not mine or mine != theirs or len(mine) != 1:
                raise self.fail(f"expected {job.name} on the same single GPU as {other.name}: {state} "
                                f"{self.describe(other)}")
        if "not_same_gpu_as" in args:
            other = self.job(args["not_same_gpu_as"])
            shared = {(n, g) for n, g, _ in slots} & {(n, g) for n, g, _ in self.gpus_of(other)}
            if shared:
                raise self.fail(f"expected {job.name} to share no GPU with {other.name}: {state} "
                                f"{self.describe(other)}")
        if "same_node_as" in args:
            other = self.job(args["same_node_as"])
            if nodes != self.nodes_of(other) or len(nodes) != 1:
                raise self.fail(f"expected {job.name} on the node of {other.name}: {state} {self.describe(other)}")
        if "not_same_node_as" in args:
            other = self.job(args["not_same_node_as"])
            if nodes & self.nodes_of(other):
                raise self.fail(f"expected {job.name} away from {other.name}'s nodes: {state} {self.describe(other)}")
        within_vc = self._bool(args, "within_vc_cells")
        if within_vc is not None:
            outside = self._outside_vc_cells(job)
            if within_vc and outside:
                raise self.fail(f"expected {job.name} inside cells bound to VC {job.vc}; GPUs outside: "
                                f"{outside}: {state}")
            if not within_vc and not outside:
                raise self.fail(f"expected {job.name} outside VC {job.vc}'s bound cells: {state}")
        self._reason(job, args)

    def _outside_vc_cells(self, job: Job) -> list[str]:
        tenancy = self.engine.tenancy
        mine = tenancy.vc_index.get(job.vc, -2)
        return [f"{self.engine.book.nodes[n].name}/{g}" for n, g, _ in self.gpus_of(job)
                if tenancy.owner[n, g] != mine]

    def _expect_within_cell(self, job: Job, target: str, slots: list[tuple[int, int, int]]) -> None:
        state = self.describe(job)
        gpus = {(n, g) for n, g, _ in slots}
        if target in self.forest.by_id:
            cell = self.forest.by_id[target]
            if not gpus <= set(cell.gpus):
                raise self.fail(f"expected {job.name} inside cell {target}: {state}")
            return
        try:
            self.forest.parse_type(target)
        except InvalidInputError:
            raise self.invalid(f"{target!r} is neither a cell id nor a cell type", field="within_cell",
                               accepted=", ".join(self.forest.type_names())) from None
        containers: set[Cell] = set()
        for key in gpus:
            leaf: Cell | None = self.forest.gpu_cell.get(key)
            while leaf is not None and leaf.type_name != target:
                leaf = leaf.parent
            if leaf is None:
                raise self.fail(f"expected {job.name} inside one {target} cell; a GPU is in none: {state}")
            containers.add(leaf)
        if len(containers) != 1:
            raise self.fail(f"expected {job.name} inside one {target} cell, it spans "
                            f"{sorted(c.id for c in containers)}: {state}")

    def _reason(self, job: Job, args: Mapping[str, Any]) -> None:
        explanation = self.engine.queries.explain(job.name)
        if "reason_contains" in args:
            missing = _contains_all(explanation, as_str_list(args["reason_contains"], self.location(),
                                                           "reason_contains"))
            if missing:
                raise self.fail(f"the reason for {job.name} lacks {missing}: {explanation!r}")
        if "reason_not_contains" in args:
            unwanted = as_str_list(args["reason_not_contains"], self.location(), "reason_not_contains")
            found = [w for w in unwanted if w.lower() in explanation.lower()]
            if found:
                raise self.fail(f"the reason for {job.name} should not mention {found}: {explanation!r}")

    def do_expect_waiting(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.PENDING:
            raise self.fail(f"expected {job.name} to wait, but: {self.describe(job)}")
        if job.running_members:
            raise self.fail(f"waiting job {job.name} holds allocations: {self.describe(job)}")
        if job.wait_reason in GENERIC_REASONS:
            raise self.fail(f"waiting job {job.name} has no specific reason: {self.describe(job)}")
        self._reason(job, args)

    def do_expect_rejected(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.REJECTED:
            raise self.fail(f"expected {job.name} to be rejected, but: {self.describe(job)}")
        self._reason(job, args)

    def _expect_set(self, args: Mapping[str, Any], seen: list[str], what: str) -> None:
        happened = set(seen)
        wanted = set(as_str_list(args.get("jobs", []), self.location(), "jobs"))
        spared = set(as_str_list(args.get("not", []), self.location(), "not"))
        for name in wanted | spared:
            self.job(name)
        record = f"{what} since the previous check: {sorted(happened) or 'none'}"
        if wanted - happened:
            raise self.fail(f"expected {sorted(wanted - happened)} {what}; {record}")
        if spared & happened:
            raise self.fail(f"expected {sorted(spared & happened)} not {what}; {record}")
        if "count" in args and len(happened) != as_int(args["count"], self.location(), "count", 0):
            raise self.fail(f"expected {args['count']} job(s) {what}; {record}")
        exactly = self._bool(args, "exactly")
        if exactly and happened != wanted:
            raise self.fail(f"expected exactly {sorted(wanted)} {what}; {record}")
        seen.clear()

    def do_expect_preempted(self, args: Mapping[str, Any]) -> None:
        self._expect_set(args, self.evicted, "preempted")

    def do_expect_downgraded(self, args: Mapping[str, Any]) -> None:
        self._expect_set(args, self.downgraded, "downgraded")

    def do_expect_shrunk(self, args: Mapping[str, Any]) -> None:
        self._expect_set(args, self.shrunk, "shrunk")

    def do_expect_class(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED) or job.job_class != self._class(args["class"]):
            raise self.fail(f"expected {job.name} to run as {args['class']}: {self.describe(job)}")

    def do_expect_phase(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != self._phase(args["phase"]):
            raise self.fail(f"expected {job.name} in phase {args['phase']}: {self.describe(job)}")

    def do_expect_preemptions(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.preemptions != as_int(args["count"], self.location(), "count", 0):
            raise self.fail(f"expected {job.name} preempted {args['count']} time(s): {self.describe(job)}")

    def do_expect_status(self, args: Mapping[str, Any]) -> None:
        status = self.engine.queries.status()
        vc = args["vc"]
        if vc not in status:
            raise self.invalid(f"unknown VC {vc!r}", field="vc", accepted=", ".join(status))
        row = status[vc]
        for key, value in args.items():
            if key == "vc":
                continue
            if key not in row:
                raise self.invalid(f"unknown status key {key!r}", accepted=", ".join(row))
            expected = as_number(value, self.location(), str(key))
            if abs(row[key] - expected) > 1e-9:
                raise self.fail(f"VC {vc}: expected {key} = {expected:g}, got {row[key]:g} (status {row})")

    def do_expect_invariants(self, args: Mapping[str, Any]) -> None:
        self.check_invariants()

