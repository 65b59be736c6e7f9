"""The words of the hypothesis format: every enumeration the schema accepts,
defined once and imported by the schema, the mechanisms and the reports."""

from __future__ import annotations

from typing import Literal

ATTENTION_ROLES = ("previous_token", "induction", "duplicate_token", "first_token")
ABLATIONS = ("zero", "mean", "resample")
DIRECTIONS = ("noising", "denoising")
REPLACEMENTS = ("resample", "mean", "zero")
METRICS = ("logprob", "logit_diff")
UNITS = {"logprob": "nats", "logit_diff": "logits"}  # the unit of each metric
WEIGHT_PROCESSING = ("folded", "raw")
MODES = ("q", "k", "v")  # composition modes = the receiver input read
CORRUPTIONS = ("first_half", "second_half", "both")  # of the repeated-tokens generator
NORMALIZATIONS = ("corrupted", "baseline")  # what a normalised effect divides by

AttentionRole = Literal["previous_token", "induction", "duplicate_token", "first_token"]
Ablation = Literal["zero", "mean", "resample"]
Direction = Literal["noising", "denoising"]
Replacement = Literal["resample", "mean", "zero"]
Metric = Literal["logprob", "logit_diff"]
Processing = Literal["folded", "raw"]
Corruption = Literal["first_half", "second_half", "both"]
Normalization = Literal["corrupted", "baseline"]
