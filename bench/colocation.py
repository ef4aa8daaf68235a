"""Interference-aware sharing against simple admission rules, on measured pairs of jobs sharing one GPU.

    python bench/colocation.py [--pairs FILE] [--solo FILE] [--floor 0.8] [--target-rate 0.01]
                               [--folds 4] [--seed 0] [--partitions 1] [--holdout any|both]
                               [--gpu-memory-mib 24576]

Defaults read Lucid's RTX 3090 tables from ``../shared/data/colocation`` (non-commercial licence: used here,
at run time, never stored in the product). For each rule it prints how many pairs it admits and the share of
admitted pairs in which a job fell below ``--floor`` (default 0.8x) and below 0.9x of its solo speed.

Rules: no sharing; blind sharing (memory fits); Alnair's summed solo GPU utilization <= 70 %; the best single
summed-utilization threshold; kubecell's predictor, calibrated (``fit``) and then with its floor tuned; and,
for reference, the predictor at its uncalibrated defaults with only the floor tuned. "Best" threshold and
"tuned" floor use the same rule (``kubecell.core.interference.admission.tune_limit``): the largest limit
whose bad rate (pairs with a job below ``--floor``, over pairs admitted) on the calibration pairs is
<= ``--target-rate``.

Why leave models out: a model seen in calibration has its exact configurations' behaviour in the fit, so
pairs of it flatter any rule tuned on them; a scheduler meets new models every day. The models are shuffled
(``--seed``) and dealt into ``--folds`` groups; for each group, calibration is every pair in which neither
job's model is in the group, and evaluation is every pair in which *at least one* job's model is (``any``,
the default: the case of a new job joining a GPU that runs a known one, and enough pairs to count) or in
which *both* are (``both``: strictly unseen, but with 8 models only pairs inside one group, few and
same-model heavy). With ``any``, a pair whose models fall in two groups is evaluated twice, under two
calibrations; counts are summed over folds, so "admitted" counts pair-evaluations. Nothing of the
evaluation pairs is used to tune either rule. The in-sample figures (calibrated and evaluated on every pair)
are printed for reference only.

One dealing of 8 models into 4 folds is one draw: a single pair that turns bad or good moves a rule's rate by
0.1-0.2 points, and which models share a fold moves both rules' counts by tens of pairs. ``--partitions N``
deals the models N times (seeds ``--seed`` .. ``--seed + N - 1``) and sums the held-out counts over all of
them, so that a comparison between the rules does not hang on one dealing.

Ranking apart from calibration: the tuned rules stand or fall by two things, how well their score *ranks*
pairs (safe ones first) on models never seen, and where tuning puts the limit. The section "ranking on the
evaluated pairs" separates the first: for each fold it takes each score (summed solo utilization, lower
first; the fold's calibrated predictor's worst speed, higher first) and counts how many evaluated pairs the
best limit *for those very pairs* would admit at a given bad rate (an oracle operating point, so no rule
could do better with that score), summed over folds. Equal counts there mean the predictor's extra
admissions above come from calibration, not from knowing better which pairs are safe.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import (
    AdmissionRule,
    BlindSharing,
    InterferencePredictor,
    NoSharing,
    SharedRun,
    SoloProfile,
    SummedUtilThreshold,
    fit,
    summed_util,
    tune_limit,
    tune_predicted_floor,
    tune_summed_util,
)
from kubecell.inputs.colocation import load_shared_runs, load_solo_profiles

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "colocation"
RULES = ("no sharing", "blind sharing", "Alnair: summed util <= 70 %", "best single threshold",
         "kubecell predictor (calibrated)", "kubecell predictor (defaults, floor tuned)")


@dataclass
class Tally:
    admitted: int = 0
    below_floor: int = 0
    below_09: int = 0

    def rate(self, count: int) -> str:
        return f"{100 * count / self.admitted:6.2f} %" if self.admitted else "     - "


@dataclass(frozen=True)
class Case:
    """One measured pair with its jobs' solo profiles joined on."""

    run: SharedRun
    sharers: tuple[SoloProfile, ...]

    @property
    def models(self) -> frozenset[str]:
        return frozenset(job.model for job in self.run.jobs)


RANKING_RATES = (0.005, 0.01, 0.02, 0.03)
"""Bad rates at which the ranking section compares the scores' best admissions."""
BY_UTIL, BY_PREDICTION = "summed solo utilization", "kubecell predicted worst speed"


def best_admitted(scores: Sequence[float], bad: Sequence[bool], rate: float) -> int:
    """The most pairs any limit on ``scores`` (lower = admitted first; ties together) admits at a bad rate
    <= ``rate`` over these pairs: ``tune_limit``'s limit, tuned on the evaluated pairs themselves."""
    limit = tune_limit(scores, bad, rate)
    return 0 if limit is None else sum(score <= limit for score in scores)


