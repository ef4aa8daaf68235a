"""The elastic simulator: Pollux/Sia's job model (throughput from profiled placements, statistical efficiency
from the gradient noise scale, progress to a target, restart delays) driving any ``ElasticPolicy`` on Sia's
SOSP '23 workloads, so kubecell's elastic policy can be compared with Sia's published Table 3 (docs/elastic.md)."""
