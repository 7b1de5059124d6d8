"""The registered memory variants' small test cases, shared by the conformance
suite (test_memory_conformance.py) and the tests that run every variant
through another path (test_lm_eval_model.py, test_reliability_round6.py):
each variant's ``MemoryVariant.example()`` in a small model, its run config,
parameters moved off the init, and the model's own segment-by-segment
scores (the independent computation those tests compare against)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl.model import memory, models

import memory_variants  # noqa: F401  (registers the test-only variants)
from helpers import TOY_VOCAB, tiny_config

SIZES = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=4, mem_len=4)

CASES: dict[str, dict] = {name: cls.example() for name, cls in sorted(memory.VARIANTS.items())}
CASES["tokens+compressive"] = {
    **memory.VARIANTS["compressive"].example(),
    **memory.VARIANTS["tokens"].example(),
}


def model_config(case: str, **kw) -> models.ModelConfig:
  """The small model of ``case`` (no dropout unless ``kw`` says so)."""
  fields = {**SIZES, "dropout": 0.0, "dropatt": 0.0, **CASES[case], **kw}
  return models.ModelConfig.from_dict({"n_token": TOY_VOCAB, **fields})


def run_config(case: str, **train_kw):
  """A run config of ``case``'s model (dropout 0.1), evaluated with the
  training lengths."""
  c = tiny_config(**train_kw)
  c.model.update(**{k: v for k, v in SIZES.items()})
  for key, value in CASES[case].items():
    if isinstance(value, dict):
      c.model[key].update(value)
    else:
      c.model[key] = value
  c.eval.update(tgt_len=4, mem_len=4, clamp_len=0, same_length=False, global_batch=4)
  return c


def params_of(cfg: models.ModelConfig, seed: int = 0):
  """Initial parameters moved away from the init (N(0, 0.2) added): a gate
  at 0, a zero bias or tied initial tokens would hide a mistake."""
  params = nn.unbox(models.init_params(models.TransformerXL(cfg), jax.random.PRNGKey(seed)))
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda x: x + jnp.asarray(0.2 * rng.normal(size=x.shape), x.dtype), params
  )


def model_scores(cfg, params, tokens_BxT1, reset_at: dict | None = None):
  """NLL [B, T] of streams, segment by segment through ``model.apply`` on one
  device (``reset_at``: segment -> bool [B] rows reset before it)."""
  model = models.TransformerXL(cfg)
  mem = memory.init_memory(cfg, tokens_BxT1.shape[0])
  t, out = cfg.tgt_len, []
  for s in range((tokens_BxT1.shape[1] - 1) // t):
    x, y = tokens_BxT1[:, s * t : (s + 1) * t], tokens_BxT1[:, s * t + 1 : (s + 1) * t + 1]
    reset = None if reset_at is None or s not in reset_at else jnp.asarray(reset_at[s])
    nll, mem = model.apply({"params": params}, x, mem, y, reset_B=reset)
    out.append(np.asarray(nll))
  return np.concatenate(out, axis=1), mem


def _tokens(b: int, n_seg: int, seed: int = 1) -> np.ndarray:
  return (
      np.random.default_rng(seed).integers(0, TOY_VOCAB, size=(b, 4 * n_seg + 1)).astype(np.int32)
  )
