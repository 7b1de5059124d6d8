"""Tests that guard what a user trains: each catches a realistic one-line bug
that the rest of the suite let through (dropout masks, gradient scale under
accumulation, clipping, warmup, bf16 attention scores and masking, the
evaluator's own segment settings)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.inference import evaluate
from transformer_xl.model import attention, attention_ops, models
from transformer_xl.model import memory as memory_lib
from transformer_xl.training import train_state, train_step

from helpers import tiny_config

ONE_DEVICE = dict(devices=jax.devices()[:1])


def _setup(config, mesh, n_token=64):
  mcfg = default_config.model_config(config, n_token)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, config.train.global_batch, mesh)
  return mcfg, model, tx, shardings


def _batch(config, mesh, tokens, n=1):
  it = data.TrainIterator(data.ArraySource(tokens), config.train.global_batch, config.model.tgt_len)
  return [
      data.to_global_batch(next(it), sharding.batch_sharding(mesh), config.train.global_batch)
      for _ in range(n)
  ]


@pytest.mark.slow
def test_dropout_masks_change_with_the_step():
  """The same state and batch at two different steps draw different dropout
  masks (the dropout key is folded with the step), and the same step draws
  the same masks again (a resumed run repeats them)."""
  mesh = sharding.make_mesh((1, 1), ("data", "model"), **ONE_DEVICE)
  tokens = np.random.default_rng(0).integers(0, 64, size=8 * 6 * 2 + 8).astype(np.int32)

  def losses(config, steps):
    _, model, tx, shardings = _setup(config, mesh)
    state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
    step_fn = train_step.make_train_step(model, tx, mesh, shardings, 1, dropout_seed=7)
    (batch,) = _batch(config, mesh, tokens)
    out = []
    for step in steps:  # a copy each time: the step donates its input state
      at_step = jax.tree_util.tree_map(jnp.copy, state).replace(step=jnp.asarray(step, jnp.int32))
      out.append(float(step_fn(at_step, batch)[1]["loss"]))
    return out

  config = tiny_config()  # dropout = dropatt = 0.1
  at0, at0_again, at1 = losses(config, [0, 0, 1])
  assert at0 == at0_again
  assert at0 != at1, "the same dropout masks at steps 0 and 1"
  config.model.update(dropout=0.0, dropatt=0.0)  # without dropout the step does not matter
  no_dropout = losses(config, [0, 1])
  assert no_dropout[0] == no_dropout[1]


@pytest.mark.slow
def test_grad_norm_is_the_same_with_gradient_accumulation():
  """batch_chunk splits the batch into micro-batches: the gradient (seen
  through its norm, before clipping and Adam hide its scale) is the same.
  Two devices: with 8 simulated ones XLA's CPU collectives aborted this
  process under a loaded full suite (a worker crash, twice in a row once)."""
  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  tokens = np.random.default_rng(1).integers(0, 64, size=16 * 6 * 3 + 16).astype(np.int32)
  norms = {}
  for chunk in (1, 2):
    config = tiny_config(global_batch=16, batch_chunk=chunk)
    config.model.update(dropout=0.0, dropatt=0.0)
    _, model, tx, shardings = _setup(config, mesh)
    state = train_state.create_train_state(model, tx, 16, mesh, jax.random.PRNGKey(0), shardings)
    step_fn = train_step.make_train_step(model, tx, mesh, shardings, chunk, 7)
    norms[chunk] = []
    for batch in _batch(config, mesh, tokens, n=3):
      state, metrics = step_fn(state, batch)
      norms[chunk].append(float(metrics["grad_norm"]))
  assert all(n > 0 for n in norms[1])
  np.testing.assert_allclose(norms[2], norms[1], rtol=1e-5)


# --------------------------------------------------------------------------- #
# The optimizer and its schedule, against a reference written out here.


def _reference_lr(t, lr, min_lr, warmup, num_steps):
  """Linear warmup 0 -> lr over `warmup` steps, then cosine lr -> min_lr over
  the remaining num_steps - warmup steps (train_state.learning_rate_schedule)."""
  if t < warmup:
    return lr * t / warmup
  frac = min(1.0, (t - warmup) / (num_steps - warmup))
  return min_lr + (lr - min_lr) * 0.5 * (1 + np.cos(np.pi * frac))


def test_learning_rate_schedule():
  cfg = tiny_config(learning_rate=1e-2, min_lr=1e-3, warmup_steps=4, num_steps=20).train
  schedule = train_state.learning_rate_schedule(cfg)
  got = [float(schedule(t)) for t in range(22)]
  want = [_reference_lr(t, 1e-2, 1e-3, 4, 20) for t in range(22)]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
  assert got[0] == 0.0 and got[4] == pytest.approx(1e-2) and got[20] == pytest.approx(1e-3)
  no_warmup = train_state.learning_rate_schedule(tiny_config(warmup_steps=0, num_steps=20).train)
  assert float(no_warmup(0)) == pytest.approx(1e-3)  # tiny_config's learning rate, at once


def test_optimizer_is_global_norm_clipping_then_adam_on_the_schedule():
  """Six steps of make_optimizer against clip-by-global-norm + Adam (bias
  corrected, eps outside the square root) written out in float64, with
  gradient norms above and below the clip."""
  cfg = tiny_config(
      learning_rate=1e-2,
      min_lr=1e-3,
      warmup_steps=3,
      num_steps=6,
      clip=0.25,
      adam_b1=0.9,
      adam_b2=0.999,
      adam_eps=1e-8,
  ).train
  tx = train_state.make_optimizer(cfg)
  rng = np.random.default_rng(0)
  params = {
      "a": rng.normal(size=(3,)).astype(np.float32),
      "b": rng.normal(size=(2, 2)).astype(np.float32),
  }
  opt_state = tx.init(jax.tree_util.tree_map(jnp.asarray, params))
  ref_p = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in ref_p.items()}
  v2 = {k: np.zeros_like(v) for k, v in ref_p.items()}
  p = jax.tree_util.tree_map(jnp.asarray, params)
  for t, norm in enumerate([10.0, 0.1, 5.0, 0.2, 3.0, 0.01]):
    g = {k: rng.normal(size=x.shape) for k, x in params.items()}
    scale = norm / np.sqrt(sum(np.sum(x**2) for x in g.values()))
    g = {k: (x * scale).astype(np.float32) for k, x in g.items()}
    updates, opt_state = tx.update(jax.tree_util.tree_map(jnp.asarray, g), opt_state, p)
    p = jax.tree_util.tree_map(lambda a, u: a + u, p, updates)
    # Reference.
    gn = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))
    clip = min(1.0, 0.25 / gn)
    lr = _reference_lr(t, 1e-2, 1e-3, 3, 6)
    for k in ref_p:
      gk = g[k].astype(np.float64) * clip
      m[k] = 0.9 * m[k] + 0.1 * gk
      v2[k] = 0.999 * v2[k] + 0.001 * gk**2
      m_hat, v_hat = m[k] / (1 - 0.9 ** (t + 1)), v2[k] / (1 - 0.999 ** (t + 1))
      ref_p[k] = ref_p[k] - lr * m_hat / (np.sqrt(v_hat) + 1e-8)
    for k in ref_p:
      np.testing.assert_allclose(
          np.asarray(p[k], np.float64), ref_p[k], rtol=1e-5, atol=1e-7, err_msg=f"step {t}, {k}"
      )
  # Step 0 has learning rate 0 (warmup): the first update changed nothing.
  # (Checked by the reference above; the parameters did move later.)
  assert not np.allclose(np.asarray(p["a"]), params["a"])


# --------------------------------------------------------------------------- #
# bf16 attention scores.


def _exact_attention_params(d_head):
  """Integer weights, exact in bfloat16, for the 2-wide inputs x_j = (1, delta_j):
  q = (64, ..., 64, 4), k_j = (-40, ..., -40, delta_j), v_j = (delta_j, 0, ...),
  W_kR = 0, output = vec[0] in column 0.  Score_j = (-161280 + 4 delta_j) / 8
  (d_head = 64): about -20160, with differences of 0.5 delta_j that only an
  exact (float32-accumulated) dot product keeps."""
  qkv = np.zeros((2, 3, 1, d_head), np.float32)
  qkv[0, 0, 0, :-1], qkv[0, 0, 0, -1] = 64.0, 4.0  # q from x_0 = 1
  qkv[0, 1, 0, :-1], qkv[1, 1, 0, -1] = -40.0, 1.0  # k: -40s and delta_j
  qkv[1, 2, 0, 0] = 1.0  # v_j[0] = delta_j
  o_net = np.zeros((1, d_head, 2), np.float32)
  o_net[0, 0, 0] = 1.0
  return {
      "qkv_net": {"kernel": qkv},
      "r_net": {"kernel": np.zeros((2, 1, d_head), np.float32)},
      "o_net": {"kernel": o_net},
  }


def test_bf16_attention_scores_are_float32_and_masked_keys_get_no_weight():
  """bfloat16 attention against an exact float64 softmax attention.  The
  scores are large (about -2e4) and differ by 0.5: summed in bfloat16 they
  lose those differences (and their magnitude), and a mask value of -1e4
  would let the masked keys (empty memory slots, future positions) take
  over.  Exact products of bf16 inputs summed in float32 keep the output
  within bfloat16 rounding of the exact one."""
  d_head, t, m = 64, 4, 6
  delta = np.array([3, 3, 0, 1, 2, 3, 1, 0, 2, 3], np.float32)  # K = m + t keys
  x_BxKxD = jnp.asarray(np.stack([np.ones_like(delta), delta], -1)[None])
  mlen = np.array([4])  # memory slots 0 and 1 are empty
  mask = attention_ops.attention_mask(t, m, jnp.asarray(mlen), same_length=False)
  pos = attention_ops.sinusoid_pos_emb(m + t, 2)
  zeros = jnp.zeros((1, d_head))
  params = _exact_attention_params(d_head)
  module = attention.RelPartialLearnableAttention(
      n_head=1, d_head=d_head, d_model=2, dtype=jnp.bfloat16
  )
  out = np.asarray(
      module.apply(
          {"params": params},
          x_BxKxD[:, -t:],
          x_BxKxD[:, :m],
          x_BxKxD[:, -t:],
          (pos, zeros, zeros),
          mask,
      ),
      np.float64,
  )[0, :, 0]
  # Exact: softmax over the allowed keys of score_j = (-161280 + 4 delta_j) / 8.
  score = (63 * 64 * -40.0 + 4.0 * delta) / 8.0
  allowed = np.asarray(mask)[0, 0]
  want = []
  for i in range(t):
    s = np.where(allowed[i], score, -np.inf)
    p = np.exp(s - s.max())
    want.append(float(np.sum(p / p.sum() * delta)))
  np.testing.assert_allclose(out, want, rtol=0, atol=0.03)
  # The differences matter: uniform weights over the allowed keys are far off.
  uniform = [float(np.mean(delta[allowed[i]])) for i in range(t)]
  assert np.max(np.abs(np.asarray(uniform) - want)) > 0.2


# --------------------------------------------------------------------------- #
# The evaluator's own segment settings.


def test_evaluator_uses_the_eval_segment_settings():
  """Training with mem_len 6, no clamp, not same_length; evaluating with
  tgt_len 5, mem_len 9, clamp_len 3, same_length: the evaluator's per-token
  NLL equals that of a model built with the eval settings directly."""
  config = tiny_config()
  config.model.update(same_length=False, clamp_len=0, mem_len=6, tgt_len=6, init_std=0.5)
  config.eval.update(tgt_len=5, mem_len=9, clamp_len=3, same_length=True, global_batch=1)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), **ONE_DEVICE)
  mcfg, model, tx, shardings = _setup(config, mesh)
  state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(3), shardings)
  params = state.params
  stream = np.random.default_rng(4).integers(0, 64, size=1 + 5 * 6).astype(np.int32)
  nll = evaluate.Evaluator(config, mcfg, None, mesh).score(params, stream[None])

  def direct(cfg):
    apply = jax.jit(
        lambda x, mem, y: models.TransformerXL(cfg).apply(
            {"params": params}, x, mem, y, deterministic=True
        )
    )
    memory, out = memory_lib.init_memory(cfg, 1), []
    for s in range(0, 30, 5):
      nll_s, memory = apply(stream[None, s : s + 5], memory, stream[None, s + 1 : s + 6])
      out.append(np.asarray(nll_s))
    return np.concatenate(out, axis=1)

  eval_cfg = dataclasses.replace(
      mcfg, tgt_len=5, mem_len=9, clamp_len=3, same_length=True, dropout=0.0, dropatt=0.0
  )
  np.testing.assert_allclose(nll, direct(eval_cfg), rtol=1e-5, atol=1e-6)
  # Each override matters on this stream (else the test could not fail).
  for change in (dict(clamp_len=0), dict(same_length=False)):
    assert not np.allclose(direct(dataclasses.replace(eval_cfg, **change)), nll, atol=1e-4), change
