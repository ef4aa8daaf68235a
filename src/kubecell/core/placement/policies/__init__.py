"""Placement policies: the FGD-paper baselines, FGD itself, and the binpack/spread modes."""
