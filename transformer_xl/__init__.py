"""Transformer-XL (Dai et al., 2019) in JAX/Flax.

The package is a set of wings: ``model/`` (the network, its memory and
attention variants; imports nothing outside ``model/``), ``data/`` (corpora
and batch iterators), ``training/`` (train state and loop), ``inference/``
(evaluation, scoring, generation and the ``LanguageModel`` Python API),
``run/`` (a run's directory: checkpoints, metrics), ``cli/`` (the command
line, which nothing in the library imports), ``convert/`` (checkpoint
conversion) and ``analysis/`` (the paper's analyses); at the top,
``main.py`` (the entry point), ``default_config.py`` (the run config),
``errors.py`` (the errors a user can cause), ``sharding.py`` and
``presets.py``.  The documentation site's
"Architecture and extending" page (docs/architecture.md) gives the import
rules, the memory path and where to extend.
"""


def __getattr__(name: str):
  """``transformer_xl.LanguageModel``, imported on first use (so that
  ``import transformer_xl.model`` loads nothing outside the model)."""
  if name == "LanguageModel":
    from transformer_xl.inference.language_model import LanguageModel  # noqa: PLC0415

    return LanguageModel
  raise AttributeError(f"module 'transformer_xl' has no attribute {name!r}")
