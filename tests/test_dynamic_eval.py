"""Dynamic evaluation (Krause et al. 2019) against a naive per-segment loop.

The naive loop runs the model unjitted, one segment at a time, takes the
gradient of the segment's mean NLL with ``jax.grad`` and applies the
authors' update (``dynamic_eval_opt.py``) in numpy: the fused, jitted,
donated step of ``inference/dynamic_eval.py`` must give the same scores,
statistics and parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, errors, sharding
from transformer_xl.inference import dynamic_eval, evaluate
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

from helpers import EVAL_VOCAB, eval_setup

MESH = None


def _mesh():
  global MESH
  if MESH is None:
    MESH = sharding.make_mesh((4, 2), ("data", "model"))  # rows padded, parameters split
  return MESH


def _stream(n, seed=0, period=0):
  """n token ids in [1, EVAL_VOCAB); with ``period`` a random pattern repeated."""
  rng = np.random.default_rng(seed)
  if period:
    return np.tile(rng.integers(1, EVAL_VOCAB, size=period), -(-n // period))[:n].astype(np.int32)
  return rng.integers(1, EVAL_VOCAB, size=n).astype(np.int32)


def _evaluator(attn_type, **eval_kw):
  config, mcfg, params = eval_setup(attn_type, mem_len=6, tgt_len=5, **eval_kw)
  corpus = data.Corpus(
      name="toy",
      unit="word",
      vocab=[str(i) for i in range(EVAL_VOCAB)],
      boundary_id=0,
      splits={
          "train": data.ArraySource(_stream(400, seed=1)),
          "valid": data.ArraySource(_stream(97, seed=2)),
      },
  )
  return evaluate.Evaluator(config, mcfg, corpus, _mesh()), params


def _naive(ev, params, tokens_BxT1, settings, ss=None, stats=False):
  """The reference loop: per segment score, gradient of the mean NLL over the
  real tokens (one jitted function of the plain model), then the rule (numpy,
  float32).  Returns (nll [B, T],
  params, m, ss) as numpy trees."""
  cfg, seg = ev.cfg, ev.cfg.tgt_len
  model = models.TransformerXL(cfg)
  b, t1 = tokens_BxT1.shape
  t = t1 - 1
  leaves, treedef = jax.tree.flatten(params)
  p = [np.asarray(x, np.float32) for x in leaves]
  m = [np.zeros_like(x) for x in p]
  ss = [np.zeros_like(x) for x in p] if ss is None else [np.asarray(x) for x in jax.tree.leaves(ss)]
  memory = memory_lib.init_memory(cfg, b)
  out = []

  def loss(leaves_, memory, inp, tgt, w):
    nll, new_memory = model.apply(
        {"params": jax.tree.unflatten(treedef, leaves_)}, inp, memory, tgt, deterministic=True
    )
    return jnp.sum(nll * w) / w.sum(), (nll, new_memory)

  # One segment's score and gradient, compiled once (eager flax calls take far longer).
  loss_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
  for s in range(0, t, seg):
    n = min(seg, t - s)
    inp = np.zeros((b, seg), np.int32)
    tgt = np.zeros((b, seg), np.int32)
    inp[:, :n], tgt[:, :n] = tokens_BxT1[:, s : s + n], tokens_BxT1[:, s + 1 : s + n + 1]
    w = np.zeros((b, seg), np.float32)
    w[:, :n] = 1.0
    (_, (nll, memory)), g = loss_and_grad([jnp.asarray(x) for x in p], memory, inp, tgt, w)
    out.append(np.asarray(nll)[:, :n])
    g = [np.asarray(x, np.float32) for x in g]
    if stats:
      ss = [a + x * x for a, x in zip(ss, g)]
    elif settings.rule == "sgd":
      p = [a - np.float32(settings.lr) * x for a, x in zip(p, g)]
    else:
      for i, (gi, si) in enumerate(zip(g, ss)):
        root = np.sqrt(si)
        update = settings.lr / (root + settings.eps) * gi + settings.decay * root * m[i]
        m[i] = m[i] - update
        p[i] = p[i] - update
  return np.concatenate(out, axis=1), p, m, ss


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("attn_type", [0, 1])
def test_the_fused_step_equals_the_naive_loop(attn_type):
  """Statistics, scores and adapted parameters of the "rms" rule, with
  same_length and clamp_len, two rows sharing one update, a last segment
  padded: equal to the naive loop to 1e-6 (float32)."""
  ev, params = _evaluator(attn_type, same_length=True, clamp_len=4)
  # eps bounds the step of a parameter the statistics barely moved (lr / eps x g), so
  # float32 rounding is not amplified beyond the tolerance.
  settings = dynamic_eval.DynamicSettings(lr=2e-4, decay=0.5, eps=1e-3)
  dyn = dynamic_eval.DynamicEvaluator(ev, settings)
  stats_tokens = np.stack([_stream(24, seed=3), _stream(24, seed=4)])  # [2, 24]: 5 segments
  ss, n = dyn.statistics_of_tokens(params, stats_tokens)
  assert n == 2 * 23
  _, _, _, ss_naive = _naive(ev, params, stats_tokens, settings, stats=True)
  for a, b in zip(_leaves(ss), ss_naive):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
  assert max(float(np.max(x)) for x in ss_naive) > 0

  tokens = np.stack([_stream(29, seed=5), _stream(29, seed=6)])  # 28 scored: 6 segments
  nll, state = dyn.score_and_state(params, tokens, ss)
  nll_naive, p_naive, m_naive, _ = _naive(ev, params, tokens, settings, ss=ss)
  np.testing.assert_allclose(nll, nll_naive, atol=1e-6, rtol=0)
  for a, b in zip(_leaves(state.params), p_naive):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  for a, b in zip(_leaves(state.m), m_naive):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  # The parameters moved, and the later segments were scored by moved parameters.
  moved = max(
      float(np.max(np.abs(a - np.asarray(b)))) for a, b in zip(p_naive, jax.tree.leaves(params))
  )
  assert moved > 1e-4
  static = ev.score(params, tokens)
  first = np.abs(nll[:, :5] - static[:, :5])  # the first segment: scored as loaded
  assert np.all(first <= 2 * np.spacing(np.abs(static[:, :5])))
  assert np.max(np.abs(nll[:, 5:] - static[:, 5:])) > 1e-5


def test_sgd_equals_the_naive_loop():
  ev, params = _evaluator(0, same_length=True, clamp_len=0)
  settings = dynamic_eval.DynamicSettings(rule="sgd", lr=0.05, decay=0.0)
  dyn = dynamic_eval.DynamicEvaluator(ev, settings)
  tokens = _stream(23, seed=7)[None, :]
  nll, state = dyn.score_and_state(params, tokens, None)
  nll_naive, p_naive, _, _ = _naive(ev, params, tokens, settings)
  np.testing.assert_allclose(nll, nll_naive, atol=1e-6, rtol=0)
  for a, b in zip(_leaves(state.params), p_naive):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("attn_type", [0, 1])
def test_lr_0_is_static_evaluation(attn_type):
  """lr = 0: every token's NLL within 2 ulp of static evaluation's (float32
  rounding: the forward pass is compiled together with its gradient), the
  split's mean to 1e-7; the loaded parameters are left as they were."""
  ev, params = _evaluator(attn_type, same_length=True, clamp_len=4)
  before = [np.array(x) for x in jax.tree.leaves(params)]
  dyn = dynamic_eval.DynamicEvaluator(ev, dynamic_eval.DynamicSettings(lr=0.0, eps=1e-5))
  ss, _ = dyn.statistics_of_split(params, "train")
  for rows in (1, 3):
    static = ev.evaluate(params, "valid", num_rows=rows)
    dynamic = dyn.evaluate(params, "valid", ss) if rows == 1 else None
    if dynamic is None:
      dyn3 = dynamic_eval.DynamicEvaluator(
          ev, dynamic_eval.DynamicSettings(lr=0.0, eps=1e-5, global_batch=3)
      )
      dynamic = dyn3.evaluate(params, "valid", ss)
    assert dynamic["tokens"] == static["tokens"] == 97
    assert abs(dynamic["loss_nats"] - static["loss_nats"]) < 1e-7
  tokens = np.stack([_stream(40, seed=8), _stream(40, seed=9)])
  d, s = dyn.score(params, tokens, ss), ev.score(params, tokens)
  assert np.all(np.abs(d - s) <= 2 * np.spacing(np.abs(s)))
  for a, b in zip(jax.tree.leaves(params), before):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_dynamic_evaluation_learns_a_repeated_pattern():
  """A random 13-token pattern repeated: static evaluation cannot predict it
  beyond the memory; dynamic evaluation lowers the loss of the later
  repetitions (the property the method exists for)."""
  ev, params = _evaluator(0, same_length=True, clamp_len=0)
  tokens = _stream(301, seed=10, period=13)[None, :]
  static = ev.score(params, tokens)
  dyn = dynamic_eval.DynamicEvaluator(ev, dynamic_eval.DynamicSettings(rule="sgd", lr=0.5, decay=0))
  dynamic = dyn.score(params, tokens, None)
  assert dynamic[:, 150:].mean() < static[:, 150:].mean() - 0.5


