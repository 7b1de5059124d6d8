"""Transformer-XL (Dai et al., 2019) in JAX/Flax.

Modules, one role each (flax examples/lm1b layout):
  attention.py       relative multi-head attention (Sec. 3.3, Appendix B)
  models.py          the model; the whole memory path (Sec. 3.2) is in one place
  data/              corpora as token streams (tfds builders) and the batch iterators
  sharding.py        device mesh and logical-axis rules
  train.py           optimizer, jitted train step, training loop
  evaluate.py        scoring a split with the eval settings
  checkpointing.py   orbax checkpoints (state, memory, iterator position)
  main.py            command line
"""
