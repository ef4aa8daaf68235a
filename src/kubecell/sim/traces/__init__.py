"""Trace loaders: turn public trace files into core requests and nodes, with row-level errors."""
