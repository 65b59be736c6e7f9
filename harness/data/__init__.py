"""Prompts, end to end: the settings of every data source (`settings`, `text_settings`: torch-free,
read by the hypothesis format), the registry of sources and their builders (`sources`), the
repeated-tokens generator and prompt files (`dataset`: the clean and corrupted token ids, scored
positions and answers every run reads), templates and text prompts (`templates`, `text`), and the
examples the evidence shows (`examples`).  The explore/test split is a property of a source
(`sources.has_splits`, `sources.on_split`).
"""
