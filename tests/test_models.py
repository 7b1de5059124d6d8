"""Model properties: causality, recurrence, stop-gradient, empty memory, remat policies."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models, tuning

from helpers import tiny_model_config

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")
SMOKE = pytest.mark.smoke  # a case in the smoke tier (-m smoke)

jax.config.update("jax_enable_x64", False)


def small_config(**kw):
  base = dict(
      n_token=37,
      n_layer=3,
      d_head=6,
      d_inner=24,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=5,
      mem_len=7,
  )
  base.update(kw)
  return tiny_model_config(**base)


def init_model(cfg, batch=2, seed=0):
  model = models.TransformerXL(cfg)
  tok = jnp.zeros((batch, cfg.tgt_len), jnp.int32)
  params = nn.unbox(
      model.init(jax.random.PRNGKey(seed), tok, memory_lib.init_memory(cfg, batch), tok)
  )
  return model, params


@pytest.mark.parametrize(
    "attn_type,pre_lnorm,untie_r",
    [
        pytest.param(0, False, False, marks=SMOKE),
        pytest.param(0, True, True, marks=SLOW),
        pytest.param(1, False, False, marks=SLOW),
        pytest.param(2, True, False, marks=SLOW),
        pytest.param(3, False, False, marks=SLOW),
    ],
)
def test_causality_by_gradients(attn_type, pre_lnorm, untie_r):
  cfg = small_config(
      pre_lnorm=pre_lnorm, untie_r=untie_r, tgt_len=6, mem_len=4, attn_type=attn_type, d_head=8
  )
  model, params = init_model(cfg)
  mem = memory_lib.init_memory(cfg, 2).replace(mlen_B=jnp.array([4, 2], jnp.int32))
  mem = mem.replace(mems_LxBxMxD=jax.random.normal(jax.random.PRNGKey(3), mem.mems_LxBxMxD.shape))
  emb = jax.random.normal(jax.random.PRNGKey(2), (2, 6, cfg.d_model))

  def out_at(emb_BxTxD, t):
    h, _ = model.apply(params, emb_BxTxD, mem, method=model.hidden_from_embeddings)
    return h[:, t].sum()

  grad_at = jax.jit(jax.grad(out_at))  # one compilation; t is traced
  for t in range(6):
    g = grad_at(emb, t)
    assert np.all(np.asarray(g[:, t + 1 :]) == 0.0), f"position {t} sees the future"
    assert np.any(np.asarray(g[:, : t + 1]) != 0.0)

  # Empty memory slots (row 1 holds 2 of 4) get no gradient at all.
  def out_from_mem(m):
    h, _ = model.apply(
        params, emb, mem.replace(mems_LxBxMxD=m), method=model.hidden_from_embeddings
    )
    return h.sum()

  g_mem = np.asarray(jax.jit(jax.grad(out_from_mem))(mem.mems_LxBxMxD))
  # stop_gradient blocks the memory entirely: nothing flows back into it.
  assert np.all(g_mem == 0.0)


@pytest.mark.parametrize(
    "attn_type,mem_len,clamp_len,pre_lnorm",
    [
        pytest.param(0, 5, 0, False, marks=SLOW),
        pytest.param(0, 9, 0, False, marks=SLOW),
        pytest.param(0, 9, 4, True, marks=SMOKE),
        (1, 5, 0, False),
        pytest.param(1, 9, 0, True, marks=SLOW),
        pytest.param(1, 9, 4, False, marks=SLOW),
    ],
)
def test_recurrence_equals_concatenation(attn_type, mem_len, clamp_len, pre_lnorm):
  """Relative encodings (types 0 and 1): two segments with memory == one pass
  over their concatenation (for type 1 with tables longer than any distance)."""
  tgt_len = 5
  cfg = small_config(
      tgt_len=tgt_len,
      mem_len=mem_len,
      clamp_len=clamp_len,
      pre_lnorm=pre_lnorm,
      attn_type=attn_type,
      max_klen=32,
  )
  model, params = init_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 2 * tgt_len), 0, cfg.n_token)
  mem0 = memory_lib.init_memory(cfg, 2)
  h1, mem1 = model.apply(params, tokens[:, :tgt_len], mem0, method=model.hidden)
  h2, mem2 = model.apply(params, tokens[:, tgt_len:], mem1, method=model.hidden)
  # One pass over the concatenation with no memory at all.
  h_full, _ = model.apply(
      params, tokens, memory_lib.init_memory(cfg, 2, mem_len=0), method=model.hidden
  )
  np.testing.assert_allclose(np.asarray(h1), np.asarray(h_full[:, :tgt_len]), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(h2), np.asarray(h_full[:, tgt_len:]), rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(mem1.mlen_B) == min(mem_len, tgt_len))
  assert np.all(np.asarray(mem2.mlen_B) == min(mem_len, 2 * tgt_len))


@pytest.mark.smoke
def test_empty_memory_equals_no_memory():
  """A fresh stream with M empty slots equals the reference's zero-length memory."""
  cfg = small_config(same_length=False)
  model, params = init_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(7), (2, cfg.tgt_len), 0, cfg.n_token)
  garbage = memory_lib.init_memory(cfg, 2).replace(
      mems_LxBxMxD=1e3 * jnp.ones((cfg.n_layer, 2, cfg.mem_len, cfg.d_model))
  )
  h_empty, _ = model.apply(params, tokens, garbage, method=model.hidden)
  h_none, _ = model.apply(
      params, tokens, memory_lib.init_memory(cfg, 2, mem_len=0), method=model.hidden
  )
  np.testing.assert_allclose(np.asarray(h_empty), np.asarray(h_none), rtol=1e-6, atol=1e-6)


