"""Interference-aware GPU sharing: predicting how much co-located jobs slow each other from solo profiles,
and the admission rules built on it (issue 23).

Pure like the rest of the core: it takes profiles and measurements as data and never reads files; the
readers of measurement tables are in ``kubecell.inputs.colocation``. No calibration is built in: the
defaults are physically motivated (see ``predictor``), and measurements go through ``fit``.
"""

from kubecell.core.interference.admission import (
    AdmissionRule,
    BlindSharing,
    NoSharing,
    PredictedSlowdown,
    PressureAdaptive,
    SummedUtilThreshold,
    memory_fits,
    summed_util,
    tune_limit,
    tune_predicted_floor,
    tune_summed_util,
)
from kubecell.core.interference.history import HistoryInformed, KnownPairs, PairHistory, informed_by_pairs
from kubecell.core.interference.predictor import InterferenceParams, InterferencePredictor, fit, predict_speeds
from kubecell.core.interference.profile import InvalidProfileError, JobKey, SharedRun, SoloProfile, UnknownJobError

__all__ = [
    "AdmissionRule",
    "BlindSharing",
    "HistoryInformed",
    "InterferenceParams",
    "InterferencePredictor",
    "InvalidProfileError",
    "JobKey",
    "KnownPairs",
    "NoSharing",
    "PairHistory",
    "PredictedSlowdown",
    "PressureAdaptive",
    "SharedRun",
    "SoloProfile",
    "SummedUtilThreshold",
    "UnknownJobError",
    "fit",
    "informed_by_pairs",
    "memory_fits",
    "predict_speeds",
    "summed_util",
    "tune_limit",
    "tune_predicted_floor",
    "tune_summed_util",
]
