"""Relative multi-head attention of Transformer-XL.

Dai et al. 2019, Sec. 3.3 (the score decomposition) and Appendix B (the
left-shift that avoids materialising W_kR R_(i-j) for every pair).

For query i (0-based in the segment of length T) and key j (0-based over the
M memory slots followed by the T segment positions, K = M + T), the distance
is ``i + M - j`` and the score is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_kR R_(i + M - j)      (Sec. 3.3)
           \\___ (a)+(c) __/    \\______________ (b)+(d) ___________/

The (b)+(d) term is computed for all keys as ``(q + v) @ r.T`` against the K
projected sinusoids r = W_kR R, listed by *descending* distance K-1, ..., 0,
and then left-shifted row by row (:func:`rel_shift`).

Attention variants are looked up by the reference's ``attn_type`` number in
:data:`ATTENTION_TYPES`; all share the call signature of
:class:`RelPartialLearnableAttention`.  The projections' outputs are tagged
with ``checkpoint_name`` ("qkv", "r_head_k", "attn_out") so that a remat
policy can keep them and recompute the [B, H, T, K] scores
(``models.REMAT_POLICIES``).
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

Array = jax.Array
Dtype = Any

# Large negative instead of -inf: exp() gives exactly 0 and no NaN appears in
# gradients (the reference's TF code uses -1e30 as well).
MASK_VALUE = -1e30


def normal_init(std: float, *logical_axes: Optional[str]):
  """N(0, std) initializer annotated with logical axis names for sharding."""
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=std), logical_axes)


def sinusoid_pos_emb(klen: int, d_model: int, clamp_len: int = 0) -> Array:
  """Sinusoid relative position encodings R for distances klen-1, ..., 0.

  Vaswani et al. 2017, used without parameters as R in Dai et al. 2019,
  Sec. 3.3; row k encodes distance ``klen - 1 - k`` (Appendix B's Q is
  defined in this descending order), clamped to ``clamp_len`` when
  ``clamp_len > 0`` (the reference's ``clamp_len``).

  Args:
    klen: number of keys K = M + T.
    d_model: encoding width (even).
    clamp_len: largest distance encoded; 0 disables clamping.

  Returns:
    pos_emb_KxD: float32 [klen, d_model], sin in the first half of the
    columns and cos in the second half (reference ordering).
  """
  pos_seq_K = jnp.arange(klen - 1, -1, -1, dtype=jnp.float32)
  if clamp_len > 0:
    pos_seq_K = jnp.minimum(pos_seq_K, float(clamp_len))
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
  sinusoid_KxD2 = pos_seq_K[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(sinusoid_KxD2), jnp.cos(sinusoid_KxD2)], axis=-1)


def rel_shift(x_BxHxTxK: Array) -> Array:
  """The left-shift of Dai et al. 2019, Appendix B (reference ``_rel_shift``).

  Input entry (i, k) is a score against the encoding of distance K-1-k.
  Output entry (i, j) holds the input entry for distance ``i + M - j``
  (M = K - T) wherever that distance is >= 0; entries with j > i + M hold
  garbage that the causal mask removes.  Done with a zero pad and two
  reshapes: O(T K) memory, no gather.

  Args:
    x_BxHxTxK: scores [batch, heads, T, K], any dtype.

  Returns:
    Array of the same shape and dtype.
  """
  b, h, t, k = x_BxHxTxK.shape
  zero_pad = jnp.zeros((b, h, t, 1), x_BxHxTxK.dtype)
  x_padded = jnp.concatenate([zero_pad, x_BxHxTxK], axis=-1)  # [B, H, T, K+1]
  x_padded = x_padded.reshape(b, h, k + 1, t)
  return x_padded[:, :, 1:, :].reshape(b, h, t, k)


def attention_mask(tgt_len: int, mem_len: int, mlen_B: Array, same_length: bool) -> Array:
  """Which keys each query may attend to (True = attend).

  Keys are M = mem_len memory slots, right-aligned (only the last
  ``mlen_B[b]`` hold states; the rest are empty and never attended, which
  makes a fresh stream behave exactly like the reference's empty memory),
  followed by the T segment positions.  Query i may attend key j iff
  ``0 <= i + M - j`` (causal) and, with ``same_length``, ``i + M - j < M``
  so that every query sees at most mem_len keys (the reference's
  ``triu(1 + mlen) + tril(-mask_shift_len)`` in ``MemTransformerLM._forward``).

  Args:
    tgt_len: T, queries per segment.
    mem_len: M, memory slots.
    mlen_B: int32 [B], valid memory slots per example, in [0, M].
    same_length: mask distances >= M as well.

  Returns:
    bool [B, 1, T, M + T].
  """
  klen = mem_len + tgt_len
  dist_TxK = jnp.arange(tgt_len)[:, None] + mem_len - jnp.arange(klen)[None, :]
  allowed_TxK = dist_TxK >= 0
  if same_length:
    allowed_TxK &= dist_TxK < mem_len
  valid_key_BxK = jnp.arange(klen)[None, :] >= (mem_len - mlen_B)[:, None]
  return allowed_TxK[None, None, :, :] & valid_key_BxK[:, None, None, :]


class RelPartialLearnableAttention(nn.Module):
  """Multi-head attention with the relative encoding of Dai et al. 2019 (attn_type 0).

  Reference: ``RelPartialLearnableMultiHeadAttn``.  One fused ``qkv_net``
  (W_q, W_kE, W_v; no bias) over concat(memory, segment), a separate
  ``r_net`` (W_kR; no bias) over the sinusoid R, an ``o_net`` (no bias).
  Scores are scaled by 1/sqrt(d_head); softmax in float32.

  Attributes:
    n_head, d_head, d_model: sizes.
    dropatt: dropout rate on the attention probabilities.
    init_std: std of the N(0, std) weight initialisation (reference 0.02).
    dtype: compute dtype; parameters are kept in ``param_dtype``.
    deterministic: disables dropout.
  """

  n_head: int
  d_head: int
  d_model: int
  dropatt: float = 0.0
  init_std: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  deterministic: bool = True

  @nn.compact
  def __call__(self, cat_BxKxD: Array, pos_emb_KxD: Array, mask_Bx1xTxK: Array,
               r_w_bias_HxDh: Array, r_r_bias_HxDh: Array) -> Array:
    """Attention output for the last T rows of ``cat_BxKxD``.

    Args:
      cat_BxKxD: concat(memory, segment) [B, K, d_model]; queries are the
        last T rows, T = mask_Bx1xTxK.shape[2].
      pos_emb_KxD: sinusoid R for distances K-1..0 (:func:`sinusoid_pos_emb`).
      mask_Bx1xTxK: bool, True where attention is allowed
        (:func:`attention_mask`).
      r_w_bias_HxDh: u of Sec. 3.3, [n_head, d_head].
      r_r_bias_HxDh: v of Sec. 3.3, [n_head, d_head].

    Returns:
      [B, T, d_model] in ``dtype`` (the o_net output, before dropout and the
      residual).
    """
    tgt_len = mask_Bx1xTxK.shape[2]
    qkv_BxKx3xHxDh = nn.DenseGeneral(
        (3, self.n_head, self.d_head), use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=normal_init(self.init_std, "embed", None, "heads", "kv"),
        name="qkv_net")(cat_BxKxD)
    qkv_BxKx3xHxDh = checkpoint_name(qkv_BxKx3xHxDh, "qkv")
    q_BxTxHxDh = qkv_BxKx3xHxDh[:, -tgt_len:, 0]
    k_BxKxHxDh = qkv_BxKx3xHxDh[:, :, 1]
    v_BxKxHxDh = qkv_BxKx3xHxDh[:, :, 2]
    r_KxHxDh = nn.DenseGeneral(
        (self.n_head, self.d_head), use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=normal_init(self.init_std, "embed", "heads", "kv"),
        name="r_net")(pos_emb_KxD.astype(self.dtype))
    r_KxHxDh = checkpoint_name(r_KxHxDh, "r_head_k")

    u = r_w_bias_HxDh.astype(self.dtype)
    v = r_r_bias_HxDh.astype(self.dtype)
    # (a) + (c): content terms.
    ac_BxHxTxK = jnp.einsum("bihd,bjhd->bhij", q_BxTxHxDh + u, k_BxKxHxDh,
                            preferred_element_type=jnp.float32)
    # (b) + (d): position terms against every distance K-1..0, then shifted.
    bd_BxHxTxK = rel_shift(jnp.einsum("bihd,jhd->bhij", q_BxTxHxDh + v, r_KxHxDh,
                                      preferred_element_type=jnp.float32))
    score_BxHxTxK = (ac_BxHxTxK + bd_BxHxTxK) * (1.0 / self.d_head ** 0.5)
    score_BxHxTxK = jnp.where(mask_Bx1xTxK, score_BxHxTxK, MASK_VALUE)
    prob_BxHxTxK = jax.nn.softmax(score_BxHxTxK, axis=-1).astype(self.dtype)
    prob_BxHxTxK = nn.Dropout(self.dropatt)(prob_BxHxTxK, deterministic=self.deterministic)

    vec_BxTxHxDh = jnp.einsum("bhij,bjhd->bihd", prob_BxHxTxK, v_BxKxHxDh)
    out_BxTxD = nn.DenseGeneral(
        self.d_model, axis=(-2, -1), use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=normal_init(self.init_std, "heads", "kv", "embed"),
        name="o_net")(vec_BxTxHxDh)
    return checkpoint_name(out_BxTxD, "attn_out")


# attn_type (reference numbering) -> attention module.  Types 1-3 (Shaw et
# al., absolute per layer, absolute at the input: the ablations of Table 6)
# are not implemented yet; models.config_problems rejects them up front.
ATTENTION_TYPES = {0: RelPartialLearnableAttention}
