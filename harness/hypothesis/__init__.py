"""Hypothesis files: the document model (built from the claim-kind registry)
and loading YAML with line numbers for every error.  Imports no torch."""
