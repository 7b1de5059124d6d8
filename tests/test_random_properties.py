"""The random parts of training and sampling, and the thresholds around them.

Each section asserts a property that a realistic one-line bug broke without
the rest of the suite noticing:

1. attention dropout (dropatt, ``attention_ops.attend``): the rate, the
   1/keep rescaling, masks independent across query rows, heads, batch rows
   and query blocks;
2. every ``nn.Dropout`` of the model (embeddings, positions, attention
   output, both feed-forward ones, the final hidden states): the rate, the
   1/keep rescaling, masks independent across rows, positions, features,
   layers and calls;
3. the train step's dropout keys: independent across gradient-accumulation
   micro-batches and across steps;
4. generation: each generated token has its own key, fold_in(seed, i);
5. the non-finite guard of the train step checks the updated parameters;
6. the logged ``train/learning_rate`` is the rate applied at that step;
7. RECL's walk goes on when the gain equals the threshold exactly.

Statistical checks (the ``assert_*`` helpers below) use fixed seeds and a
bound of SIGMAS = 6 standard errors, so that a correct implementation
would fail one with a probability below ~1e-7 on another seed: rates and
pair counts are means of >= 1000 Bernoulli entries (binomial standard
error, normal tail 2e-9), means over dropout keys use >= 64 independent
keys (standard error estimated from them, Student t tail with 63 degrees
of freedom ~1e-7).  Each helper first asserts that its bound is tight
enough to reject the bug it is there for (identical masks, a missing
1/keep), so that it cannot pass by chance.
"""

import functools
import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.analysis import relative_gain as rg
from transformer_xl.convert.names import flatten_params
from transformer_xl.inference import generate, sampling
from transformer_xl.model import attention, attention_ops, models
from transformer_xl.model import memory as memory_lib
from transformer_xl.training import train, train_state, train_step

from helpers import tiny_config, tiny_model_config

SIGMAS = 6.0  # the bound of every statistical check, in standard errors


def one_device_mesh():
  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


def random_params(init_fn, std=0.1, seed=0):
  """Parameters shaped as ``init_fn()`` makes them, drawn N(0, std) with numpy (LayerNorm
  scales 1 + N(0, std)): no initialiser is compiled (threefry compiles slowly on CPU)."""
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    x = rng.normal(0.0, std, shape.shape) + (path[-1].key == "scale")
    return np.asarray(x, shape.dtype)

  return jax.tree_util.tree_map_with_path(draw, nn.unbox(jax.eval_shape(init_fn)))


def model_params(cfg):
  """random_params of a TransformerXL of ``cfg``."""
  return random_params(
      functools.partial(models.init_params, models.TransformerXL(cfg), jax.random.PRNGKey(0))
  )


# --------------------------------------------------------------------------- #
# Statistical checks of keep masks (bool arrays, True = kept).


def assert_rate(kept, keep, what):
  """Every entry is kept with probability ``keep``: the kept fraction of the
  N entries is within SIGMAS binomial standard errors of keep."""
  kept = np.asarray(kept, bool).ravel()
  n = kept.size
  tol = SIGMAS * np.sqrt(keep * (1 - keep) / n)
  # Power: a rate off by a third of the dropout rate (e.g. 0.1 for 0.3) is rejected.
  assert n >= 1000 and tol < (1 - keep) / 3, f"{what}: too few entries ({n}) to test the rate"
  frac = kept.mean()
  assert (
      abs(frac - keep) <= tol
  ), f"{what}: kept {frac:.4f} of {n} entries, want {keep} +- {tol:.4f} ({SIGMAS:g} sigma)"


def assert_independent(kept_a, kept_b, keep, what):
  """Two masks of independent Bernoulli(keep) entries: P(both kept) =
  keep^2, within SIGMAS standard errors of the N pairs (keep for identical
  masks, which the bound must reject)."""
  a = np.asarray(kept_a, bool).ravel()
  b = np.asarray(kept_b, bool).ravel()
  assert a.shape == b.shape
  n = a.size
  p2 = keep * keep
  tol = SIGMAS * np.sqrt(p2 * (1 - p2) / n)
  assert n >= 1000 and 2 * tol < keep - p2, f"{what}: too few pairs ({n}) to test independence"
  both = np.mean(a & b)
  assert abs(both - p2) <= tol, (
      f"{what}: both kept in {both:.4f} of {n} pairs, want keep^2 = {p2:.4f} +- {tol:.4f} "
      f"(identical masks give {keep})"
  )


