"""The evaluator's two methods: segments with memory and the vanilla sliding window."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, sharding
from transformer_xl.inference import evaluate
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

from helpers import EVAL_VOCAB, eval_setup

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")


def _corpus(n=61, seed=0):
  stream = np.random.default_rng(seed).integers(1, EVAL_VOCAB, size=n).astype(np.int32)
  return (
      data.Corpus(
          name="toy",
          unit="word",
          vocab=[str(i) for i in range(EVAL_VOCAB)],
          boundary_id=0,
          splits={"valid": data.ArraySource(stream)},
      ),
      stream,
  )


def _direct_nll(mcfg, params, s, a, z, j):
  """-log p(s[j + 1] | ...) from one forward pass over exactly the inputs
  s[a:z] (targets s[a + 1:z + 1]), no memory, no padding."""
  cfg = dataclasses.replace(
      mcfg, tgt_len=z - a, mem_len=0, same_length=False, max_klen=mcfg.pos_table_len
  )
  model = models.TransformerXL(cfg)
  nll, _ = model.apply(
      {"params": params},
      jnp.asarray(s[None, a:z], jnp.int32),
      memory_lib.init_memory(cfg, 1),
      jnp.asarray(s[None, a + 1 : z + 1], jnp.int32),
  )
  return float(nll[0, j - a])


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_sliding_window_scores_each_token_from_exactly_its_previous_window(attn_type):
  window = 5
  config, mcfg, params = eval_setup(attn_type, method="sliding", window=window, stride=1)
  corpus, stream = _corpus()
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  ev = evaluate.Evaluator(config, mcfg, corpus, mesh)
  nll = ev.token_nll(params, "valid")
  assert nll.shape == (len(stream),) and not np.any(np.isnan(nll))  # every token, once
  s = np.concatenate([[corpus.boundary_id], stream])  # pair j: input s[j], target s[j + 1]
  for j in (0, 1, 3, 4, 5, 17, len(stream) - 1):  # short windows at the start, then full ones
    want = _direct_nll(mcfg, params, s, max(0, j - window + 1), j + 1, j)
    assert nll[j] == pytest.approx(want, rel=2e-5, abs=2e-5), j
  res = ev.evaluate(params, "valid")
  assert res["tokens"] == len(stream)
  assert res["loss_nats"] == pytest.approx(float(np.mean(nll, dtype=np.float64)), rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 2])
def test_sliding_window_with_a_stride(attn_type):
  window, stride = 6, 4
  config, mcfg, params = eval_setup(attn_type, method="sliding", window=window, stride=stride)
  corpus, stream = _corpus(n=23)
  ev = evaluate.Evaluator(config, mcfg, corpus, sharding.make_mesh((4, 2), ("data", "model")))
  nll = ev.token_nll(params, "valid")
  s = np.concatenate([[corpus.boundary_id], stream])
  for j in range(len(stream)):
    k = j // stride  # the window that scores j: pairs [(k + 1) * stride - window, (k + 1) * stride)
    a, z = max(0, (k + 1) * stride - window), min((k + 1) * stride, len(stream))
    want = _direct_nll(mcfg, params, s, a, z, j)  # the reference's (shorter) window at the start
    assert nll[j] == pytest.approx(want, rel=2e-5, abs=2e-5), j


@pytest.mark.parametrize("attn_type", [0, pytest.param(3, marks=SLOW)])
def test_segments_without_memory_equal_sliding_windows_of_the_same_context(attn_type):
  """mem_len 0, window == stride == tgt_len: the same forward passes (a split
  of whole segments: a last, shorter segment is padded at its end by the
  segment iterator, which moves the absolute positions of type 2 and 3)."""
  config, mcfg, params = eval_setup(attn_type, mem_len=0, tgt_len=6, global_batch=1)
  corpus, _ = _corpus(n=42)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  segments = evaluate.Evaluator(config, mcfg, corpus, mesh).token_nll(params, "valid")
  config.eval.update(method="sliding", window=6, stride=6)
  sliding = evaluate.Evaluator(config, mcfg, corpus, mesh).token_nll(params, "valid")
  np.testing.assert_allclose(sliding, segments, rtol=1e-5, atol=1e-6)


def test_segment_token_nll_is_in_stream_order():
  """token_nll of the segment method puts every NLL at its token: with one row
  and a memory longer than the split, every token sees its whole history,
  as in sliding windows longer than the split; its mean is evaluate()'s."""
  config, mcfg, params = eval_setup(0, mem_len=48, tgt_len=6, global_batch=1)
  corpus, stream = _corpus(n=40)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  one_row = evaluate.Evaluator(config, mcfg, corpus, mesh).token_nll(params, "valid")
  res = evaluate.Evaluator(config, mcfg, corpus, mesh).evaluate(params, "valid")
  assert res["loss_nats"] == pytest.approx(float(np.mean(one_row, dtype=np.float64)), rel=1e-6)
  # Sliding windows as long as the stream: every token sees its whole history too.
  config.eval.update(method="sliding", window=41, stride=1, global_batch=8)
  full = evaluate.Evaluator(config, mcfg, corpus, mesh).token_nll(params, "valid")
  np.testing.assert_allclose(one_row, full, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_eval_settings_differing_from_training_are_used():
  """An evaluator whose eval lengths differ from training's equals a model
  built with them directly (guards the eval_model_config override)."""
  config, mcfg, params = eval_setup(0, mem_len=6, tgt_len=6, global_batch=1)
  config.eval.update(tgt_len=4, mem_len=9, clamp_len=3, same_length=True)
  corpus, stream = _corpus(n=20)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  got = evaluate.Evaluator(config, mcfg, corpus, mesh).token_nll(params, "valid")
  cfg = dataclasses.replace(mcfg, tgt_len=4, mem_len=9, clamp_len=3, same_length=True)
  model = models.TransformerXL(cfg)
  s = np.concatenate([[0], stream, [0, 0, 0, 0]])
  memory, want = memory_lib.init_memory(cfg, 1), []
  for a in range(0, 20, 4):
    nll, memory = model.apply(
        {"params": params},
        jnp.asarray(s[None, a : a + 4]),
        memory,
        jnp.asarray(s[None, a + 1 : a + 5]),
    )
    want.append(np.asarray(nll[0]))
  np.testing.assert_allclose(got, np.concatenate(want)[:20], rtol=1e-5, atol=1e-6)
