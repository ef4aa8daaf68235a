"""Tests of the elastic-training core: goodput model, sizing policy, placement."""
