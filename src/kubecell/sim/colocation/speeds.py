"""How fast co-located jobs run in the simulation: measured where the pair was measured, predicted elsewhere.

Measurements are the ground truth the simulation is judged by, so a pair of configurations that was run
together runs at exactly the measured speeds. What was not measured (a pair of configurations never run
together, or three or more jobs on one GPU, which pair tables never hold) runs at the speeds of the
interference model fitted on *all* the pairs given: the best available guess, and one the report must flag,
because there the simulation judges the predictor partly by its own predictions. ``measured`` lets the
experiment count how much job-time ran on each kind of speed.

Nothing here is fitted at import time or holds data: the runs come from the caller (tests and benchmarks read
licensed tables at run time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import InterferencePredictor, JobKey, SharedRun, SoloProfile, fit
from kubecell.core.placement.colocation import usage_of


class PairSpeeds:
    """A ``SpeedModel`` (``kubecell.sim.dynamic.sharing``) backed by measured pairs.

    A pair measured more than once (in either order) runs at the mean of its measurements. A job with no
    profile on its request is taken at its word, as the placement filter takes it (``usage_of``).
    """

    def __init__(self, runs: Sequence[SharedRun], solos: Mapping[JobKey, SoloProfile],
                 predictor: InterferencePredictor | None = None) -> None:
        pairs = [run for run in runs if len(run.jobs) == 2]
        if predictor is None:
            if not pairs:
                raise InvalidInputError("no measured pairs to fit the fallback predictor on", field="runs")
            predictor = InterferencePredictor(fit(pairs, solos))
        self.predictor = predictor
        sums: dict[tuple[JobKey, JobKey], list[float]] = defaultdict(list)
        for run in pairs:
            first, second = run.jobs
            sums[first, second].append(run.speeds[0])
            sums[second, first].append(run.speeds[1])
        self._measured = {pair: sum(values) / len(values) for pair, values in sums.items()}

    def speed(self, job: JobSpec, partners: Sequence[Sequence[JobSpec]]) -> float:
        """The job's speed at its slowest GPU (synchronous members wait for the slowest)."""
        own = usage_of(job.member)
        return min((self.speed_beside(own, [usage_of(other.member) for other in gpu]) for gpu in partners),
                   default=1.0)

    def speed_beside(self, own: SoloProfile, others: Sequence[SoloProfile]) -> float:
        if not others:
            return 1.0
        if len(others) == 1:
            measured = self._measured.get((own.key, others[0].key))
            if measured is not None:
                return measured
        return self.predictor.speeds([own, *others])[0]

    def measured(self, own: JobKey, others: Sequence[JobKey]) -> bool:
        """Whether ``own`` beside ``others`` runs at a measured speed (alone counts as measured: 1.0)."""
        return not others or (len(others) == 1 and (own, others[0]) in self._measured)
