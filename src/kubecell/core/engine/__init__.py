"""The scheduling engine: jobs and gangs, queues, tenancy classes, preemption, reservations."""
