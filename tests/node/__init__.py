"""Tests of the node agent (skipped as a whole where the `node` extra, grpcio and grpcio-tools, is absent)."""
