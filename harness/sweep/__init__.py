"""`harness sweep`: hypothesis files x models (checkpoints, seeds), one job per
pair run by an executor (in-process or Ray), and the combined report."""
