"""What the scheduler shows the people who run it: a snapshot of its state, Prometheus metrics, the dashboard."""
