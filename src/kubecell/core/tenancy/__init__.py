"""Tenancy: virtual clusters guaranteed cells of the physical topology (HiveD's model)."""
