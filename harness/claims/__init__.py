"""Claim kinds: one module per kind (its schema, measurement, verdict and
report text), and the registry that the rest of the harness loops over."""