@pytest.mark.smoke
def test_memory_holds_layer_inputs():
  """New memory of layer l == last M inputs of layer l (memory caches inputs, Sec. 3.2)."""
  cfg = small_config(tgt_len=5, mem_len=3)
  model, params = init_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(8), (2, 5), 0, cfg.n_token)
  _, mem1 = model.apply(params, tokens, memory_lib.init_memory(cfg, 2), method=model.hidden)
  # word_emb returns the embedding already scaled by sqrt(d_model) (reference emb_scale).
  emb = model.apply(params, tokens, method=lambda m, t: m.word_emb(t))
  np.testing.assert_allclose(np.asarray(mem1.mems_LxBxMxD[0]), np.asarray(emb[:, -3:]), rtol=1e-6)
  # Layer 1's input is layer 0's output: run a 1-layer model with layer 0's params.
  cfg1 = small_config(tgt_len=5, mem_len=3, n_layer=1)
  p1 = jax.tree_util.tree_map(lambda x: x, params)
  p1["params"]["layers"] = jax.tree_util.tree_map(lambda x: x[:1], params["params"]["layers"])
  m1 = models.TransformerXL(cfg1)
  h_l0, _ = m1.apply(p1, tokens, memory_lib.init_memory(cfg1, 2), method=m1.hidden)
  np.testing.assert_allclose(
      np.asarray(mem1.mems_LxBxMxD[1]), np.asarray(h_l0[:, -3:]), rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize(
    "attn_type",
    [0, pytest.param(3, marks=SLOW)],  # the memory's stop-gradient is not the attention's
)
def test_loss_of_second_segment_has_no_gradient_through_memory(attn_type):
  cfg = small_config(attn_type=attn_type, d_head=8)
  model, params = init_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(9), (2, 2 * cfg.tgt_len + 1), 0, cfg.n_token)
  x1, y1 = tokens[:, : cfg.tgt_len], tokens[:, 1 : cfg.tgt_len + 1]
  x2, y2 = tokens[:, cfg.tgt_len : -1], tokens[:, cfg.tgt_len + 1 :]
  mem0 = memory_lib.init_memory(cfg, 2)

  def loss2_through(p):
    _, mem1 = model.apply(p, x1, mem0, y1)
    nll, _ = model.apply(p, x2, mem1, y2)
    return nll.mean()

  _, mem1_const = model.apply(params, x1, mem0, y1)

  def loss2_const(p):
    nll, _ = model.apply(p, x2, mem1_const, y2)
    return nll.mean()

  g_through = jax.jit(jax.grad(loss2_through))(params)  # jitted: eager flax calls are slow
  g_const = jax.jit(jax.grad(loss2_const))(params)
  for a, b in zip(jax.tree_util.tree_leaves(g_through), jax.tree_util.tree_leaves(g_const)):
    # The same up to float32 reassociation (the two graphs compile differently).
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)
  g_mem = jax.jit(
      jax.grad(lambda m: model.apply(params, x2, mem1_const.replace(mems_LxBxMxD=m), y2)[0].mean())
  )(mem1_const.mems_LxBxMxD)
  assert np.all(np.asarray(g_mem) == 0.0)
  # ... while the memory does change the loss (it is used, not ignored).
  nll_mem, _ = model.apply(params, x2, mem1_const, y2)
  nll_nomem, _ = model.apply(params, x2, mem0, y2)
  assert not np.allclose(np.asarray(nll_mem), np.asarray(nll_nomem))