@dataclass
class Evaluation:
    tallies: dict[str, Tally] = field(default_factory=lambda: {name: Tally() for name in RULES})
    evaluated: int = 0
    notes: list[str] = field(default_factory=list)
    ranking: dict[str, list[int]] = field(default_factory=lambda: {name: [0] * len(RANKING_RATES)
                                                                   for name in (BY_UTIL, BY_PREDICTION)})

    def rank(self, predictor: InterferencePredictor, cases: Sequence[Case], floor: float) -> None:
        bad = [case.run.worst_speed() < floor for case in cases]
        scores = {BY_UTIL: [summed_util(case.sharers) for case in cases],
                  BY_PREDICTION: [-predictor.worst_speed(case.sharers) for case in cases]}
        for name, values in scores.items():
            for index, rate in enumerate(RANKING_RATES):
                self.ranking[name][index] += best_admitted(values, bad, rate)

    def absorb(self, other: Evaluation) -> None:
        """Add another dealing's counts to these (notes are kept only for a single dealing)."""
        self.evaluated += other.evaluated
        for name, tally in other.tallies.items():
            mine = self.tallies[name]
            mine.admitted += tally.admitted
            mine.below_floor += tally.below_floor
            mine.below_09 += tally.below_09
        for name, counts in other.ranking.items():
            self.ranking[name] = [mine + theirs for mine, theirs in zip(self.ranking[name], counts, strict=True)]

    def count(self, rules: dict[str, AdmissionRule | None], cases: Sequence[Case], floor: float,
              gpu_memory_mib: float) -> None:
        self.evaluated += len(cases)
        for name, rule in rules.items():
            tally = self.tallies[name]
            for case in cases:
                if rule is not None and rule.admits(case.sharers, gpu_memory_mib):
                    tally.admitted += 1
                    tally.below_floor += case.run.worst_speed() < floor
                    tally.below_09 += case.run.worst_speed() < 0.9


def tuned_rules(calibration: Sequence[Case], floor: float, target_rate: float) -> tuple[
        dict[str, AdmissionRule | None], InterferencePredictor, str]:
    """Every rule, with the threshold, the fit and the floors tuned on ``calibration`` only."""
    runs = [case.sharers for case in calibration]
    worst = [case.run.worst_speed() for case in calibration]
    solos = {profile.key: profile for case in calibration for profile in case.sharers}
    threshold = tune_summed_util(runs, worst, floor=floor, target_rate=target_rate)
    params = fit([case.run for case in calibration], solos)
    kubecell = tune_predicted_floor(InterferencePredictor(params), runs, worst, floor=floor, target_rate=target_rate)
    defaults = tune_predicted_floor(InterferencePredictor(), runs, worst, floor=floor, target_rate=target_rate)
    note = (f"threshold {threshold.limit:.1f} %" if threshold else "threshold: none") + \
        f"; fit queueing={params.queueing:.3f} bandwidth={params.bandwidth:.3f}" + \
        (f"; predicted floor {kubecell.floor:.3f}" if kubecell else "; predicted floor: none")
    rules: dict[str, AdmissionRule | None] = {
        RULES[0]: NoSharing(), RULES[1]: BlindSharing(), RULES[2]: SummedUtilThreshold(70.0), RULES[3]: threshold,
        RULES[4]: kubecell, RULES[5]: defaults}
    return rules, InterferencePredictor(params), note


def folds_of(cases: Sequence[Case], folds: int, seed: int) -> list[list[str]]:
    models = sorted({model for case in cases for model in case.models})
    if not 2 <= folds <= len(models):
        raise SystemExit(f"--folds must be between 2 and the number of models ({len(models)}), got {folds}")
    random.Random(seed).shuffle(models)
    return [sorted(models[index::folds]) for index in range(folds)]


def held_out(cases: Sequence[Case], floor: float, target_rate: float, groups: Sequence[Sequence[str]], mode: str,
             gpu_memory_mib: float) -> Evaluation:
    evaluation = Evaluation()
    for group in groups:
        hidden = set(group)
        calibration = [case for case in cases if not case.models & hidden]
        if mode == "any":
            evaluated = [case for case in cases if case.models & hidden]
        else:
            evaluated = [case for case in cases if case.models <= hidden]
        if not calibration or not evaluated:
            evaluation.notes.append(f"held out {', '.join(group)}: {len(calibration)} calibration pairs, "
                                    f"{len(evaluated)} evaluated; skipped (nothing to calibrate on or to evaluate)")
            continue
        rules, predictor, note = tuned_rules(calibration, floor, target_rate)
        evaluation.count(rules, evaluated, floor, gpu_memory_mib)
        evaluation.rank(predictor, evaluated, floor)
        evaluation.notes.append(f"held out {', '.join(group)}: {len(calibration)} calibration pairs, "
                                f"{len(evaluated)} evaluated; {note}")
    return evaluation


def in_sample(cases: Sequence[Case], floor: float, target_rate: float, gpu_memory_mib: float) -> Evaluation:
    evaluation = Evaluation()
    rules, predictor, note = tuned_rules(cases, floor, target_rate)
    evaluation.count(rules, cases, floor, gpu_memory_mib)
    evaluation.rank(predictor, cases, floor)
    evaluation.notes.append(note)
    return evaluation