def split_pairs(x, axis):
  """(even, odd) slices along ``axis``: disjoint pairs of neighbours."""
  n = x.shape[axis] // 2 * 2
  x = np.take(x, np.arange(n), axis=axis)
  return np.take(x, np.arange(0, n, 2), axis=axis), np.take(x, np.arange(1, n, 2), axis=axis)


def assert_mean_is(samples_NxE, want_E, dropout, what):
  """The mean of N independent draws equals ``want_E``: a_n = <y_n, want> /
  <want, want> has mean 1 within SIGMAS standard errors (estimated from the
  N draws); a missing 1/keep (mean keep = 1 - dropout) must be rejected."""
  y = np.asarray(samples_NxE, np.float64).reshape(len(samples_NxE), -1)
  w = np.asarray(want_E, np.float64).ravel()
  a_N = y @ w / (w @ w)
  se = a_N.std(ddof=1) / np.sqrt(len(a_N))
  assert len(a_N) >= 64 and SIGMAS * se < dropout / 2, f"{what}: too few draws to test the scale"
  assert abs(a_N.mean() - 1.0) <= SIGMAS * se, (
      f"{what}: the mean over {len(a_N)} keys is {a_N.mean():.4f} x the deterministic output, "
      f"want 1 +- {SIGMAS * se:.4f} (unscaled dropout gives {1 - dropout})"
  )


# --------------------------------------------------------------------------- #
# 1. Attention dropout (dropatt): attention_ops.attend, _keep_mask.


class _ProbsProbe(nn.Module):
  """``attention_ops.attend`` with content scores q.k and one-hot values
  (v_j = e_j over the K keys): with an identity ``o_net`` its output is the
  attention probabilities after dropatt, [B, T, H * K]."""

  n_head: int
  d_head: int
  d_model: int
  dropatt: float
  deterministic: bool
  block_size: int = 0
  record: bool = False
  init_std: float = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, q_BxTxHxDh, k_BxKxHxDh, mask_Bx1xTxK):
    b, k = k_BxKxHxDh.shape[:2]
    v_BxKxHxK = jnp.broadcast_to(jnp.eye(k)[None, :, None, :], (b, k, self.n_head, k))
    score = lambda q, kk, pos: attention_ops.content_scores(q, kk)
    return attention_ops.attend(self, score, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxK, (), mask_Bx1xTxK)


@functools.cache
def _probs_fn(dropatt, block_size, b=4, h=2, t=16, m=16, dh=8):
  """key -> (probs after dropatt, probs without dropout, allowed), each
  [B, H, T, K] numpy, for fixed random queries and keys (full memory)."""
  k = m + t
  rng = np.random.default_rng(0)
  q_BxTxHxDh = jnp.asarray(rng.normal(size=(b, t, h, dh)), jnp.float32)
  k_BxKxHxDh = jnp.asarray(rng.normal(size=(b, k, h, dh)), jnp.float32)
  mask_Bx1xTxK = attention_ops.attention_mask(t, m, jnp.full((b,), m, jnp.int32), False)
  params = {"o_net": {"kernel": jnp.eye(h * k).reshape(h, k, h * k)}}

  def probs(deterministic, key):
    probe = _ProbsProbe(
        n_head=h,
        d_head=dh,
        d_model=h * k,
        dropatt=dropatt,
        deterministic=deterministic,
        block_size=block_size,
    )
    out_BxTxHK = probe.apply(
        {"params": params}, q_BxTxHxDh, k_BxKxHxDh, mask_Bx1xTxK, rngs={"dropout": key}
    )
    return jnp.transpose(out_BxTxHK.reshape(b, t, h, k), (0, 2, 1, 3))

  jitted = jax.jit(lambda key: (probs(False, key), probs(True, key)))
  allowed_BxHxTxK = np.broadcast_to(np.asarray(mask_Bx1xTxK), (b, h, t, k))

  def run(key):
    dropped, full = jax.device_get(jitted(key))
    return dropped, full, allowed_BxHxTxK

  return run