@pytest.mark.smoke
def test_reset_memory_and_log_probs_normalised():
  cfg = small_config()
  model, params = init_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, cfg.tgt_len), 0, cfg.n_token)
  _, mem1 = model.apply(params, tokens, memory_lib.init_memory(cfg, 2), tokens)
  reset = mem1.reset(jnp.array([True, False]))
  assert list(np.asarray(reset.mlen_B)) == [0, min(cfg.mem_len, cfg.tgt_len)]
  logp, _ = model.apply(params, tokens, reset)
  np.testing.assert_allclose(np.exp(np.asarray(logp)).sum(-1), 1.0, rtol=1e-5)
  nll, _ = model.apply(params, tokens, reset, tokens)
  np.testing.assert_allclose(
      np.asarray(nll),
      -np.take_along_axis(np.asarray(logp), np.asarray(tokens)[..., None], -1)[..., 0],
      rtol=1e-6,
  )


@pytest.mark.parametrize(
    "attn_type",
    [0, pytest.param(1, marks=SLOW), pytest.param(2, marks=SLOW), pytest.param(3, marks=SLOW)],
)
def test_bfloat16_compute_keeps_float32_params_and_loss(attn_type):
  cfg = small_config(dtype="bfloat16", attn_type=attn_type, d_head=8)
  model, params = init_model(cfg)
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, cfg.tgt_len), 0, cfg.n_token)
  nll, mem = model.apply(params, tokens, memory_lib.init_memory(cfg, 2), tokens)
  assert nll.dtype == jnp.float32 and mem.mems_LxBxMxD.dtype == jnp.bfloat16
  cfg32 = small_config(attn_type=attn_type, d_head=8)
  nll32, _ = models.TransformerXL(cfg32).apply(
      params, tokens, memory_lib.init_memory(cfg32, 2), tokens
  )
  np.testing.assert_allclose(np.asarray(nll), np.asarray(nll32), rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "remat,attn_type",
    [
        pytest.param("full", 0, marks=SLOW),
        pytest.param("dots", 0, marks=SLOW),
        pytest.param("save_qkv_proj", 0, marks=SLOW),
        pytest.param("save_proj", 0, marks=SLOW),
        pytest.param("save_proj", 1, marks=SLOW),
        pytest.param("full", 2, marks=SLOW),
        pytest.param("save_proj", 3, marks=SLOW),
    ],
)
def test_remat_does_not_change_loss_or_gradients(remat, attn_type):
  cfg = small_config(attn_type=attn_type, d_head=8)
  model, params = init_model(cfg)
  model_r = models.TransformerXL(small_config(remat=remat, attn_type=attn_type, d_head=8))
  tokens = jax.random.randint(jax.random.PRNGKey(11), (2, cfg.tgt_len + 1), 0, cfg.n_token)
  mem = memory_lib.init_memory(cfg, 2)

  def loss(m, p):
    return m.apply(p, tokens[:, :-1], mem, tokens[:, 1:])[0].mean()

  l0, g0 = jax.value_and_grad(functools.partial(loss, model))(params)
  l1, g1 = jax.value_and_grad(functools.partial(loss, model_r))(params)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def _saved_residuals(remat, capsys):
  """What the backward pass keeps of a 3-layer model under a remat policy."""
  cfg = small_config(remat=remat)
  model = models.TransformerXL(cfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  tokens = jnp.zeros((2, cfg.tgt_len + 1), jnp.int32)
  mem = memory_lib.init_memory(cfg, 2)
  capsys.readouterr()
  jax.ad_checkpoint.print_saved_residuals(
      lambda p: model.apply({"params": p}, tokens[:, :-1], mem, tokens[:, 1:])[0].mean(), params
  )
  return capsys.readouterr().out


@pytest.mark.slow
def test_named_remat_policies_keep_projections_and_recompute_scores(capsys):
  # [L, H, B, T, K] scores / probabilities, [L, B, T, 3, H, Dh] qkv of the
  # segment and [L, B, M, 2, H, Dh] kv of the memory of small_config().
  scores, qkv, kv, ff_1 = "f32[3,2,2,5,12]", "f32[3,2,5,3,2,6]", "f32[3,2,7,2,2,6]", "f32[3,2,5,24]"
  saved = {r: _saved_residuals(r, capsys) for r in tuning.REMAT_POLICIES}
  assert scores in saved["none"] and scores in saved["dots"]
  for remat in ("full", "save_qkv_proj", "save_proj"):
    assert scores not in saved[remat], remat
  for proj in (qkv, kv):
    assert proj in saved["save_qkv_proj"] and proj in saved["save_proj"]
    assert proj not in saved["full"]
  assert ff_1 in saved["save_proj"] and ff_1 not in saved["save_qkv_proj"]


# --------------------------------------------------------------------------- #
# The four attention types against a naive numpy model (tests/naive_reference.py).

from naive_reference import NaiveTransformerXL, flat_params  # noqa: E402

TYPE_CASES = [
    # (attn_type, tgt_len, mem_len, options); one case per type in the fast tier
    pytest.param(0, 4, 4, {}, marks=SLOW),
    pytest.param(0, 4, 6, dict(same_length=True, clamp_len=3, pre_lnorm=True), marks=SMOKE),
    pytest.param(0, 4, 6, dict(untie_r=True), marks=SLOW),
    pytest.param(1, 4, 4, {}, marks=SLOW),
    pytest.param(1, 4, 6, dict(clamp_len=5), marks=SLOW),
    (1, 4, 6, dict(pre_lnorm=True, same_length=True)),
    pytest.param(2, 4, 4, {}, marks=SLOW),
    pytest.param(2, 4, 6, {}, marks=SLOW),
    (2, 4, 6, dict(pre_lnorm=True, clamp_len=5)),
    (3, 4, 4, {}),
    pytest.param(3, 4, 6, {}, marks=SLOW),
    pytest.param(3, 4, 6, dict(pre_lnorm=True, same_length=True), marks=SLOW),
    # Tables shorter than the attention (a longer evaluation attention): padded with row 0.
    pytest.param(1, 4, 6, dict(max_klen=7), marks=SLOW),
    pytest.param(3, 4, 6, dict(max_klen=7), marks=SLOW),
]


@pytest.mark.parametrize("attn_type,tgt_len,mem_len,options", TYPE_CASES)
def test_attention_types_equal_the_naive_reference_over_three_segments(
    attn_type, tgt_len, mem_len, options
):
  cfg = small_config(
      n_layer=2,
      d_model=12,
      n_head=2,
      d_head=6,
      d_inner=16,
      n_token=23,
      attn_type=attn_type,
      tgt_len=tgt_len,
      mem_len=mem_len,
      **options,
  )
  model = models.TransformerXL(cfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(attn_type)))
  # Large enough biases and tables that every positional term matters.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x
      + (0.5 if "r_" in jax.tree_util.keystr(path) else 0.05)
      * jax.random.normal(jax.random.PRNGKey(x.size), x.shape),
      params,
  )
  naive = NaiveTransformerXL(
      flat_params(jax.device_get(params)),
      n_layer=2,
      n_head=2,
      d_head=6,
      d_model=12,
      mem_len=mem_len,
      attn_type=attn_type,
      **{k: v for k, v in options.items() if k != "max_klen"},
  )
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 3 * tgt_len), 0, cfg.n_token)
  memory = memory_lib.init_memory(cfg, 2)
  for s in range(3):
    seg = tokens[:, s * tgt_len : (s + 1) * tgt_len]
    logp, memory = model.apply({"params": params}, seg, memory)
    want = naive.segment(np.asarray(seg))
    np.testing.assert_allclose(np.asarray(logp), want, rtol=1e-4, atol=1e-4, err_msg=f"segment {s}")


