"""The state of a scenario run at a step, and what every step handler needs to read it and to complain.

Events (``runner.py``) and expectations (``expectations.py``) are written against this one object, like
actions against a scheduler session: the engine under test, the scenario clock, what was evicted,
downgraded or shrunk since the last check, and helpers that describe a job's state and raise errors
located at the current step of the scenario file.
"""

from __future__ import annotations

from typing import Any

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.invariants import EngineInvariantError
from kubecell.core.engine.job import Job
from kubecell.core.topology import CellForest
from kubecell.testing.scenarios.format import Scenario, ScenarioFailure, ScenarioInputError, Step


class StepContext:
    """A running scenario: its engine and clock, and the step being performed."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.forest = CellForest(scenario.nodes)
        self.engine = Engine(scenario.nodes, scenario.tenants.resolve(self.forest), scenario.options,
                             forest=self.forest)
        self.now = 0.0
        self.changed = True
        """An event happened since the last cycle (an ``expect_*`` step then runs one first)."""
        self.cycles = 0
        self.evicted: list[str] = []
        self.downgraded: list[str] = []
        self.shrunk: list[str] = []
        self.log: list[str] = []
        self.step: Step | None = None

    def location(self) -> str:
        """``file:line: steps[i] (action)`` of the current step (the file alone between steps)."""
        return self.step.location if self.step is not None else self.scenario.source

    def fail(self, message: str) -> ScenarioFailure:
        step = self.step
        return ScenarioFailure(message, location=self.location(), source=self.scenario.source,
                               step=step.index if step else None, action=step.action if step else None)

    def invalid(self, message: str, **kwargs: Any) -> ScenarioInputError:
        return ScenarioInputError(message, location=self.location(), **kwargs)

    def job(self, name: Any) -> Job:
        if not isinstance(name, str) or name not in self.engine.jobs:
            raise self.invalid(f"no job named {name!r} was submitted", field="job",
                               accepted=", ".join(self.engine.jobs) or "none yet")
        return self.engine.jobs[name]

    def describe(self, job: Job) -> str:
        where = sorted({self.engine.book.allocations[a].node for a in job.running_members
                        if a in self.engine.book.allocations})
        cls = job.job_class.value if job.job_class else "-"
        return (f"[{job.name}: phase={job.phase.value} class={cls} members={job.size}/{job.spec.members} "
                f"preemptions={job.preemptions} nodes={where} reason={job.wait_reason!r}]")

    def gpus_of(self, job: Job) -> list[tuple[int, int, int]]:
        """(node index, GPU index, milli) per GPU slot the job holds."""
        book = self.engine.book
        out: list[tuple[int, int, int]] = []
        for name in job.running_members:
            allocation = book.allocations[name]
            for gpu in allocation.gpu_indices:
                out.append((book.index[allocation.node], gpu, allocation.gpu_milli))
        return out

    def nodes_of(self, job: Job) -> set[str]:
        return {self.engine.book.allocations[a].node for a in job.running_members}

    def check_invariants(self) -> None:
        try:
            self.engine.check_invariants()
        except EngineInvariantError as error:
            raise self.fail(f"engine invariant broken: {error}") from None