def test_dropatt_zeroes_probabilities_at_its_rate_and_rescales_the_rest_by_one_over_keep():
  """Each allowed probability is dropped with probability dropatt; a kept one is p / keep."""
  dropatt = 0.3
  keep = 1 - dropatt
  dropped, full, allowed = _probs_fn(dropatt, 0)(jax.random.PRNGKey(0))
  assert np.all(full[allowed] > 0) and np.all(dropped[~allowed] == 0)
  kept = dropped[allowed] != 0
  np.testing.assert_allclose(
      dropped[allowed][kept],
      full[allowed][kept] / keep,
      rtol=1e-6,
      err_msg="kept probabilities are not rescaled by 1 / keep",
  )
  assert_rate(kept, keep, "dropatt")


def test_dropatt_output_averaged_over_keys_equals_the_deterministic_attention():
  """The attention output of the Transformer-XL variant averaged over 256 dropout keys
  equals its output without dropout (E[mask / keep] = 1)."""
  dropatt, b, t, m = 0.3, 2, 8, 8
  cfg = tiny_model_config(n_token=16, n_layer=1, dropout=0.0, dropatt=dropatt, tgt_len=t, mem_len=m)
  make = lambda det: attention.RelPartialLearnableAttention.from_config(
      cfg, deterministic=det, record=False, block_size=0, name=None
  )
  rng = np.random.default_rng(1)
  mem_BxMxD, seg_BxTxD = (jnp.asarray(rng.normal(size=(b, n, 16)), jnp.float32) for n in (m, t))
  uv = jnp.asarray(rng.normal(size=(2, 2, 8)), jnp.float32)
  pos = (attention_ops.sinusoid_pos_emb(m + t, 16), uv[0], uv[1])
  mask = attention_ops.attention_mask(t, m, jnp.full((b,), m, jnp.int32), False)
  args = (seg_BxTxD, mem_BxMxD, seg_BxTxD, pos, mask)

  params = random_params(lambda: make(True).init(jax.random.PRNGKey(0), *args), std=0.3)

  @jax.jit
  def outputs(keys):
    draw = lambda key: make(False).apply(params, *args, rngs={"dropout": key})
    return make(True).apply(params, *args), jax.vmap(draw)(keys)

  want, draws = jax.device_get(outputs(jax.random.split(jax.random.PRNGKey(1), 256)))
  assert not np.allclose(draws[0], want), "dropatt changed nothing"
  assert_mean_is(draws, want, dropatt, "attention output")


def test_dropatt_masks_are_independent_across_query_rows_heads_and_batch_rows():
  """Query rows, heads and batch rows draw independent keep masks (no row shares another's)."""
  keep = 0.5
  dropped, _, allowed = _probs_fn(1 - keep, 0)(jax.random.PRNGKey(2))
  kept = dropped != 0
  # Query rows 2i and 2i + 1 over the keys both may attend to (those of row 2i).
  rows_a, rows_b = split_pairs(kept, axis=2)
  both = split_pairs(allowed, axis=2)[0]
  assert_independent(rows_a[both], rows_b[both], keep, "query rows 2i, 2i+1")
  for axis, name in ((1, "heads"), (0, "batch rows")):
    a, b = split_pairs(kept, axis)
    valid = split_pairs(allowed, axis)[0]
    assert_independent(a[valid], b[valid], keep, name)