def test_statistics_of_the_split_read_the_reference_share():
  """stats_tokens=-1: 1/5000 of the training split at least one segment;
  otherwise stats_tokens // (rows x tgt_len) segments."""
  s = dynamic_eval.DynamicSettings(lr=1e-3)
  assert s.stats_steps(103_227_021, 128) == 103_227_021 // 128 // 5000 == 161
  assert s.stats_steps(400, 5) == 1
  s = dynamic_eval.DynamicSettings(lr=1e-3, stats_tokens=60, global_batch=2)
  assert s.stats_steps(400, 5) == 6
  ev, params = _evaluator(0)
  dyn = dynamic_eval.DynamicEvaluator(ev, s)
  _, n = dyn.statistics_of_split(params, "train")
  assert n == 60


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("lr", -1e-3, "eval.dynamic.lr=-0.001 must be finite and >= 0"),
        ("lr", float("inf"), "eval.dynamic.lr=inf"),
        ("eps", 0.0, "eval.dynamic.eps=0.0 must be finite and > 0"),
        ("decay", float("nan"), "eval.dynamic.decay=nan"),
        ("rule", "adam", "eval.dynamic.rule='adam'"),
        ("stats_tokens", 0, "eval.dynamic.stats_tokens=0"),
        ("global_batch", 0, "eval.dynamic.global_batch=0"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(key, value, words):
  config = default_config.get_config()
  config.eval.dynamic[key] = value
  with pytest.raises(errors.ConfigError, match="Invalid config") as err:
    default_config.validate(config, 1)
  assert words in str(err.value)


def test_dynamic_evaluation_needs_segments():
  config = default_config.get_config()
  config.eval.dynamic.lr = 1e-5
  config.eval.method = "sliding"
  with pytest.raises(errors.ConfigError, match="needs eval.method='segments'"):
    default_config.validate(config, 1)
  config.eval.dynamic.lr = 0.0
  default_config.validate(config, 1)  # off: any method


@pytest.mark.parametrize("factor, grows", [(2.5, True), (1.5, False)])
def test_the_pull_back_diverges_above_a_factor_of_2(factor, grows):
  """decay * sqrt(ss) is what one update takes back of m = params - loaded: m
  becomes (1 - factor) m, so |m| grows above 2 (the warning's threshold,
  ``pull_back_factor``) and shrinks below it."""
  ss = {"w": jnp.asarray([0.0, 0.04])}  # sqrt: 0, 0.2
  settings = dynamic_eval.DynamicSettings(lr=1e-2, decay=factor / 0.2, eps=1e-3)
  assert dynamic_eval.pull_back_factor(settings, ss) == pytest.approx(factor)
  state = dynamic_eval.DynamicState(params={"w": jnp.zeros(2)}, m={"w": jnp.zeros(2)}, ss=ss)
  state = dynamic_eval.rms_update(settings, state, {"w": jnp.ones(2)})  # one step away
  first = abs(float(state.m["w"][1]))
  for _ in range(10):  # then no gradient: only the pull back acts
    state = dynamic_eval.rms_update(settings, state, {"w": jnp.zeros(2)})
  last = abs(float(state.m["w"][1]))
  assert (last > 10 * first) if grows else (last < first)
  assert float(state.m["w"][0]) == pytest.approx(-1e-2 / 1e-3)  # ss = 0: no pull back
