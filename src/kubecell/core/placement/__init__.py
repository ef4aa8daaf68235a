"""Placement: which node and which GPUs a request gets (Filter, Score, choose-GPU)."""