def test_dropatt_masks_are_independent_across_query_blocks_and_do_not_depend_on_them():
  """With queries in blocks of 4 (jax.checkpoint per block), row i and row i + 4 of the next
  block draw independent masks, and the result equals the one-block attention."""
  keep = 0.5
  key = jax.random.PRNGKey(3)
  blocked, _, allowed = _probs_fn(1 - keep, 4)(key)
  one_block, _, _ = _probs_fn(1 - keep, 0)(key)
  kept = blocked != 0
  # Blocks (0, 1) and (2, 3): row i of an even block against row i of the next block.
  t = kept.shape[2]
  first = np.array([i for i in range(t) if (i // 4) % 2 == 0])
  valid = allowed[:, :, first]
  assert_independent(
      kept[:, :, first][valid],
      kept[:, :, first + 4][valid],
      keep,
      "query rows i, i + 4 of consecutive blocks",
  )
  np.testing.assert_allclose(
      blocked,
      one_block,
      rtol=1e-6,
      atol=1e-7,
      err_msg="the blockwise dropatt differs from the one-block one",
  )


# --------------------------------------------------------------------------- #
# 2. Every nn.Dropout of the model (models.py): embeddings, positions,
# attention output, feed-forward (two), final hidden states.

N_KEYS = 64
DROPOUT = 0.3


def _sow_dropout(next_fun, args, kwargs, context):
  """nn.intercept_methods interceptor: every nn.Dropout call that drops
  sows its input "x" and output "y" (stacked over layers by the scan)."""
  y = next_fun(*args, **kwargs)
  mod = context.module
  if (
      isinstance(mod, nn.Dropout)
      and context.method_name == "__call__"
      and not kwargs.get("deterministic", mod.deterministic)
      and mod.rate > 0
  ):
    mod.sow("intermediates", "x", args[0])
    mod.sow("intermediates", "y", y)
  return y


# The model's dropout sites (flax paths of the nn.Dropout modules): per call, the axes of
# its input after the leading key axis (the layers' are stacked over n_layer = 2 by the scan).
ROWS = ("batch row", "position", "feature")
SITES = {
    "drop": [
        ("position", "feature"),  # the sinusoid R of attn_type 0 (models.py, reference)
        ROWS,  # the embeddings
        ROWS,
    ],  # the last layer's output: the final hidden states
    "layers/Dropout_0": [("layer",) + ROWS],  # the attention output, before the residual
    "layers/pos_ff/Dropout_0": [("layer",) + ROWS],  # feed-forward, after the ReLU
    "layers/pos_ff/Dropout_1": [("layer",) + ROWS],  # feed-forward output
}


@pytest.fixture(scope="module")
def dropout_calls():
  """({site: [(x, y) per call]}, hidden): the input x and output y of every nn.Dropout
  call of a 2-layer model, numpy [N_KEYS, ...] over N_KEYS dropout keys, and the final
  hidden states [N_KEYS, B, T, D] (TransformerXL.hidden) of the same calls."""
  cfg = tiny_model_config(
      d_model=32, d_head=16, d_inner=64, dropout=DROPOUT, dropatt=0.0, tgt_len=8, mem_len=8
  )
  model = models.TransformerXL(cfg)
  params = model_params(cfg)
  rng = np.random.default_rng(0)
  tokens_BxT = jnp.asarray(rng.integers(0, 64, (4, 8)), jnp.int32)
  memory = memory_lib.Memory(
      mems_LxBxMxD=jnp.asarray(rng.normal(size=(2, 4, 8, 32)), jnp.float32),
      mlen_B=jnp.full((4,), 8, jnp.int32),
  )

  def one(key):
    with nn.intercept_methods(_sow_dropout):
      (hidden_BxTxD, _), state = model.apply(
          {"params": params},
          tokens_BxT,
          memory,
          False,
          method=models.TransformerXL.hidden,
          rngs={"dropout": key},
          mutable=["intermediates"],
      )
    return hidden_BxTxD, state["intermediates"]

  keys = jax.random.split(jax.random.PRNGKey(1), N_KEYS)
  hidden, sown = jax.device_get(jax.jit(jax.vmap(one))(keys))
  flat = flatten_params(sown)  # {"a/b/name": tuple of sown arrays}
  calls = {
      site: list(zip(flat[site + "/x"], flat[site + "/y"]))
      for site in {p.rsplit("/", 1)[0] for p in flat}
  }
  return calls, hidden


def test_every_dropout_of_the_model_zeroes_at_its_rate_and_rescales_by_one_over_keep(dropout_calls):
  """Every dropout site keeps an entry with probability 1 - dropout and scales it by 1 / keep;
  where its input is the same for every key, the mean over keys is that input."""
  calls, _ = dropout_calls
  assert {s: [x.ndim - 1 for x, _ in c] for s, c in calls.items()} == {
      s: [len(axes) for axes in c] for s, c in SITES.items()
  }, "not the model's dropout sites"
  keep = 1 - DROPOUT
  for site, site_calls in calls.items():
    for i, (x, y) in enumerate(site_calls):
      what = f"{site} call {i}"
      kept = y != 0
      np.testing.assert_allclose(
          y[kept], x[kept] / keep, rtol=1e-6, err_msg=f"{what}: kept entries are not x / keep"
      )
      assert_rate(kept[x != 0], keep, what)
      if np.all(x == x[:1]):  # an input that no earlier dropout touched
        assert_mean_is(y, x[0], DROPOUT, what)
  # The positions and the embeddings are such inputs: the mean check ran on them.
  assert all(np.all(x == x[:1]) for x, _ in calls["drop"][:2])


def test_dropout_masks_are_independent_across_rows_positions_features_layers_and_calls(
    dropout_calls,
):
  """Every dropout site draws independent masks for every batch row, position, feature
  and layer, and the model's dropout draws anew at each of its three calls."""
  calls, _ = dropout_calls
  keep = 1 - DROPOUT
  for site, site_calls in calls.items():
    for i, ((x, y), axes) in enumerate(zip(site_calls, SITES[site])):
      kept, valid = y != 0, x != 0
      for axis, name in enumerate(axes, start=1):  # axis 0: the keys, independent by design
        (a, b), (valid_a, valid_b) = split_pairs(kept, axis), split_pairs(valid, axis)
        both = valid_a & valid_b
        assert_independent(a[both], b[both], keep, f"{site} call {i}, {name}s 2n, 2n+1")
  (_, y_emb), (_, y_out) = calls["drop"][1], calls["drop"][2]
  assert_independent(y_emb != 0, y_out != 0, keep, "the embedding and the output dropout")


def test_the_final_hidden_state_is_dropped_out(dropout_calls):
  """The hidden states given to the softmax are the last layer's output after dropout:
  a fraction dropout of them is zero and the rest are the layer output / keep."""
  calls, hidden = dropout_calls
  keep = 1 - DROPOUT
  assert_rate(hidden != 0, keep, "final hidden states")
  x_out, y_out = calls["drop"][-1]
  np.testing.assert_array_equal(hidden, y_out)
  kept = hidden != 0
  np.testing.assert_allclose(hidden[kept], x_out[kept] / keep, rtol=1e-6)


# --------------------------------------------------------------------------- #
# 3. The train step's dropout keys: micro-batches (batch_chunk) and steps.


@pytest.fixture(scope="module")
def train_setup():
  """(mesh, shardings, step-0 TrainState, the jitted train step with batch_chunk 2,
  batch(rows_Bx9)) of a 1-layer model; global batch 8, tgt_len 8."""
  config = tiny_config(global_batch=8, batch_chunk=2, warmup_steps=0)
  config.model.update(
      n_layer=1,
      d_model=32,
      n_head=2,
      d_head=16,
      d_inner=64,
      tgt_len=8,
      mem_len=8,
      dropout=DROPOUT,
      dropatt=0.0,
  )
  mesh = one_device_mesh()
  mcfg = default_config.model_config(config, 64)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = train_state.create_train_state(
      model, tx, 8, mesh, state_shardings=shardings, params=model_params(mcfg)
  )
  step_fn = train_step.make_train_step(model, tx, mesh, shardings, batch_chunk=2, dropout_seed=7)

  def batch(tokens_Bx9):
    rows = {
        "inputs": tokens_Bx9[:, :-1].astype(np.int32),
        "targets": tokens_Bx9[:, 1:].astype(np.int32),
        "weights": np.ones((8, 8), np.float32),
        "reset": np.zeros((8,), bool),
    }
    return data.to_global_batch(rows, sharding.batch_sharding(mesh), 8)

  return mesh, shardings, state, step_fn, batch


def copy_state(state, **changes):
  """A copy (the train step donates its input state), with fields replaced."""
  return jax.tree_util.tree_map(jnp.copy, state).replace(**changes)


def test_micro_batches_and_steps_draw_independent_dropout_masks(train_setup):
  """Gradient accumulation: two micro-batches with identical rows and memory draw
  independent dropout masks; so do two steps; the same step draws the same masks again.

  Seen in the memory the step returns: layer 0 caches its input, the embeddings
  after dropout, whose zeros are the embedding dropout's mask."""
  _, shardings, state, step_fn, make_batch = train_setup
  keep = 1 - DROPOUT
  # Rows 2r and 2r + 1 are the same; row r goes to micro-batch r % 2 (train_step._to_chunks).
  batch = make_batch(np.repeat(np.random.default_rng(0).integers(0, 64, (4, 9)), 2, axis=0))

  def kept_at(step):
    at_step = jax.device_put(jnp.asarray(step, jnp.int32), shardings.step)
    new_state, metrics = step_fn(copy_state(state, step=at_step), batch)
    assert bool(metrics["finite"])
    assert np.all(np.asarray(new_state.memory.mlen_B) == 8)
    return np.asarray(new_state.memory.mems_LxBxMxD[0]) != 0

  at0, at0_again, at1 = kept_at(0), kept_at(0), kept_at(1)
  assert_rate(at0, keep, "embedding dropout in the train step")
  assert_independent(at0[0::2], at0[1::2], keep, "micro-batches 0 and 1 (identical rows)")
  assert_independent(at0, at1, keep, "steps 0 and 1")
  np.testing.assert_array_equal(at0, at0_again, err_msg="step 0 is not reproducible")


# --------------------------------------------------------------------------- #
# 4. Generation: the key of each generated token.


def test_each_generated_token_has_its_own_reproducible_key(monkeypatch):
  """Token i of row b is drawn with fold_in(fold_in(PRNGKey(seed), b), i)
  (generate.Generator.stream): one distinct key per token and row, the same ones for the
  same seed, others for another seed."""
  cfg = tiny_model_config(n_layer=1, dropout=0.0, tgt_len=4, mem_len=4)
  params = model_params(cfg)
  keys = []  # the key of every draw, in dispatch order (ordered effects)
  real = sampling.sample_tokens

  def recording(key, *args):
    jax.debug.callback(lambda k: keys.append(np.asarray(k)), key, ordered=True)
    return real(key, *args)

  monkeypatch.setattr(sampling, "sample_tokens", recording)
  gen = generate.Generator(cfg, one_device_mesh())
  # 3 < tgt_len prompt tokens: one padded segment, then the generated tokens.
  prompt_BxN = np.random.default_rng(0).integers(0, 64, (2, 3)).astype(np.int32)
  n = 8
  settings = sampling.SamplingSettings(top_k=0)

  def run(seed):
    del keys[:]
    tokens = gen.generate(params, prompt_BxN, n, settings, seed=seed)
    jax.effects_barrier()
    # the last n draws give the n tokens; each draw's keys: one per row
    return tokens, [tuple(map(tuple, k.tolist())) for k in keys[-n:]]

  tokens, used = run(3)
  row_key = lambda seed, b: jax.random.fold_in(jax.random.PRNGKey(seed), b)
  want = [
      tuple(tuple(np.asarray(jax.random.fold_in(row_key(3, b), i)).tolist()) for b in range(2))
      for i in range(n)
  ]
  assert len({k for draw in used for k in draw}) == 2 * n, f"tokens share keys: {used}"
  assert used == want
  tokens_again, used_again = run(3)
  np.testing.assert_array_equal(tokens_again, tokens)
  assert used_again == used
  _, used_other = run(4)
  assert not {k for d in used_other for k in d} & {k for d in used for k in d}


# --------------------------------------------------------------------------- #
# 5. The non-finite guard of the train step.


def test_nonfinite_guard_rejects_an_update_that_overflows_the_parameters(train_setup):
  """A step whose loss and gradient norm are finite but whose update makes the
  parameters non-finite is not applied: finite is False, params, opt_state and memory
  stay as they were, and only the step advances."""
  _, shardings, state, step_fn, make_batch = train_setup
  rng = np.random.default_rng(1)
  batch1, batch2 = (make_batch(rng.integers(0, 64, (8, 9))) for _ in range(2))
  state, metrics = step_fn(copy_state(state), batch1)  # a good step: the memory fills
  assert bool(metrics["finite"])

  # Adam's first moments near float32's max: the bias-corrected moment mu / (1 - b1^t)
  # overflows, so the update is -inf, while the loss and the gradient (of the unchanged,
  # finite parameters) are finite.
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  poison = (
      lambda s: s._replace(mu=jax.tree_util.tree_map(lambda m: jnp.full_like(m, 3e38), s.mu))
      if is_adam(s)
      else s
  )
  poisoned = jax.device_put(
      state.replace(opt_state=jax.tree_util.tree_map(poison, state.opt_state, is_leaf=is_adam)),
      shardings,
  )
  before = jax.device_get(poisoned)
  # Control: the same step without the poison is finite and applied (the memory moves on).
  control, control_metrics = step_fn(copy_state(state), batch2)
  assert bool(control_metrics["finite"])
  assert not np.array_equal(np.asarray(control.memory.mems_LxBxMxD), before.memory.mems_LxBxMxD)

  after, metrics = step_fn(poisoned, batch2)
  assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
  assert not bool(metrics["finite"]), "an update with non-finite parameters was reported finite"
  after = jax.device_get(after)
  assert int(after.step) == int(before.step) + 1
  for name in ("params", "opt_state", "memory"):
    for a, b in zip(
        jax.tree_util.tree_leaves(getattr(after, name)),
        jax.tree_util.tree_leaves(getattr(before, name)),
    ):
      np.testing.assert_array_equal(a, b, err_msg=f"the rejected step changed {name}")


# --------------------------------------------------------------------------- #
# 6. The logged learning rate.


def _applied_rates(train_cfg, n_steps):
  """The learning rate the run's optimizer (train_state.make_optimizer) applies at each of
  its first n_steps updates: with a constant gradient g (below the clip) Adam's update is
  -lr * g / (|g| + eps) = -lr (eps / g = 1e-7), up to float32 rounding."""
  tx = train_state.make_optimizer(train_cfg)
  params = {"w": jnp.zeros((), jnp.float32)}
  opt_state, g = tx.init(params), {"w": jnp.asarray(0.1, jnp.float32)}
  rates = []
  for _ in range(n_steps):
    updates, opt_state = tx.update(g, opt_state, params)
    rates.append(-float(updates["w"]))
  return rates


def test_logged_learning_rate_is_the_rate_applied_at_that_step(tmp_path):
  """metrics.jsonl's train/learning_rate at step s is the rate of the s-th update, as the
  optimizer applied it (warmup: it changes at every step)."""
  n_steps = 4
  config = tiny_config(
      num_steps=n_steps, warmup_steps=3, learning_rate=3e-3, min_lr=1e-4, log_every=1, eval_every=0
  )
  config.model.update(n_layer=1, dropout=0.0, dropatt=0.0)  # no dropout: a faster compile
  config.checkpoint.update(every_steps=100)
  rng = np.random.default_rng(0)
  stream = lambda n: data.ArraySource(rng.integers(0, 32, size=n).astype(np.int32))
  corpus = data.Corpus(
      name="toy",
      unit="word",
      vocab=[f"w{i}" for i in range(32)],
      boundary_id=0,
      splits={"train": stream(8 * 6 * 8 + 8), "valid": stream(100), "test": stream(100)},
  )
  train.train_and_evaluate(config, str(tmp_path), corpus, one_device_mesh())
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  logged = {r["step"]: r["train/learning_rate"] for r in rows if "train/learning_rate" in r}
  assert sorted(logged) == list(range(1, n_steps + 1))
  applied = _applied_rates(config.train, n_steps)
  assert applied[0] == 0.0 and all(abs(b - a) > 1e-4 for a, b in zip(applied, applied[1:]))
  # rtol 1e-4: Adam's float32 bias correction 1 - b2^t (t = 2: 0.002) carries a relative
  # rounding error of ~3e-5 into the measured rate; consecutive rates differ by >= 30 %.
  np.testing.assert_allclose(
      [logged[s] for s in range(1, n_steps + 1)],
      applied,
      rtol=1e-4,
      atol=1e-12,
      err_msg="logged rates (steps 1..) vs applied",
  )


# --------------------------------------------------------------------------- #
# 7. RECL: the threshold of Appendix C's walk (analysis/relative_gain.py).


def test_recl_walk_continues_when_the_gain_equals_the_threshold():
  """(C.6) stops when g(c, c') < threshold: a gain exactly on the threshold goes on."""
  # One model, two tokens, lengths 4, 8, 16: l(4) = 1, l(8) = 1 + ln 0.5 (g = 0.5), l(16) = l(8).
  losses = np.array([[[1.0, 1.0], [1 + np.log(0.5)] * 2, [1 + np.log(0.5)] * 2]])
  gain = float(rg.relative_gain(losses, 0, 1, 1.0)[0])
  assert gain == pytest.approx(0.5)
  res = rg.recl(losses, [4, 8, 16], 1.0, threshold=gain)
  assert res["gain"][0][0] == gain  # exactly on the threshold
  assert res["recl"] == [8] and res["lower_bound"] == [False]
  # A gain of exactly 0 with threshold 0 never stops the walk: a lower bound at the last length.
  flat = np.ones((1, 3, 2))
  res = rg.recl(flat, [4, 8, 16], 1.0, threshold=0.0)
  assert res["gain"] == [[0.0, 0.0]]
  assert res["recl"] == [16] and res["lower_bound"] == [True]
