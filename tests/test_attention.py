"""Relative attention: the Appendix B shift equals a naive Sec. 3.3 computation; masks."""

import dataclasses
import itertools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl.model import attention, attention_ops, models, tuning
from transformer_xl.model import memory as memory_lib

from helpers import tiny_model_config, tiny_model_inputs

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")


def naive_attention(params, cat_BxKxD, mem_len, mlen_B, same_length, clamp_len, u, v):
  """Sec. 3.3 computed literally: W_kR R_(i-j) built for every (i, j)."""
  cat = np.asarray(cat_BxKxD, np.float64)
  b, klen, d = cat.shape
  tgt_len = klen - mem_len
  wqkv = np.asarray(params["qkv_net"]["kernel"], np.float64)  # [D, 3, H, Dh]
  wr = np.asarray(params["r_net"]["kernel"], np.float64)  # [D, H, Dh]
  wo = np.asarray(params["o_net"]["kernel"], np.float64)  # [H, Dh, D]
  n_head, d_head = wr.shape[1:]
  q = np.einsum("bkd,dhe->bkhe", cat, wqkv[:, 0])[:, mem_len:]
  k = np.einsum("bkd,dhe->bkhe", cat, wqkv[:, 1])
  val = np.einsum("bkd,dhe->bkhe", cat, wqkv[:, 2])
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, d, 2.0) / d))
  out = np.zeros((b, tgt_len, d))
  for bb in range(b):
    for i in range(tgt_len):
      scores = np.full((n_head, klen), -np.inf)
      for j in range(klen):
        dist = i + mem_len - j
        if dist < 0 or j < mem_len - int(mlen_B[bb]):
          continue
        if same_length and dist >= mem_len:
          continue
        dd = min(dist, clamp_len) if clamp_len > 0 else dist
        r_vec = np.concatenate([np.sin(dd * inv_freq), np.cos(dd * inv_freq)])
        wkr_r = np.einsum("d,dhe->he", r_vec, wr)  # W_kR R_(i-j), one pair at a time
        for h in range(n_head):
          scores[h, j] = (q[bb, i, h] + u[h]) @ k[bb, j, h] + (q[bb, i, h] + v[h]) @ wkr_r[h]
      scores = scores / np.sqrt(d_head)
      prob = np.exp(scores - scores.max(-1, keepdims=True))
      prob /= prob.sum(-1, keepdims=True)
      vec = np.einsum("hk,khe->he", prob, val[bb])
      out[bb, i] = np.einsum("he,hed->d", vec, wo)
  return out


@pytest.mark.smoke
@pytest.mark.parametrize(
    "same_length,clamp_len,mlen",
    list(itertools.product([False, True], [0, 3], [(7, 7), (0, 4), (2, 7)])),
)
def test_rel_shift_attention_equals_naive(same_length, clamp_len, mlen):
  mem_len, tgt_len, d = 7, 5, 16
  rng = np.random.default_rng(0)
  cat = jnp.asarray(rng.normal(size=(2, mem_len + tgt_len, d)), jnp.float32)
  u = jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)
  mlen_B = jnp.asarray(mlen, jnp.int32)
  mod = attention.RelPartialLearnableAttention(n_head=2, d_head=6, d_model=d, init_std=0.3)
  pos = attention_ops.sinusoid_pos_emb(mem_len + tgt_len, d, clamp_len)
  mask = attention_ops.attention_mask(tgt_len, mem_len, mlen_B, same_length)
  h = cat[:, mem_len:]  # the segment (only types 2 and 3 read it)
  mem = cat[:, :mem_len]
  params = nn.unbox(mod.init(jax.random.PRNGKey(1), h, mem, h, (pos, u, v), mask))
  got = mod.apply(params, h, mem, h, (pos, u, v), mask)
  want = naive_attention(
      params["params"],
      cat,
      mem_len,
      np.asarray(mlen_B),
      same_length,
      clamp_len,
      np.asarray(u),
      np.asarray(v),
  )
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-4)


@pytest.mark.smoke
def test_same_length_mask_properties():
  for mem_len, tgt_len in [(7, 5), (3, 5), (5, 5)]:
    mask = np.asarray(attention_ops.attention_mask(tgt_len, mem_len, jnp.array([mem_len]), True))[
        0, 0
    ]
    # every query sees exactly min(mem_len, keys available) keys, the most recent ones
    for i in range(tgt_len):
      seen = np.nonzero(mask[i])[0]
      assert len(seen) == mem_len, (mem_len, tgt_len, i, seen)
      assert seen[-1] == i + mem_len  # itself
      assert np.all(np.diff(seen) == 1)  # a contiguous window


# --------------------------------------------------------------------------- #
# Blockwise attention (model.attn_block) equals the full computation.


@pytest.mark.smoke
def test_query_blocks_cover_every_query_and_its_keys():
  assert attention_ops.query_blocks(7, 12, 0) == [(0, 7, 12)]
  assert attention_ops.query_blocks(7, 12, 7) == [(0, 7, 12)]
  assert attention_ops.query_blocks(7, 12, 3) == [(0, 3, 8), (3, 6, 11), (6, 7, 12)]


