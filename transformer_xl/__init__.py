"""Transformer-XL (Dai et al., 2019) in JAX/Flax.

Modules, one role each (flax examples/lm1b layout); the README's "Layout"
section lists them all.  The model: ``models.py`` (ModelConfig, the memory
path of Sec. 3.2 in one place, the layer stack), ``attention.py`` (the
attention types, Sec. 3.3 and Appendix B), ``adaptive.py`` (adaptive input
and softmax).  Around it: ``data/`` (corpora and batch iterators),
``train_state.py`` and ``train.py`` (training), ``evaluate.py`` (evaluation
and scoring), ``generate.py`` (sampling with the cached memory),
``language_model.py`` (``LanguageModel``: load a workdir, generate and score
text), ``default_config.py`` (config schema and validation),
``workdir.py``, ``checkpointing.py``, ``metrics.py``, ``sharding.py``,
``distributed.py``, ``presets.py``, ``convert/`` (checkpoint converter) and
``main.py`` (the command line).
"""