def report(title: str, evaluation: Evaluation, floor: float) -> None:
    print(f"\n{title}: {evaluation.evaluated} pair evaluations")
    for note in evaluation.notes:
        print(f"  {note}")
    print(f"  {'rule':44s} {'admitted':>8s} {f'< {floor:g}x':>9s} {'< 0.9x':>9s}")
    for name, tally in evaluation.tallies.items():
        print(f"  {name:44s} {tally.admitted:8d} {tally.rate(tally.below_floor)} {tally.rate(tally.below_09)}")
    best, ours = evaluation.tallies[RULES[3]], evaluation.tallies[RULES[4]]
    if best.admitted:
        ratio = ours.admitted / best.admitted
        no_worse = ours.below_floor * best.admitted <= best.below_floor * ours.admitted
        print(f"  kubecell admitted / best threshold admitted = {ratio:.3f}; rate below {floor:g}x "
              f"{'no higher' if no_worse else 'HIGHER'} than the threshold's; target (>= 1.15 at no higher rate) "
              f"{'met' if ratio >= 1.15 and no_worse else 'NOT met'}")
    print("  ranking on the evaluated pairs: most pairs the best limit for them admits, at a bad rate of")
    print(f"  {'score':44s} " + " ".join(f"{f'<= {100 * rate:g} %':>8s}" for rate in RANKING_RATES))
    for name, counts in evaluation.ranking.items():
        print(f"  {name:44s} " + " ".join(f"{count:8d}" for count in counts))
    ratios = (mine / theirs if theirs else float("nan")
              for mine, theirs in zip(evaluation.ranking[BY_PREDICTION], evaluation.ranking[BY_UTIL], strict=True))
    print(f"  {'kubecell / summed utilization':44s} " + " ".join(f"{ratio:8.3f}" for ratio in ratios))


def load(pairs: Path, solo: Path) -> list[Case]:
    for path in (pairs, solo):
        if not path.is_file():
            raise SystemExit(f"{path}: not found. The Lucid tables live in ../shared/data/colocation next to the "
                             "repository; pass --pairs and --solo to use other measurements.")
    try:
        solos = load_solo_profiles(solo)
        runs = load_shared_runs(pairs, solos)
    except InvalidInputError as error:
        raise SystemExit(str(error)) from None
    if not runs:
        raise SystemExit(f"{pairs}: no pairs (a header and no rows)")
    return [Case(run, run.profiles(solos)) for run in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=DATA / "lucid_colocate_pairs.csv")
    parser.add_argument("--solo", type=Path, default=DATA / "lucid_single_data.csv")
    parser.add_argument("--floor", type=float, default=0.8, help="a pair is bad when a job falls below this speed")
    parser.add_argument("--target-rate", type=float, default=0.01,
                        help="bad rate allowed on calibration pairs when tuning the threshold and the floor")
    parser.add_argument("--folds", type=int, default=4, help="groups of models, each held out once")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the models before dealing them into folds")
    parser.add_argument("--partitions", type=int, default=1,
                        help="deal the models into folds this many times (seeds --seed, --seed + 1, ...) and sum")
    parser.add_argument("--holdout", choices=("any", "both"), default="any",
                        help="evaluate pairs with at least one / both models held out")
    parser.add_argument("--gpu-memory-mib", type=float, default=24576.0, help="RTX 3090: 24 GiB")
    args = parser.parse_args()
    for name, value, low, high in (("--floor", args.floor, 0.0, 1.0), ("--target-rate", args.target_rate, 0.0, 1.0),
                                   ("--gpu-memory-mib", args.gpu_memory_mib, 1.0, 1e9)):
        if not (math.isfinite(value) and low < value <= high):
            parser.error(f"{name} {value}: give a number above {low:g} and at most {high:g}")
    if not 1 <= args.partitions <= 1000:
        parser.error(f"--partitions {args.partitions}: give a whole number from 1 to 1000")
    cases = load(args.pairs, args.solo)
    print(f"{len(cases)} pairs of {len({m for case in cases for m in case.models})} models; floor {args.floor:g}x, "
          f"calibration bad rate <= {100 * args.target_rate:g} %")
    pooled = Evaluation()
    for seed in range(args.seed, args.seed + args.partitions):
        groups = folds_of(cases, args.folds, seed)
        dealing = held_out(cases, args.floor, args.target_rate, groups, args.holdout, args.gpu_memory_mib)
        if args.partitions == 1:
            pooled = dealing
        else:
            pooled.absorb(dealing)
    seeds = f"seed {args.seed}" if args.partitions == 1 else \
        f"{args.partitions} dealings, seeds {args.seed}-{args.seed + args.partitions - 1}, summed"
    report(f"held-out models ({args.folds} folds, {seeds}, evaluated: {args.holdout} model(s) unseen)", pooled,
           args.floor)
    report("in-sample (reference only)", in_sample(cases, args.floor, args.target_rate, args.gpu_memory_mib),
           args.floor)


if __name__ == "__main__":
    main()
