"""Elastic training in the pure core: what jobs report, their goodput models, and the policy that sizes
them (how many GPUs, of which type, on which nodes), shared by the simulator and the cluster drivers."""
