"""Running a scenario: its events drive the engine step by step, its expectations are checked, and the
engine's invariants are checked after every step.

A cycle runs before an ``expect_*`` step whenever an event happened since the last one (so a scenario
states outcomes, not scheduling mechanics), and RESERVED preemptors are confirmed as a driver would,
unless the scenario says otherwise. Any exception the engine raises is a failure of the scenario, with
the step that caused it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubecell.core.engine.engine import CycleResult, Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.testing.scenarios.expectations import Expectations
from kubecell.testing.scenarios.format import (
    Scenario,
    ScenarioFailure,
    ScenarioInputError,
    Step,
    TenantSection,
    as_int,
)
from kubecell.testing.scenarios.parse import load_scenario


@dataclass(slots=True)
class ScenarioResult:
    scenario: Scenario
    engine: Engine
    cycles: int
    seconds: float
    log: list[str] = field(default_factory=list)


class ScenarioRunner(Expectations):
    """Performs a scenario's steps: the event handlers (``do_<action>``) and the loop."""

    def run(self) -> ScenarioResult:
        started = time.perf_counter()
        for step in self.scenario.steps:
            self.step = step
            if step.at is not None:
                if step.at < self.now:
                    raise self.invalid(f"time goes backwards ({step.at:g} < {self.now:g})", field="at",
                                       accepted="non-decreasing 'at' values")
                self.now = step.at
            try:
                self.perform(step)
            except (ScenarioFailure, ScenarioInputError):
                raise
            except Exception as error:  # an engine crash (any error it raises) is a failure of the scenario
                raise self.fail(f"the engine raised {type(error).__name__}: {error}") from error
            self.check_invariants()
        self.step = None
        return ScenarioResult(self.scenario, self.engine, self.cycles, time.perf_counter() - started, self.log)

    def perform(self, step: Step) -> None:
        handler: Callable[[Any], None] = getattr(self, "do_" + step.action)
        if step.action.startswith("expect_") and self.changed and step.cycle:
            self.cycle(confirm=self.scenario.auto_confirm)
        handler(step.args)

    def cycle(self, *, confirm: bool) -> CycleResult:
        result = self.engine.schedule(self.now)
        self.cycles += 1
        self.changed = False
        self.evicted.extend(j.name for j in result.evicted)
        self.downgraded.extend(j.name for j in result.downgraded)
        self.shrunk.extend(cut.job.name for cut in result.shrunk)
        if confirm:
            for job in result.started:
                if job.phase == JobPhase.RESERVED:
                    self.engine.confirm(job.name, self.now)
        self.log.append(f"t={self.now:g} cycle: started={[j.name for j in result.started]} "
                        f"evicted={[j.name for j in result.evicted]} downgraded={[j.name for j in result.downgraded]} "
                        f"grown={[j.name for j in result.grown]} "
                        f"shrunk={[(cut.job.name, len(cut.members)) for cut in result.shrunk]}")
        return result

    # ------------------------------------------------------------------ events
    def do_submit(self, specs: list[JobSpec]) -> None:
        for spec in specs:
            self.engine.submit(replace(spec, submit_time=self.now), self.now)
            self.log.append(f"t={self.now:g} submit {spec.name}")
        self.changed = True

    def do_schedule(self, args: Mapping[str, Any]) -> None:
        cycles = as_int(args.get("cycles", 1), self.location(), "cycles", 1)
        confirm = args.get("confirm", self.scenario.auto_confirm)
        if not isinstance(confirm, bool):
            raise self.invalid("confirm must be true or false", field="confirm")
        for _ in range(cycles):
            self.cycle(confirm=confirm)

    def do_finish(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED):
            raise self.fail(f"cannot finish {job.name}, it is not running (use cancel for a waiting job; a cycle "
                            f"runs only before expect_* and schedule steps): {self.describe(job)}")
        self.engine.finish(job.name, self.now)
        self.changed = True

    def do_cancel(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.PENDING:
            raise self.fail(f"cannot cancel {job.name}, it is not waiting: {self.describe(job)}")
        self.engine.cancel(job.name, self.now)
        self.changed = True

    def do_confirm(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.RESERVED:
            raise self.fail(f"{job.name} is not reserved: {self.describe(job)}")
        self.engine.confirm(job.name, self.now)
        self.changed = True

    def _node(self, args: Mapping[str, Any]) -> str:
        name = args["node"]
        if name not in self.engine.book.index:
            raise self.invalid(f"unknown node {name!r}", field="node",
                               accepted=", ".join(n.name for n in self.engine.book.nodes))
        return str(name)

    def do_mark_node_bad(self, args: Mapping[str, Any]) -> None:
        killed = self.engine.set_node_health(self._node(args), False, self.now)
        self.log.append(f"t={self.now:g} node {args['node']} bad; stopped {[j.name for j in killed]}")
        self.changed = True

    def do_mark_node_good(self, args: Mapping[str, Any]) -> None:
        self.engine.set_node_health(self._node(args), True, self.now)
        self.changed = True

    def do_reload_config(self, section: TenantSection) -> None:
        try:
            tenants = section.resolve(self.forest)
        except InvalidInputError as error:
            raise ScenarioInputError(error.message, location=error.location, field=error.field,
                                     accepted=error.accepted) from None
        downgraded = self.engine.reload(tenants, self.now)
        self.downgraded.extend(j.name for j in downgraded)
        self.log.append(f"t={self.now:g} reload; downgraded {[j.name for j in downgraded]}")
        self.changed = True


def run_scenario(scenario: Scenario | str | Path) -> ScenarioResult:
    """Run every step; return the result or raise ``ScenarioFailure`` (a step's expectation failed, an
    invariant broke or the engine crashed) or ``InvalidInputError`` (the scenario itself is malformed)."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    return ScenarioRunner(scenario).run()