BLOCK_CASES = [
    # (attn_type, options, memory state)
    pytest.param(0, dict(), "empty", marks=SLOW),
    (0, dict(), "partial"),
    pytest.param(0, dict(same_length=True, clamp_len=3), "full", marks=SLOW),
    pytest.param(0, dict(pre_lnorm=True, untie_r=True, dropatt=0.3), "partial", marks=SLOW),
    pytest.param(0, dict(dtype="bfloat16"), "partial", marks=SLOW),
    pytest.param(1, dict(same_length=True, dropatt=0.3), "partial", marks=SLOW),
    pytest.param(1, dict(clamp_len=2, max_klen=9), "full", marks=SLOW),
    pytest.param(2, dict(dropatt=0.3, pre_lnorm=True), "partial", marks=SLOW),
    pytest.param(3, dict(same_length=True, dtype="bfloat16"), "full", marks=SLOW),
]


@pytest.mark.parametrize("attn_type,options,memory", BLOCK_CASES)
def test_blockwise_attention_equals_the_full_one(attn_type, options, memory):
  cfg = tiny_model_config(
      n_token=37, d_inner=24, dropout=0.0, tgt_len=7, mem_len=5, attn_type=attn_type, **options
  )
  full, blocked = models.TransformerXL(cfg), models.TransformerXL(
      dataclasses.replace(cfg, attn_block=3)
  )  # blocks of 3, 3, 1 queries
  params, tokens, mem = tiny_model_inputs(cfg, memory)

  def loss(p, model):
    nll, new_mem = model.apply(
        {"params": p},
        tokens[:, :-1],
        mem,
        tokens[:, 1:],
        deterministic=False,
        rngs={"dropout": jax.random.PRNGKey(5)},
    )
    return nll.mean(), (nll, new_mem)

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (l_full, (nll_full, mem_full)), g_full = grad(params, full)
  (l_blk, (nll_blk, mem_blk)), g_blk = grad(params, blocked)
  tol = (
      dict(rtol=2e-2, atol=2e-2)
      if options.get("dtype") == "bfloat16"
      else dict(rtol=1e-5, atol=1e-6)
  )
  np.testing.assert_allclose(np.asarray(nll_blk), np.asarray(nll_full), **tol)
  np.testing.assert_allclose(
      np.asarray(mem_blk.mems_LxBxMxD, np.float32),
      np.asarray(mem_full.mems_LxBxMxD, np.float32),
      **tol,
  )
  for a, b in zip(jax.tree_util.tree_leaves(g_blk), jax.tree_util.tree_leaves(g_full)):
    np.testing.assert_allclose(
        np.asarray(a), np.asarray(b), rtol=10 * tol["rtol"], atol=tol["atol"]
    )


@pytest.mark.slow
def test_blockwise_attention_does_not_keep_the_full_scores(capsys):
  """The point of the blocks: the backward pass keeps no [B, H, T, K] tensor."""
  cfg = tiny_model_config(n_token=37, d_inner=24, dropout=0.0, tgt_len=8, mem_len=5, scan_unroll=1)
  tokens = jnp.zeros((2, 9), jnp.int32)
  saved = {}
  for block in (0, 4):
    model = models.TransformerXL(dataclasses.replace(cfg, attn_block=block))
    params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(
        lambda p: model.apply(
            {"params": p}, tokens[:, :-1], memory_lib.init_memory(cfg, 2), tokens[:, 1:]
        )[0].mean(),
        params,
    )
    saved[block] = capsys.readouterr().out
  assert "f32[2,2,2,8,13]" in saved[0]  # [L, H, B, T, K] probabilities (scanned layers)
  # no float [., T, K] or first-block [., 4, 9] tensor (the bool mask may stay)
  assert not re.search(r"f32\[[0-9,]*(8,13|4,9)\]", saved[4]), saved[4]


def test_attn_block_minus_one_is_chosen_per_backend_and_use(capsys):
  """-1 (the default): blocks of 64 queries when training on CPU, the full
  computation in evaluation; explicit values are kept."""
  on_cpu = jax.default_backend() == "cpu"
  assert models.ModelConfig(n_token=5).attn_block == -1
  assert tuning.attn_block_size(-1, deterministic=False) == (64 if on_cpu else 0)
  assert tuning.attn_block_size(-1, deterministic=True) == 0
  assert [tuning.attn_block_size(b, d) for b in (0, 16) for d in (False, True)] == [0, 0, 16, 16]
  # The default model trains blockwise on CPU: no [B, H, T, K] scores kept.
  cfg = tiny_model_config(
      n_token=11, n_layer=1, d_model=8, n_head=1, d_inner=8, dropout=0.1, tgt_len=80, mem_len=0
  )
  model = models.TransformerXL(cfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  tokens = jnp.zeros((1, 81), jnp.int32)
  jax.ad_checkpoint.print_saved_residuals(
      lambda p: model.apply(
          {"params": p},
          tokens[:, :-1],
          memory_lib.init_memory(cfg, 1),
          tokens[:, 1:],
          deterministic=False,
          rngs={"dropout": jax.random.PRNGKey(1)},
      )[0].mean(),
      params,
  )
  saved = capsys.readouterr().out
  assert ("1,1,80,80]" not in saved) == on_cpu, saved