# --------------------------------------------------------------------------- #
# Speed options that must not change the numbers.


def _second_segment_grads(model, params, cfg, rng=None):
  """Loss, gradients and next memory of a second segment (a filled memory)."""
  tokens = jax.random.randint(jax.random.PRNGKey(21), (2, 2 * cfg.tgt_len + 1), 0, cfg.n_token)
  kw = dict(deterministic=rng is None, rngs={"dropout": rng} if rng is not None else None)
  _, mem = model.apply(
      params,
      tokens[:, : cfg.tgt_len],
      memory_lib.init_memory(cfg, 2),
      tokens[:, 1 : cfg.tgt_len + 1],
      **kw,
  )

  def loss(p):
    nll, new_mem = model.apply(
        p, tokens[:, cfg.tgt_len : -1], mem, tokens[:, cfg.tgt_len + 1 :], **kw
    )
    return nll.mean(), new_mem

  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "attn_type,pre_lnorm,unroll",
    # The scan's carry and per-layer parameters are the same for every attention
    # type; 3 is the one whose layers each add their absolute positions.
    [(0, True, 2), (3, False, 3)],
)
def test_scan_unroll_does_not_change_loss_gradients_or_memory(attn_type, pre_lnorm, unroll):
  cfg = small_config(
      attn_type=attn_type, pre_lnorm=pre_lnorm, d_head=8, dropout=0.1, dropatt=0.1, scan_unroll=1
  )
  model, params = init_model(cfg)
  unrolled = models.TransformerXL(
      small_config(
          attn_type=attn_type,
          pre_lnorm=pre_lnorm,
          d_head=8,
          dropout=0.1,
          dropatt=0.1,
          scan_unroll=unroll,
      )
  )
  rng = jax.random.PRNGKey(5)  # dropout on: every layer must draw the same masks
  (l0, m0), g0 = _second_segment_grads(model, params, cfg, rng)
  (l1, m1), g1 = _second_segment_grads(unrolled, params, cfg, rng)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  np.testing.assert_allclose(
      np.asarray(m1.mems_LxBxMxD), np.asarray(m0.mems_LxBxMxD), rtol=1e-6, atol=1e-6
  )
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_scan_unroll_minus_one_is_chosen_per_backend_and_checked():
  on_cpu = jax.default_backend() == "cpu"
  assert models.ModelConfig(n_token=5).scan_unroll == -1
  assert tuning.scan_unroll_layers(-1, 6) == (6 if on_cpu else 1)
  assert [tuning.scan_unroll_layers(u, 6) for u in (1, 2, 6, 9)] == [1, 2, 6, 6]
  fields = models.ModelConfig(n_token=5).to_dict()
  for bad in (0, -2):
    (problem,) = default_config.config_problems(dict(fields, scan_unroll=bad))
    assert f"model.scan_unroll={bad}" in problem and "-1" in problem
  assert default_config.config_problems(dict(fields, scan_unroll=3)) == []


def _dot_output_shapes(jaxpr) -> list:
  """Output shapes of every dot_general in a jaxpr and its sub-jaxprs."""
  shapes = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      shapes.append(tuple(eqn.outvars[0].aval.shape))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          shapes += _dot_output_shapes(sub)
  return shapes


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_backward_forms_no_gradient_for_the_memory_rows(attn_type):
  # The memory is stop-gradiented: post-LN, nothing may compute d(loss)/d(memory
  # row) = [B, M, d_model] (attention_ops.kv_rows).  It is needed where parameters
  # act on the memory rows before the projection, which shows the check sees it:
  # pre-LN (the LayerNorm) and attn_type 3 (its learned positions are added).
  for pre_lnorm in (False, True):
    formed = pre_lnorm or attn_type == 3
    cfg = small_config(attn_type=attn_type, pre_lnorm=pre_lnorm, d_head=8)
    model, params = init_model(cfg)
    jaxpr = jax.make_jaxpr(lambda p: _second_segment_grads(model, p, cfg)[1])(params)
    shapes = _dot_output_shapes(jaxpr.jaxpr)
    assert ((2, cfg.mem_len, cfg.d_model) in shapes) == formed, (pre_lnorm, shapes)
