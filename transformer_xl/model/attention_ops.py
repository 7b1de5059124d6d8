"""The computation every attention variant shares (attention.py holds the variants).

Dai et al. 2019, Sec. 3.3 (the score decomposition) and Appendix B (the
left-shift that avoids materialising W_kR R_(i-j) for every pair).

For query i (0-based in the segment of length T) and key j (0-based over the
M memory slots followed by the T segment positions, K = M + T), the distance
is ``i + M - j`` and the score is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_kR R_(i + M - j)      (Sec. 3.3)
           \\___ (a)+(c) __/    \\______________ (b)+(d) ___________/

The (b)+(d) term is computed for all keys as ``(q + v) @ r.T`` against the K
projected sinusoids r = W_kR R, listed by *descending* distance K-1, ..., 0,
and then left-shifted row by row (``rel_shift``).

Here: the positions (``sinusoid_pos_emb``, ``position_table``,
``absolute_positions``), the mask (``attention_mask``; with
documents, no key of another document), the shift,
the projections of concat(memory, segment) (``qkv``, ``kv_rows``:
no gradient is formed for the memory rows where none can flow), the scores
laid out [H, B, T, K] (``content_scores``, ``position_scores``) and
``attend``: scale, mask, float32 softmax, dropatt and the weighted values,
blockwise when asked (``query_blocks``), and ``o_net``
(``output_projection``).  The
projections' outputs are tagged with ``checkpoint_name`` ("qkv",
"r_head_k", "attn_out") so that a remat policy can keep them and recompute
the scores (``tuning.REMAT_POLICIES``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

Array = jax.Array
Dtype = Any

# Large negative instead of -inf: exp() gives exactly 0 and no NaN appears in
# gradients (the reference's TF code uses -1e30 as well).
MASK_VALUE = -1e30


def normal_init(std: float, *logical_axes: str | None):
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


def rel_shift(x_XxTxK: Array) -> Array:
  """The left-shift of Dai et al. 2019, Appendix B (reference ``_rel_shift``).

  Input entry (i, k) is a score against the encoding of distance K-1-k.
  Output entry (i, j) holds the input entry for distance ``i + M - j``
  (M = K - T) wherever that distance is >= 0; entries with j > i + M hold
  garbage that the causal mask removes.  Done with a zero pad and two
  reshapes: O(T K) memory, no gather.

  Args:
    x_XxTxK: scores [..., T, K] (any leading dims, e.g. [heads, batch]),
      any dtype.

  Returns:
    Array of the same shape and dtype.
  """
  *lead, t, k = x_XxTxK.shape
  zero_pad = jnp.zeros((*lead, t, 1), x_XxTxK.dtype)
  x_padded = jnp.concatenate([zero_pad, x_XxTxK], axis=-1)  # [..., T, K+1]
  x_padded = x_padded.reshape(*lead, k + 1, t)
  return x_padded[..., 1:, :].reshape(*lead, t, k)


def attention_mask(
    tgt_len: int, mem_len: int, mlen_B: Array, same_length: bool, doc_pos_BxT: Array | None = None
) -> Array:
  """Which keys each query may attend to (True = attend).

  Keys are M = mem_len memory slots, right-aligned (only the last
  ``mlen_B[b]`` hold states; the rest are empty and never attended, which
  makes a fresh stream behave exactly like the reference's empty memory),
  followed by the T segment positions.  Query i may attend key j iff
  ``0 <= i + M - j`` (causal) and, with ``same_length``, ``i + M - j < M``
  so that every query sees at most mem_len keys (the reference's
  ``triu(1 + mlen) + tril(-mask_shift_len)`` in ``MemTransformerLM._forward``).

  Documents (our extension, not in the reference; the need is discussed in
  kimiyoung/transformer-xl issue #126): with ``doc_pos_BxT`` query i of
  row b may also attend only keys at distance ``i + M - j <= doc_pos[b, i]``,
  those of its own document, in the memory and in the segment alike.
  Relative positions stay those of the stream; memory slots of an earlier
  document are masked, never removed.

  Args:
    tgt_len: T, queries per segment.
    mem_len: M, memory slots.
    mlen_B: int32 [B], the key layout's count (``Memory.key_count_B``):
      the valid memory slots, in [0, M], minus the front padding (-p with
      an empty memory masks the segment's first p positions as keys).
    same_length: mask distances >= M as well.
    doc_pos_BxT: optional int [B, T], each query's offset from the first
      input of its document (0 there; the document's first input is the
      separator that ended the previous one).  None: one stream, no
      document term (values >= M + T - 1 are inert as well).

  Returns:
    bool [B, 1, T, M + T].
  """
  klen = mem_len + tgt_len
  dist_TxK = jnp.arange(tgt_len)[:, None] + mem_len - jnp.arange(klen)[None, :]
  allowed_TxK = dist_TxK >= 0
  if same_length:
    allowed_TxK &= dist_TxK < mem_len
  valid_key_BxK = jnp.arange(klen)[None, :] >= (mem_len - mlen_B)[:, None]
  mask_Bx1xTxK = allowed_TxK[None, None, :, :] & valid_key_BxK[:, None, None, :]
  if doc_pos_BxT is not None:  # keys of the query's own document only
    mask_Bx1xTxK &= (dist_TxK[None, :, :] <= doc_pos_BxT[:, :, None])[:, None]
  return mask_Bx1xTxK


class MaskParts(NamedTuple):
  """What ``attention_mask`` is computed from, for the fused kernel
  (``pallas_attention``), which forms the mask in-kernel; the layers get
  this instead of the dense mask with ``model.attention_impl="pallas"``.

  Attributes:
    key_count_B: int32 [B], the key layout's count per row
      (``Memory.key_count_B``: the valid slots, minus the front padding).
    doc_pos_BxT: optional int [B, T], offsets in the documents.
  """

  key_count_B: Array
  doc_pos_BxT: Array | None = None

  def dense(self, tgt_len: int, mem_len: int, same_length: bool) -> Array:
    """The same mask as ``attention_mask``: bool [B, 1, T, M + T]."""
    return attention_mask(tgt_len, mem_len, self.key_count_B, same_length, self.doc_pos_BxT)


class CachedKV(NamedTuple):
  """One layer's decoding cache (generation, ``generate.Generator``): the
  keys and values of its memory slots as ``qkv_net`` projects them, and the
  position keys of one query, which do not change from step to step.

  Rolled like the memory: after a pass of T tokens the last M rows of
  [cached k; the segment's k] are the next cache, exactly as the last M
  rows of [memory; segment] are the next memory (models.DecoderLayer), so
  the cache always holds the projections of the memory's states.

  Attributes:
    k_BxMxHxDh: keys of the M memory slots (compute dtype).
    v_BxMxHxDh: values of the M memory slots.
    r_KxHxDh: attn_type 0's ``r_net`` projection of the sinusoid for
      distances M..0 (K = M + 1, one query); None for attn_type 1, whose
      position tables are parameters read as they are.
  """

  k_BxMxHxDh: Array
  v_BxMxHxDh: Array
  r_KxHxDh: Array | None = None


def query_blocks(tgt_len: int, klen: int, block_size: int) -> list[tuple[int, int, int]]:
  """The blocks of the blockwise attention: (i0, i1, j1) per block.

  Queries [i0, i1) attend to keys [0, j1) with j1 = i1 + M (M = klen -
  tgt_len): every key a query of the block can see (query i sees keys j <=
  i + M), so that each block's scores are a [i1 - i0, j1] slab, and the
  block's position rows are the last j1 of the full K, for which Appendix
  B's shift, applied to the block alone, gives the right distances.
  ``block_size`` 0 (or >= T) is one block, the full computation.
  """
  if block_size <= 0 or block_size >= tgt_len:
    return [(0, tgt_len, klen)]
  mem_len = klen - tgt_len
  return [
      (i0, min(i0 + block_size, tgt_len), min(i0 + block_size, tgt_len) + mem_len)
      for i0 in range(0, tgt_len, block_size)
  ]


def _keep_mask(rng: Array, i0: int, i1: int, j1: int, shape_BxHxK: tuple, keep: float) -> Array:
  """dropatt's keep mask of query rows [i0, i1) over keys [0, j1): bool [B, H, Q, j1].

  Row i's mask is drawn from ``fold_in(rng, i)`` over all K keys, so the
  masks do not depend on how the queries are cut into blocks (the blockwise
  attention equals the full one with dropout too).
  """
  rows = jnp.arange(i0, i1)
  keep_QxBxHxK = jax.vmap(
      lambda i: jax.random.bernoulli(jax.random.fold_in(rng, i), keep, shape_BxHxK)
  )(rows)
  return jnp.transpose(keep_QxBxHxK, (1, 2, 0, 3))[..., :j1]


def content_scores(q_BxQxHxDh: Array, k_BxJxHxDh: Array) -> Array:
  """q . k for every head, query and key: float32 [H, B, Q, J].

  Heads lead the batch so that every [Q, J] slab is one row-major matrix
  product's output and the softmax, the shift and the mask run over
  contiguous rows (XLA lays out a dot's output as batch dims, then the
  lhs's and the rhs's free dims).
  """
  return jax.lax.dot_general(
      q_BxQxHxDh, k_BxJxHxDh, (((3,), (3,)), ((2, 0), (2, 0))), preferred_element_type=jnp.float32
  )


def position_scores(q_BxQxHxDh: Array, r_JxHxDh: Array) -> Array:
  """q . r against position rows shared by the batch: float32 [H, B, Q, J]
  (one [B*Q, Dh] x [Dh, J] product per head)."""
  return jax.lax.dot_general(
      q_BxQxHxDh, r_JxHxDh, (((3,), (2,)), ((2,), (1,))), preferred_element_type=jnp.float32
  )


def weighted_values(prob_HxBxQxJ: Array, v_BxJxHxDh: Array) -> Array:
  """The attention vectors sum_j prob_ij v_j: [H, B, Q, Dh] in the inputs' dtype."""
  return jax.lax.dot_general(prob_HxBxQxJ, v_BxJxHxDh, (((3,), (1,)), ((0, 1), (2, 0))))


def attend(
    mod: nn.Module,
    score_fn: Callable,
    q_BxTxHxDh: Array,
    k_BxKxHxDh: Array,
    v_BxKxHxDh: Array,
    pos: tuple,
    mask_Bx1xTxK: Array,
) -> Array:
  """Scores, scale, mask, float32 softmax, dropatt, the weighted values.

  The part every attention type shares (reference: ``attn_score.mul_(scale)``
  ... ``o_net(attn_vec)``); called from inside ``mod``'s compact
  ``__call__``, whose sizes, ``dropatt``, dtypes, ``deterministic``,
  ``record`` and ``block_size`` it uses.  The caller projects the result
  (``output_projection``, after the memory's ``combine`` hook).  Scores and probabilities are laid
  out [H, B, Q, J] (``content_scores``); what is recorded is [B, H, T, K].

  Blockwise: with ``mod.block_size`` > 0 the queries are processed in
  blocks (``query_blocks``), each under ``jax.checkpoint``, so the
  [H, B, T, K] scores and probabilities never exist at once, forward or
  backward: temporaries are O(block x K) and the backward pass recomputes
  each block's scores (flash-attention style, without the online softmax:
  a block sees all its keys at once).  The checkpoint lets XLA merge the
  recomputation with the forward pass (``prevent_cse=False``), which it
  does where both are in one program (the unrolled loop over layers,
  ``tuning.scan_unroll_layers``): faster, but the blocks' values are then
  kept.  The result equals the full computation (same dropout masks,
  ``_keep_mask``).

  Args:
    score_fn: (q_BxQxHxDh, k_BxJxHxDh, pos) -> float32 [H, B, Q, J], the
      type's unscaled scores of a block of queries against keys [0, J);
      ``pos`` holds the type's position rows for those keys.
    q_BxTxHxDh: queries.
    k_BxKxHxDh: keys.
    v_BxKxHxDh: values.
    pos: tuple of arrays with K leading rows in descending distance order
      (K-1 .. 0); a block with J keys gets their last J rows.
    mask_Bx1xTxK: bool, True where attention is allowed.

  Returns:
    The attention vectors [B, T, n_head, d_head] in ``mod.dtype``.
  """
  b, _, t, k = mask_Bx1xTxK.shape
  mask_1xBxTxK = jnp.swapaxes(mask_Bx1xTxK, 0, 1)
  keep = 1.0 - mod.dropatt
  rng = mod.make_rng("dropout") if (mod.dropatt > 0 and not mod.deterministic) else None
  blocks = [(0, t, k)] if mod.record else query_blocks(t, k, mod.block_size)

  def block(i0, i1, j1, q, kk, vv, pos_rows, mask, rng):
    score_HxBxQxJ = score_fn(q, kk, pos_rows) * (1.0 / mod.d_head**0.5)
    prob_HxBxQxJ = jax.nn.softmax(jnp.where(mask, score_HxBxQxJ, MASK_VALUE), axis=-1)
    if mod.record:
      mod.sow("intermediates", "prob", jnp.swapaxes(prob_HxBxQxJ, 0, 1))
    prob_HxBxQxJ = prob_HxBxQxJ.astype(mod.dtype)
    if rng is not None:
      keep_HxBxQxJ = jnp.swapaxes(_keep_mask(rng, i0, i1, j1, (b, mod.n_head, k), keep), 0, 1)
      prob_HxBxQxJ = jnp.where(keep_HxBxQxJ, prob_HxBxQxJ / keep, 0).astype(mod.dtype)
    return weighted_values(prob_HxBxQxJ, vv)

  vecs = []
  for i0, i1, j1 in blocks:
    fn = functools.partial(block, i0, i1, j1)
    if len(blocks) > 1:
      fn = jax.checkpoint(fn, prevent_cse=False)
    vecs.append(
        fn(
            q_BxTxHxDh[:, i0:i1],
            k_BxKxHxDh[:, :j1],
            v_BxKxHxDh[:, :j1],
            tuple(p[k - j1 :] for p in pos),
            mask_1xBxTxK[:, :, i0:i1, :j1],
            rng,
        )
    )
  vec_HxBxTxDh = vecs[0] if len(vecs) == 1 else jnp.concatenate(vecs, axis=2)
  return jnp.transpose(vec_HxBxTxDh, (1, 2, 0, 3))


def output_projection(mod: nn.Module, vec_BxTxHxDh: Array) -> Array:
  """``o_net`` (no bias) over the attention vectors: [B, T, d_model] in
  ``mod.dtype``, tagged "attn_out"; the param is ``mod``'s "o_net"."""
  out_BxTxD = nn.DenseGeneral(
      mod.d_model,
      axis=(-2, -1),
      use_bias=False,
      dtype=mod.dtype,
      param_dtype=mod.param_dtype,
      kernel_init=normal_init(mod.init_std, "heads", "kv", "embed"),
      parent=mod,
      name="o_net",
  )(vec_BxTxHxDh)
  return checkpoint_name(out_BxTxD, "attn_out")


class Kernel(nn.Module):
  """A projection's weight alone, param ``kernel`` (the name, shape and
  logical axes ``nn.DenseGeneral`` gives it), for a projection that is
  applied in pieces (``_project_rows``)."""

  shape: tuple
  logical_axes: tuple
  init_std: float
  param_dtype: Dtype

  @nn.compact
  def __call__(self) -> Array:
    return self.param(
        "kernel", normal_init(self.init_std, *self.logical_axes), self.shape, self.param_dtype
    )


def _project_rows(x_BxNxD: Array, kernel_DxF: Array, dtype: Dtype) -> Array:
  """x @ kernel over the last input axis: [B, N, *F] in ``dtype`` (as
  ``nn.DenseGeneral`` with ``dtype``: both operands cast first)."""
  return jax.lax.dot_general(
      x_BxNxD.astype(dtype), kernel_DxF.astype(dtype), (((2,), (0,)), ((), ()))
  )


def kv_rows(
    mod: nn.Module, mem_in_BxMxD: Array, seg_in_BxTxD: Array, kernel_Dx2xHxDh: Array
) -> Array:
  """Keys and values of concat(memory, segment): [B, K, 2, H, Dh] (types 2, 3).

  The memory rows and the segment rows are projected separately: the same
  numbers as one product over the K rows, but where the memory rows are
  constants (stop-gradiented and not LayerNorm-ed, models.DecoderLayer)
  the backward pass forms the input gradient of the T segment rows only,
  not of all K (a slice of one K-row product would still form all K).
  """
  seg = checkpoint_name(_project_rows(seg_in_BxTxD, kernel_Dx2xHxDh, mod.dtype), "qkv")
  if mem_in_BxMxD.shape[1] == 0:
    return seg
  mem = checkpoint_name(_project_rows(mem_in_BxMxD, kernel_Dx2xHxDh, mod.dtype), "qkv")
  return jnp.concatenate([mem, seg], axis=1)


def qkv(mod: nn.Module, mem_in_BxMxD: Array, seg_in_BxTxD: Array):
  """The fused ``qkv_net`` of the relative types (0, 1) over concat(memory,
  segment): (q of the T segment rows, k, v), each [B, ., H, Dh].

  One kernel [d_model, 3, H, Dh] as the reference's ``qkv_net``, applied to
  the T segment rows (q, k, v) and to the M memory rows with its k and v
  columns only: the reference projects q for the memory rows too and drops
  it (the same numbers; a sixth of the projection's work saved, and the
  input gradient of the memory rows, as ``kv_rows``).  Both products
  are tagged "qkv" for the remat policies.

  Given a ``CachedKV`` instead of the memory rows (decoding), their
  keys and values are the cache's and only the segment rows are projected.
  """
  kernel_Dx3xHxDh = Kernel(
      (seg_in_BxTxD.shape[-1], 3, mod.n_head, mod.d_head),
      ("embed", None, "heads", "kv"),
      mod.init_std,
      mod.param_dtype,
      parent=mod,
      name="qkv_net",
  )()
  qkv_BxTx3xHxDh = checkpoint_name(_project_rows(seg_in_BxTxD, kernel_Dx3xHxDh, mod.dtype), "qkv")
  q_BxTxHxDh = qkv_BxTx3xHxDh[:, :, 0]
  if isinstance(mem_in_BxMxD, CachedKV):
    return (
        q_BxTxHxDh,
        jnp.concatenate([mem_in_BxMxD.k_BxMxHxDh, qkv_BxTx3xHxDh[:, :, 1]], axis=1),
        jnp.concatenate([mem_in_BxMxD.v_BxMxHxDh, qkv_BxTx3xHxDh[:, :, 2]], axis=1),
    )
  if mem_in_BxMxD.shape[1] == 0:
    return q_BxTxHxDh, qkv_BxTx3xHxDh[:, :, 1], qkv_BxTx3xHxDh[:, :, 2]
  kv_BxMx2xHxDh = checkpoint_name(
      _project_rows(mem_in_BxMxD, kernel_Dx3xHxDh[:, 1:], mod.dtype), "qkv"
  )
  kv_BxKx2xHxDh = jnp.concatenate([kv_BxMx2xHxDh, qkv_BxTx3xHxDh[:, :, 1:]], axis=1)
  return q_BxTxHxDh, kv_BxKx2xHxDh[:, :, 0], kv_BxKx2xHxDh[:, :, 1]


def position_table(table_NxX: Array, klen: int, clamp_len: int = 0) -> Array:
  """The rows of a learned table for distances (or positions from the end)
  klen-1, ..., 0: [klen, ...].

  Reference semantics (``RelLearnableMultiHeadAttn`` and the attn_type 3
  branch of ``MemTransformerLM._forward``): the table's last row is
  distance 0 and row -1-d distance d; with ``clamp_len > 0`` the table is
  first cut to its last clamp_len rows; when klen exceeds the table it is
  padded at the front with copies of its first row (so distances beyond
  the table share that row), otherwise its last klen rows are used.
  """
  if clamp_len > 0:
    table_NxX = table_NxX[-clamp_len:]
  n = table_NxX.shape[0]
  if klen > n:
    pad = jnp.broadcast_to(table_NxX[:1], (klen - n,) + table_NxX.shape[1:])
    return jnp.concatenate([pad, table_NxX], axis=0)
  return table_NxX[n - klen :]


def absolute_positions(pos_KxD: Array, mem_BxMxD: Array, h_BxTxD: Array) -> tuple[Array, Array]:
  """Adds absolute positions to a layer's memory and segment (types 2, 3).

  ``pos_KxD`` lists the positions of the K = M + T keys counted from the end
  of the window (row k is position K-1-k): the memory slots get rows [0, M),
  the segment rows [M, K).  Because the memory is right-aligned, a valid
  slot gets exactly the row the reference adds to its (unpadded) memory.

  Reference artefact, kept for parity: the reference adds the memory's rows
  IN PLACE (``mems_i += ...``) to the memory tensor it then caches from, so
  a slot that stays in the memory for several segments accumulates one
  addition per segment (with mem_len == tgt_len the memory is the last
  segment alone, which already carries its own positions, so it holds two);
  here the addition is applied to the memory before it is cached again,
  which gives the same numbers.

  Returns:
    (mem_BxMxD + pos[:M], h_BxTxD + pos[M:]) in the inputs' dtypes.
  """
  m = mem_BxMxD.shape[1]
  return (
      (mem_BxMxD + pos_KxD[:m]).astype(mem_BxMxD.dtype),
      (h_BxTxD + pos_KxD[m:]).astype(h_BxTxD.dtype),
  )
