"""The ElasticJob controller, a driver: runs torchrun elastic workers as one kubecell gang whose size the
scheduler chooses through the job's ``/scale`` subresource.

``states`` is the job's state machine as one pure function; ``workers`` reads worker Pods into the states
it observes; ``controller`` is the reconcile loop against the API server (all state lives there)."""
