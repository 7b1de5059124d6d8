"""Evaluation, scoring and generation, and the Python API.

``evaluate`` (the evaluator and scoring), ``generate`` (sampling with the
cached memory) and ``language_model`` (``LanguageModel``: load a workdir or
a released model, generate and score text).  Never imports ``training/``.
"""
