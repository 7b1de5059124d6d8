"""Evaluation, scoring and generation, and the Python API.

``eval_steps`` (the evaluation model and its jitted steps), ``evaluate``
(the ``Evaluator``: a split, token streams, a synthetic task's answers
with ``greedy_answers``), ``dynamic_eval`` (dynamic evaluation),
``generate`` (the ``Generator``: sampling with the cached memory) and
``sampling`` (the sampling rule), ``trained_model`` (a trained model with
the config's free settings, and its corpus), ``text_scores`` (a text's
tokens and scores) and ``language_model`` (``LanguageModel``: load a
workdir or a released model, generate and score text).  Reaches nothing
of ``training/`` and no optax (tests/test_layout.py).
"""
