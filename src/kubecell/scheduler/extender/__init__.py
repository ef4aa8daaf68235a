"""kube-scheduler's HTTP extender protocol, served by kubecell's engine (``kubecell extender``)."""
