"""The profiler: what jobs actually used (GPU utilization, GPU memory, CPU), as distributions kept in a job history.

Pure pieces (``distribution``) carry no I/O; readers (Prometheus) and the store (SQLAlchemy) are adapters."""
