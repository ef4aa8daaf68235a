"""The simulator: drives the scheduling core over traces on an embedded cluster and reports results."""
