"""Transformer-XL (Dai et al., 2019) in JAX/Flax.

Modules, one role each (flax examples/lm1b layout; the README's "Layout"
lists them and the documentation site has an API page per module).  The
model: ``models.py`` (the memory path of Sec. 3.2 in one place, the layer
stack), ``attention.py`` (the attention variants, each owning its
positional scheme; Sec. 3.3), ``attention_ops.py`` (what they share:
Appendix B's shift, masks, projections, the blockwise softmax),
``adaptive.py`` (adaptive input and softmax), ``tuning.py`` (how the same model is computed: remat, attention
blocks, scan unroll).  Around it: ``default_config.py`` (the config schema,
``ModelConfig`` and all validation), ``data/`` (corpora and batch
iterators), ``train_state.py`` and ``train.py`` (training), ``evaluate.py``
(evaluation and scoring), ``generate.py`` (sampling with the cached memory),
``language_model.py`` (``LanguageModel``, the Python API: load a workdir,
generate and score text), ``workdir.py``, ``checkpointing.py``,
``metrics.py``, ``sharding.py``, ``distributed.py``, ``presets.py``,
``analysis/`` (the paper's analyses) and ``convert/`` (checkpoint
converter).  The command line is apart: ``main.py`` (flags) calls
``cli.py`` (the modes), with ``user_errors.py`` (one error line) and
``process_settings.py``, the only module that changes process-wide state
(logging filters, signal handlers, the huge-page restart), called by the
entry points alone.
"""
