"""Running a hypothesis: the plan (which activations to cache), the shared base
runs, the sanity checks, each kind's measurement, the figures' data, and the
Evidence with its provenance."""
