"""The dynamic (discrete-event) simulator: multi-tenant arrival traces on an embedded cluster."""
