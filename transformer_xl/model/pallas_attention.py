"""Transformer-XL's attention (attn_type 0) as fused Pallas kernels, forward and backward.

The computation of ``attention.RelPartialLearnableAttention`` between the
projections and ``o_net`` (Dai et al. 2019, Sec. 3.3 and Appendix B):

    A_ij = s * ((q_i + u) . k_j  +  (q_i + v) . r_(i + M - j)),   s = d_head^-1/2
    out_i = sum_j softmax_j(A_ij masked) v_j

done block by block with an online float32 softmax (FlashAttention-2's
recurrence), so that no [B, H, T, K] tensor (scores, probabilities, the
shifted position scores) is ever written to memory: temporaries are
O(block x block) per program, and memory traffic is one read of q, k, v and
the position rows per (query block, key block) tile.

The position term of a tile (query rows i0..i0+b-1, keys j0..j0+b-1)
needs the distances i - j + M of a band of 2b - 1 consecutive position
rows: ``(q + v) @ band.T`` is one [b, 2b] matrix product, and Appendix B's
left shift is applied to that band inside the kernel as a per-row rotation
(row a rotated by a + b + 1).  The same rotations, with other strides
(2b - 1, i.e. -1 mod 2b), give the un-shift of the backward pass.

On TPU (``_barrel_roll``) the rotation is a barrel shifter of uniform
rotations: one static ``pltpu.roll`` of the whole [b, 2b] float32 tile by a
base amount, then for each bit k of the rows' remaining amounts a static
``pltpu.roll`` by 2^k kept by the rows with that bit (``jnp.where``): at
most log2(2b) + 1 = 9 lane rotations and 8 selects of the tile at b = 128
(the kernels' rotations need at most 8 and 7), pure data movement, so exact.
Not the strided rotate (``pltpu.roll(x, shift, 1, stride=stride,
stride_axis=0)``, one instruction) that the kernels used first, which Mosaic
(libtpu 0.0.42.1) refuses: on v5e the backward's stride 2b - 1 gives "Not
implemented: the max shift in a vreg 1016 is larger than the vreg's width
128", and v4, which has no strided lane rotate, refuses even the forward's
stride 1 with "Not implemented: only supported in TPU v5+ and rotation
dimension is the minor most when stride dimension is the second minor most".
Forward and backward compile with Mosaic for v4, v5e, v5p and v6e (libtpu
0.0.42.1, from a CPU machine: compiled, never run on a TPU) at the paper
configs' shapes (enwik8_12l, enwik8_24l, wt103_base, wt103_large; train and
eval, bfloat16; tests/test_pallas_mosaic.py compiles a small shape for v4
and v5e); the extra rotations' cost on a TPU is unmeasured.  On v2 and v3
they compile in float32 only (bfloat16: "Unsupported matmul RHS type on
target: vector<128x128xbf16>"; ``default_config.validate`` refuses that
pair when it knows the device kind).  Interpret mode
runs the same barrel shifter, so the CPU tests check the arithmetic Mosaic
compiles.  On GPU (Triton), which has no rotate, the rotation is a store to
a per-program scratch tile and a gathering load back (L1/L2 traffic only).

Masks are computed in the kernel from indices, never read: causal (distance
>= 0), the memory's valid slots (key j >= M - mlen[b]; ``mlen`` as
``attention_ops.attention_mask``), ``same_length`` (distance < M) and, with
documents, distance <= doc_pos[b, i].  clamp_len lives in the position rows
themselves (``attention_ops.sinusoid_pos_emb``), so it needs nothing here.
Key blocks that no query of a block may see are skipped.  A query with no
key at all (only front-padding positions, ``mlen < 0``) gets the output 0
(the XLA path gives the mean of the values there); no loss reads it.

Backward (``jax.custom_vjp``), three kernels after the standard
FlashAttention-2 recomputation from the saved log-sum-exp:

* dq: per query block, over key blocks: dq = s dS k + s shift^-1(dS) band;
  du and dv (the biases) are the sums over batch and queries of the two
  parts, formed outside the kernel.
* dk, dv: per key block, over query blocks.
* dr: per block of position rows, over query blocks, in skewed (distance)
  coordinates, where the position term is a plain product and the
  content term and dP take the rotation instead: dr = s dS^T (q + v).
  One partial per batch row, summed outside (no cross-program
  accumulation, so the kernel is the same on TPU and GPU).

Inputs may be float32 or bfloat16: matrix products accumulate in float32,
the softmax is float32, probabilities and dS are cast to the input dtype
before their products (as the XLA path casts probabilities).  No dropatt:
a training step with dropatt > 0 uses the XLA path (``attention.py``).

Memory beside the inputs: the output, a log-sum-exp per query, dr's
per-row partials [B, H, K, Dh] float32 and, on GPU, the scratch tiles
[B, H, T, 2b] float32.  A program holds its (batch row, head)'s K rows of
k, v and the position rows whole (on TPU in VMEM: K x d_head x 2 bytes
each in bfloat16, 1 MiB at K = 8192, d_head = 64) and loops over their
blocks; attention far longer than that would want the key loop pipelined
from HBM instead.  TPU v4's 16 MiB of VMEM is the first limit: at d_head =
128 in bfloat16 Mosaic compiles K = 16384 keys for v4 and refuses K = 24576
("Ran out of memory in memory space vmem. Used 19.05M of 16.00M vmem"),
while v5e compiles K = 131128 (the paper configs' largest K is 3928).

Backends, chosen at lowering time with ``jax.lax.platform_dependent``: TPU
(Mosaic) and CUDA/ROCm (Triton) compile the kernels; any other platform
(CPU) runs the TPU formulation in Pallas interpret mode, slow but exact,
for checking.  ``jax.export`` a step with the kernel for one platform at a
time: a multi-platform export (``platforms=("tpu", "cuda")``) lowers every
branch for every platform, which the Mosaic and Triton calls refuse.  The kernel's speed has not been
measured on an accelerator yet (``benchmarks/attention_kernel.py``; docs/guide/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from transformer_xl.model import attention_ops
from transformer_xl.model.attention_ops import MASK_VALUE
from transformer_xl.model.axes import BATCH_AXES

Array = jax.Array

# doc_pos of a query without documents: larger than any distance.
NO_DOCUMENT = 2**30


@dataclasses.dataclass(frozen=True)
class Problem:
  """The static sizes and options of one attention call (hashable).

  T queries, K = M + T keys (M = mem_len slots, then the segment), scale
  = d_head^-1/2, same_length and whether a document mask is given.
  """

  T: int
  K: int
  M: int
  same_length: bool
  scale: float
  has_doc: bool


@dataclasses.dataclass(frozen=True)
class Flavor:
  """How the kernels are built for one backend.

  Attributes:
    backend: "tpu" (Mosaic: scalar prefetch, rotations by barrel shifter) or "gpu"
      (Triton: per-program scratch and gathering loads).
    block: queries and keys per tile (b, a power of two); the band is 2b
      wide.  0: the smallest power of two >= T, at least 8, at most 128.
    interpret: run in Pallas interpret mode (any platform; for checking).
  """

  backend: str
  block: int
  interpret: bool = False


TPU = Flavor("tpu", 128)
GPU = Flavor("gpu", 32)
INTERPRET = Flavor("tpu", 0, interpret=True)  # any other platform: TPU's kernels, interpreted


def _div(a, b: int):
  """a // b for a >= 0 (truncating ``lax.div`` in kernels: Mosaic lowers
  ``//`` through ``sign``, which asks the device for its TPU generation)."""
  return jax.lax.div(a, jnp.int32(b)) if isinstance(a, jax.Array) else a // b


def _cdiv(a, b: int):
  return _div(a + b - 1, b)


@dataclasses.dataclass(frozen=True)
class _Geometry:
  """Padded sizes: T and K to a multiple of the block, d_head to Dp."""

  b: int
  Tp: int
  Kp: int
  Dp: int

  @classmethod
  def of(cls, p: Problem, fl: Flavor, d_head: int) -> _Geometry:
    b = fl.block or min(128, max(8, 1 << (p.T - 1).bit_length()))
    dp = d_head
    if fl.backend == "gpu":  # Triton tensors: powers of two, dot operands >= 16
      dp = max(16, 1 << (d_head - 1).bit_length())
    return cls(b, _cdiv(p.T, b) * b, _cdiv(p.K, b) * b, dp)


# ----------------------------------------------------------------------------
# The per-row rotation, two ways.
# ----------------------------------------------------------------------------


def _barrel_roll(x_QxW, shift: int, stride: int):
  """Row a of x rotated by ``shift + a * stride`` along the lanes (W a power
  of two; ``jnp.roll``'s sense), from static, unstrided rotations only.

  Mosaic refuses the strided rotate (``pltpu.roll(..., stride=...)``) that
  would do this in one instruction (module docstring: v4 has none, v5e
  refuses stride 2b - 1 on a [b, 2b] tile).  Instead a barrel shifter:
  one uniform rotation by a base amount c, then for each bit k that some
  row's remainder e_a = (shift + a * stride - c) mod W has, the rows with
  that bit take ``pltpu.roll(y, 2**k, 1)`` (a ``jnp.where`` on a
  row mask).  Pure data movement, exact; at most log2(W) + 1 rotations and
  log2(W) selects of the [Q, W] tile.  For stride = W - 1 (-1 mod W) the
  base is shift - (Q - 1), so that e_a = Q - 1 - a needs log2(Q) bits, as
  stride 1's e_a = a does."""
  q, w = x_QxW.shape
  if w & (w - 1):
    raise ValueError(f"_barrel_roll: width {w} is not a power of two")
  stride %= w
  if stride == w - 1:
    base, e_rows = shift - (q - 1), [q - 1 - a for a in range(q)]
  else:
    base, e_rows = shift, [(a * stride) % w for a in range(q)]
  base %= w
  y = pltpu.roll(x_QxW, base, 1) if base else x_QxW
  used = functools.reduce(lambda acc, e: acc | e, e_rows, 0)
  if not used:
    return y
  a = jax.lax.broadcasted_iota(jnp.int32, (q, w), 0)
  e = (q - 1 - a) if stride == w - 1 else jnp.bitwise_and(a * stride, w - 1)
  for k in range(w.bit_length() - 1):
    if used >> k & 1:
      take = jnp.bitwise_and(e, 1 << k) != 0
      y = jnp.where(take, pltpu.roll(y, 1 << k, 1), y)
  return y


class _Rotate:
  """Row a of x_QxW rotated by ``shift + a * stride`` (``jnp.roll``'s sense:
  out[a, c] = x[a, (c - shift - a * stride) mod W]); ``take`` keeps the
  first ``width`` columns, ``spread`` first zero-pads x to width W."""

  def __init__(self, fl: Flavor, scratch_ref=None):
    self.fl = fl
    self.scratch_ref = scratch_ref  # gpu: this program's [b, 2b] float32 tile

  def _roll(self, x, shift, stride):
    return _barrel_roll(x, shift, stride)

  def _gather(self, width, shift, stride, n_src):
    """gpu: the rotation read back from the scratch tile (src columns >= n_src are 0)."""
    q, w = self.scratch_ref.shape
    a = jnp.arange(q, dtype=jnp.int32)[:, None]
    c = jnp.arange(width, dtype=jnp.int32)[None, :]
    src = jnp.bitwise_and(c - shift - a * stride, w - 1)  # W is a power of two
    rows = jnp.broadcast_to(a, (q, width))
    if n_src < w:
      vals = self.scratch_ref[rows, jnp.minimum(src, n_src - 1)]
      return jnp.where(src < n_src, vals, 0.0)
    return self.scratch_ref[rows, src]

  def _barrier(self):
    if not self.fl.interpret:
      plgpu.debug_barrier()

  def take(self, x_QxW, shift: int, stride: int, width: int):
    if self.fl.backend == "tpu":
      return self._roll(x_QxW, shift, stride)[:, :width]
    self.scratch_ref[...] = x_QxW
    self._barrier()
    out = self._gather(width, shift, stride, x_QxW.shape[1])
    self._barrier()
    return out

  def spread(self, x_QxN, shift: int, stride: int, width: int):
    n = x_QxN.shape[1]
    if self.fl.backend == "tpu":
      pad = jnp.zeros((x_QxN.shape[0], width - n), x_QxN.dtype)
      return self._roll(jnp.concatenate([x_QxN, pad], axis=1), shift, stride)
    self.scratch_ref[:, pl.ds(0, n)] = x_QxN
    self._barrier()
    out = self._gather(width, shift, stride, n)
    self._barrier()
    return out


def _dot_nt(a_QxD, b_KxD):
  """a @ b.T in float32."""
  return jax.lax.dot_general(
      a_QxD, b_KxD, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )


def _dot_tn(a_QxK, b_QxD):
  """a.T @ b in float32 (an explicit 2-D transpose: what both Mosaic and
  Triton lower, as jax's own Pallas flash attention does)."""
  return jnp.dot(a_QxK.T, b_QxD, preferred_element_type=jnp.float32)


def _dot(a_QxK, b_KxD):
  return jnp.dot(a_QxK, b_KxD, preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------
# One tile: scores and mask in (query, key) coordinates.
# ----------------------------------------------------------------------------


def _tile_scores(p: Problem, g: _Geometry, rot: _Rotate, qu, qv, k_blk, r_band):
  """s * ((q+u) k^T + shift((q+v) band^T)): float32 [b, b].

  ``r_band`` [2b, Dp] holds the position rows for r-indices j0 - i0 + T - b
  ... + 2b - 1 (row index K-1-distance), so that entry (a, c) needs band
  row c - a + b - 1: row a rotated by a + b + 1, first b columns.
  """
  ac = _dot_nt(qu, k_blk)
  bd = rot.take(_dot_nt(qv, r_band), g.b + 1, 1, g.b)
  return (ac + bd) * p.scale


def _tile_mask(p: Problem, g: _Geometry, i0, j0, mlen, doc_Qx1):
  """Allowed (query i0 + a, key j0 + c) pairs: bool [b, b]."""
  i = i0 + jnp.arange(g.b, dtype=jnp.int32)[:, None]
  j = j0 + jnp.arange(g.b, dtype=jnp.int32)[None, :]
  dist = i + p.M - j
  ok = (dist >= 0) & (j >= p.M - mlen) & (i < p.T)
  if p.same_length:
    ok &= dist < p.M
  if p.has_doc:
    ok &= dist <= doc_Qx1
  return ok


def _key_blocks(p: Problem, g: _Geometry, i0, mlen):
  """[lo, hi): the key blocks any query of block i0 may see."""
  first = jnp.maximum(p.M - mlen, 0)
  if p.same_length:
    first = jnp.maximum(first, i0 + 1)
  last = jnp.minimum(i0 + g.b, p.T) + p.M  # exclusive
  return _div(first, g.b), jnp.minimum(_cdiv(last, g.b), g.Kp // g.b)


def _query_blocks(p: Problem, g: _Geometry, j0, mlen):
  """[lo, hi): the query blocks that may see some key of block j0."""
  j_hi = jnp.minimum(j0 + g.b, p.K)
  lo = _div(jnp.maximum(j0 - p.M, 0), g.b)
  hi = g.Tp // g.b
  if p.same_length:
    hi = jnp.minimum(hi, jnp.maximum(_cdiv(j_hi - 1, g.b), 0))
  hi = jnp.where(j_hi <= p.M - mlen, lo, hi)
  return lo, jnp.maximum(hi, lo)


def _band_start(g: _Geometry, i0, j0):
  """First row of the tile's position band in the padded r (``_padded_inputs``)."""
  return j0 - i0 + g.Tp - g.b


# ----------------------------------------------------------------------------
# Kernels.  Refs per program: mlen (the batch's), then per (batch, head).
# ----------------------------------------------------------------------------


class _QueryBlock:
  """What the query-block kernels (forward, dq) share: this program's
  query block (q + u, q + v, its documents' offsets, the row's mlen) and,
  per key block, the tile's keys, values, position band, mask and scores."""

  def __init__(self, p, g, fl, mlen_ref, q_ref, u_ref, rr_ref, doc_ref, scratch):
    self.p, self.g = p, g
    self.rot = _Rotate(fl, scratch[0] if scratch else None)
    self.i0 = pl.program_id(2) * g.b
    self.mlen = mlen_ref[pl.program_id(0)]
    q = q_ref[...]
    self.qu, self.qv = q + u_ref[...], q + rr_ref[...]
    self.doc = doc_ref[...]

  def key_blocks(self):
    return _key_blocks(self.p, self.g, self.i0, self.mlen)

  def tile(self, kb, k_ref, v_ref, r_ref):
    """(k_blk, v_blk, r_band, mask, unmasked scores) of key block kb."""
    g = self.g
    j0 = pl.multiple_of(kb * g.b, g.b)
    k_blk, v_blk = k_ref[pl.ds(j0, g.b), :], v_ref[pl.ds(j0, g.b), :]
    r_band = r_ref[pl.ds(pl.multiple_of(_band_start(g, self.i0, j0), g.b), 2 * g.b), :]
    ok = _tile_mask(self.p, g, self.i0, j0, self.mlen, self.doc)
    s = _tile_scores(self.p, g, self.rot, self.qu, self.qv, k_blk, r_band)
    return k_blk, v_blk, r_band, ok, s


def _fwd_kernel(
    p, g, fl, mlen_ref, q_ref, k_ref, v_ref, r_ref, u_ref, rr_ref, doc_ref, o_ref, lse_ref, *scratch
):
  blk = _QueryBlock(p, g, fl, mlen_ref, q_ref, u_ref, rr_ref, doc_ref, scratch)

  def body(kb, carry):
    m, l, acc = carry
    _, v_blk, _, ok, s = blk.tile(kb, k_ref, v_ref, r_ref)
    s = jnp.where(ok, s, MASK_VALUE)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    prob = jnp.where(ok, jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(prob, axis=1, keepdims=True)
    acc = alpha * acc + _dot(prob.astype(v_blk.dtype), v_blk)
    return m_new, l, acc

  lo, hi = blk.key_blocks()
  init = (
      jnp.full((g.b, 1), MASK_VALUE, jnp.float32),
      jnp.zeros((g.b, 1), jnp.float32),
      jnp.zeros((g.b, g.Dp), jnp.float32),
  )
  m, l, acc = jax.lax.fori_loop(lo, hi, body, init)
  has = l > 0
  o_ref[...] = jnp.where(has, acc / jnp.where(has, l, 1.0), 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(has, m + jnp.log(jnp.where(has, l, 1.0)), 0.0)


def _dq_kernel(
    p,
    g,
    fl,
    mlen_ref,
    q_ref,
    k_ref,
    v_ref,
    r_ref,
    u_ref,
    rr_ref,
    doc_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dqu_ref,
    dqv_ref,
    *scratch,
):
  blk = _QueryBlock(p, g, fl, mlen_ref, q_ref, u_ref, rr_ref, doc_ref, scratch)
  do, lse, delta = do_ref[...], lse_ref[...], delta_ref[...]

  def body(kb, carry):
    dqu, dqv = carry
    k_blk, v_blk, r_band, ok, s = blk.tile(kb, k_ref, v_ref, r_ref)
    prob = jnp.where(ok, jnp.exp(s - lse), 0.0)
    ds = prob * (_dot_nt(do, v_blk) - delta) * p.scale
    dqu = dqu + _dot(ds.astype(k_blk.dtype), k_blk)
    # Un-shift: G[a, c + b - 1 - a] = dS[a, c], then G @ band.
    g_band = blk.rot.spread(ds, g.b - 1, 2 * g.b - 1, 2 * g.b)
    dqv = dqv + _dot(g_band.astype(r_band.dtype), r_band)
    return dqu, dqv

  lo, hi = blk.key_blocks()
  zero = jnp.zeros((g.b, g.Dp), jnp.float32)
  dqu, dqv = jax.lax.fori_loop(lo, hi, body, (zero, zero))
  dqu_ref[...] = dqu
  dqv_ref[...] = dqv


def _dkv_kernel(
    p,
    g,
    fl,
    mlen_ref,
    q_ref,
    k_ref,
    v_ref,
    r_ref,
    u_ref,
    rr_ref,
    doc_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *scratch,
):
  bi, kb = pl.program_id(0), pl.program_id(2)
  rot = _Rotate(fl, scratch[0] if scratch else None)
  j0 = kb * g.b
  mlen = mlen_ref[bi]
  k_blk, v_blk = k_ref[...], v_ref[...]
  u, rr = u_ref[...], rr_ref[...]

  def body(qb, carry):
    dk, dv = carry
    i0 = pl.multiple_of(qb * g.b, g.b)
    rows = pl.ds(i0, g.b)
    q = q_ref[rows, :]
    qu, qv = q + u, q + rr
    do, lse, delta = do_ref[rows, :], lse_ref[rows, :], delta_ref[rows, :]
    r_band = r_ref[pl.ds(pl.multiple_of(_band_start(g, i0, j0), g.b), 2 * g.b), :]
    ok = _tile_mask(p, g, i0, j0, mlen, doc_ref[rows, :])
    s = _tile_scores(p, g, rot, qu, qv, k_blk, r_band)
    prob = jnp.where(ok, jnp.exp(s - lse), 0.0)
    ds = prob * (_dot_nt(do, v_blk) - delta) * p.scale
    dv = dv + _dot_tn(prob.astype(do.dtype), do)
    dk = dk + _dot_tn(ds.astype(qu.dtype), qu)
    return dk, dv

  lo, hi = _query_blocks(p, g, j0, mlen)
  zero = jnp.zeros((g.b, g.Dp), jnp.float32)
  dk, dv = jax.lax.fori_loop(lo, hi, body, (zero, zero))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _dr_kernel(
    p,
    g,
    fl,
    mlen_ref,
    q_ref,
    k_ref,
    v_ref,
    r_ref,
    u_ref,
    rr_ref,
    doc_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dr_ref,
    *scratch,
):
  """One batch row's share of d r for position rows p0..p0+b-1 (r-index
  K-1-distance).  In (query a, position c) coordinates the key is j =
  p0 + c + i0 + a - T + 1: the content term and dP read a band of 2b keys
  rotated by -a per row; the position term is a plain product."""
  bi, pb = pl.program_id(0), pl.program_id(2)
  rot = _Rotate(fl, scratch[0] if scratch else None)
  p0 = pb * g.b
  mlen = mlen_ref[bi]
  r_blk = r_ref[...]
  u, rr = u_ref[...], rr_ref[...]
  pos = p0 + jnp.arange(g.b, dtype=jnp.int32)[None, :]
  dist = p.K - 1 - pos

  def body(qb, dr):
    i0 = pl.multiple_of(qb * g.b, g.b)
    rows = pl.ds(i0, g.b)
    q = q_ref[rows, :]
    qu, qv = q + u, q + rr
    do, lse, delta, doc = do_ref[rows, :], lse_ref[rows, :], delta_ref[rows, :], doc_ref[rows, :]
    keys = pl.ds(pl.multiple_of(p0 + i0 + g.b, g.b), 2 * g.b)  # k padded by T - 1 + b
    ac = rot.take(_dot_nt(qu, k_ref[keys, :]), 0, 2 * g.b - 1, g.b)
    s = (ac + _dot_nt(qv, r_blk)) * p.scale
    i = i0 + jnp.arange(g.b, dtype=jnp.int32)[:, None]
    j = pos + i - p.T + 1
    ok = (dist >= 0) & (j >= p.M - mlen) & (i < p.T)
    if p.same_length:
      ok &= dist < p.M
    if p.has_doc:
      ok &= dist <= doc
    prob = jnp.where(ok, jnp.exp(s - lse), 0.0)
    dp = rot.take(_dot_nt(do, v_ref[keys, :]), 0, 2 * g.b - 1, g.b)
    ds = prob * (dp - delta) * p.scale
    return dr + _dot_tn(ds.astype(qv.dtype), qv)

  # Queries with j >= max(0, M - mlen) for some position of the block.
  first_i = jnp.maximum(jnp.maximum(p.M - mlen, 0) + p.T - 1 - (p0 + g.b - 1), 0)
  dr = jax.lax.fori_loop(_div(first_i, g.b), g.Tp // g.b, body, jnp.zeros((g.b, g.Dp), jnp.float32))
  dr_ref[...] = dr


# ----------------------------------------------------------------------------
# pallas_call plumbing, per flavor.
# ----------------------------------------------------------------------------


# Matrix-product FLOPs of one visited tile, in units of b^2 x Dp: the forward's
# (q+u) k^T (2), (q+v) band^T over the 2b-wide band (4) and P v (2); dq's recomputed
# scores (6), dP (2), dS k (2), the un-shifted dS band (4); dk/dv's scores (6), dP,
# dv, dk (2 each); dr's rotated content term and dP over 2b keys (4 each), its
# position term (2) and dS^T (q+v) (2).
_TILE_FLOPS = {
    "txl_attention_fwd": 8,
    "txl_attention_dq": 14,
    "txl_attention_dkv": 12,
    "txl_attention_dr": 12,
}


def _visited_tiles(p: Problem, g: _Geometry) -> int:
  """(query block, key block) tiles one (batch row, head) computes with a
  full memory (``_key_blocks`` at mlen = M, in Python)."""
  total = 0
  for qb in range(g.Tp // g.b):
    i0 = qb * g.b
    first = i0 + 1 if p.same_length else 0
    last = min(i0 + g.b, p.T) + p.M
    total += max(min(-(-last // g.b), g.Kp // g.b) - first // g.b, 0)
  return total


def _cost(p: Problem, g: _Geometry, grid, name: str, args, out_shape) -> pl.CostEstimate:
  """What XLA's cost analysis (and ``transformer_xl.compile``) count for a
  kernel, which they cannot see into: its matrix FLOPs over the visited
  tiles with a full memory, one exp per score, and its operands and results."""
  per_row = grid[0] * grid[1] * _visited_tiles(p, g) * g.b * g.b
  nbytes = sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in (*args, *out_shape))
  return pl.CostEstimate(
      flops=int(_TILE_FLOPS[name] * per_row * g.Dp),
      transcendentals=int(per_row),
      bytes_accessed=int(nbytes),
  )


def _call(
    fl: Flavor,
    g: _Geometry,
    kernel,
    grid,
    in_specs,
    out_specs,
    out_shape,
    mlen_B,
    args,
    name,
    p: Problem | None = None,
):
  """One pallas_call: ``in_specs`` are (block_shape, index_map(*grid_idx))
  pairs for ``args``, mlen_B first in every kernel's signature.  TPU: mlen
  by scalar prefetch.  GPU: mlen as an input, plus a per-program [b, 2b]
  float32 scratch output (discarded) for the rotations.  With the problem
  ``p``, the call carries its cost estimate (``_cost``)."""
  cost = None if p is None else _cost(p, g, grid, name, args, out_shape)
  if fl.backend == "tpu":
    spec = lambda shape, imap: pl.BlockSpec(shape, lambda *ix: imap(*ix[:-1]))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=grid,
        in_specs=[spec(*s) for s in in_specs],
        out_specs=[spec(*s) for s in out_specs],
    )
    params = (
        None
        if fl.interpret
        else pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    )
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid_spec=grid_spec,
        compiler_params=params,
        interpret=fl.interpret,
        name=name,
        cost_estimate=cost,
    )(mlen_B, *args)
    return outs
  n_prog = grid[0] * grid[1] * grid[2]
  block = (None, g.b, 2 * g.b)
  scratch_spec = pl.BlockSpec(
      block, lambda x, y, z: (x * grid[1] * grid[2] + y * grid[2] + z, 0, 0)
  )
  b_pad = 1 << max(len(mlen_B) - 1, 0).bit_length()
  mlen_pad = jnp.pad(mlen_B, (0, b_pad - len(mlen_B)))
  params = None if fl.interpret else plgpu.CompilerParams(num_warps=4, num_stages=1)
  outs = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[pl.BlockSpec((b_pad,), lambda *ix: (0,))] + [pl.BlockSpec(*s) for s in in_specs],
      out_specs=[pl.BlockSpec(*s) for s in out_specs] + [scratch_spec],
      out_shape=list(out_shape) + [jax.ShapeDtypeStruct((n_prog, g.b, 2 * g.b), jnp.float32)],
      compiler_params=params,
      interpret=fl.interpret,
      name=name,
      cost_estimate=cost,
  )(mlen_pad, *args)
  return outs[:-1]


def _pad_to(x, axis, size, front=0):
  pads = [(0, 0)] * x.ndim
  pads[axis] = (front, size - x.shape[axis] - front)
  return jnp.pad(x, pads)


def _padded_inputs(p: Problem, g: _Geometry, q, k, v, r, u, rr, doc):
  """Kernel layouts: q [B, H, Tp, Dp], k, v [B, H, Kp, Dp], r [H, Kp + Tp, Dp]
  (Tp - T zero rows in front, so that every tile's band starts at row >= 0),
  u, rr [H, 1, Dp], doc [B, Tp, 1]."""
  d = lambda x: _pad_to(x, x.ndim - 1, g.Dp)
  q = d(_pad_to(q, 2, g.Tp))
  k, v = d(_pad_to(k, 2, g.Kp)), d(_pad_to(v, 2, g.Kp))
  r_pad = d(_pad_to(r, 1, g.Kp + g.Tp, front=g.Tp - p.T))
  u, rr = d(u[:, None, :]), d(rr[:, None, :])
  doc = _pad_to(doc, 1, g.Tp)[..., None]
  return q, k, v, r_pad, u, rr, doc


def _specs(g: _Geometry, per_query_block: bool):
  """Block specs of (q, k, v, r, u, rr, doc) for grid (B, H, n): q and
  doc per query block (or whole), k and v whole (or per key block)."""
  full_t = ((None, None, g.Tp, g.Dp), lambda b, h, n: (b, h, 0, 0))
  blk_t = ((None, None, g.b, g.Dp), lambda b, h, n: (b, h, n, 0))
  full_k = ((None, None, g.Kp, g.Dp), lambda b, h, n: (b, h, 0, 0))
  blk_k = blk_t
  r = ((None, g.Kp + g.Tp, g.Dp), lambda b, h, n: (h, 0, 0))
  bias = ((None, 1, g.Dp), lambda b, h, n: (h, 0, 0))
  doc_full = ((None, g.Tp, 1), lambda b, h, n: (b, 0, 0))
  doc_blk = ((None, g.b, 1), lambda b, h, n: (b, n, 0))
  if per_query_block:
    return [blk_t, full_k, full_k, r, bias, bias, doc_blk]
  return [full_t, blk_k, blk_k, r, bias, bias, doc_full]


def _forward(fl: Flavor, p: Problem, q, k, v, r, u, rr, mlen, doc):
  """(out [B, H, T, Dh] in q's dtype, lse [B, H, T] float32)."""
  bsz, nh, _, dh = q.shape
  g = _Geometry.of(p, fl, dh)
  args = _padded_inputs(p, g, q, k, v, r, u, rr, doc)
  row = lambda last: ((None, None, g.b, last), lambda b, h, n: (b, h, n, 0))
  o, lse = _call(
      fl,
      g,
      functools.partial(_fwd_kernel, p, g, fl),
      (bsz, nh, g.Tp // g.b),
      _specs(g, True),
      [row(g.Dp), row(1)],
      [
          jax.ShapeDtypeStruct((bsz, nh, g.Tp, g.Dp), q.dtype),
          jax.ShapeDtypeStruct((bsz, nh, g.Tp, 1), jnp.float32),
      ],
      mlen,
      args,
      "txl_attention_fwd",
      p,
  )
  return o[:, :, : p.T, :dh], lse[:, :, : p.T, 0]


def _backward(fl: Flavor, p: Problem, q, k, v, r, u, rr, mlen, doc, lse, delta, do):
  """(dq, dk, dv, dr, du, drr) of the inputs' shapes; du, drr in float32."""
  bsz, nh, _, dh = q.shape
  g = _Geometry.of(p, fl, dh)
  qp, kp, vp, r_pad, up, rrp, docp = _padded_inputs(p, g, q, k, v, r, u, rr, doc)
  dop = _pad_to(_pad_to(do, 3, g.Dp), 2, g.Tp)
  lsep = _pad_to(lse, 2, g.Tp)[..., None]
  deltap = _pad_to(delta, 2, g.Tp)[..., None]
  f32 = jnp.float32
  blk = lambda last: ((None, None, g.b, last), lambda b, h, n: (b, h, n, 0))
  full = lambda n_rows, last: ((None, None, n_rows, last), lambda b, h, n: (b, h, 0, 0))

  dqu, dqv = _call(
      fl,
      g,
      functools.partial(_dq_kernel, p, g, fl),
      (bsz, nh, g.Tp // g.b),
      _specs(g, True) + [blk(g.Dp), blk(1), blk(1)],
      [blk(g.Dp), blk(g.Dp)],
      [jax.ShapeDtypeStruct((bsz, nh, g.Tp, g.Dp), f32)] * 2,
      mlen,
      (qp, kp, vp, r_pad, up, rrp, docp, dop, lsep, deltap),
      "txl_attention_dq",
      p,
  )
  dk, dv = _call(
      fl,
      g,
      functools.partial(_dkv_kernel, p, g, fl),
      (bsz, nh, g.Kp // g.b),
      _specs(g, False) + [full(g.Tp, g.Dp), full(g.Tp, 1), full(g.Tp, 1)],
      [blk(g.Dp), blk(g.Dp)],
      [
          jax.ShapeDtypeStruct((bsz, nh, g.Kp, g.Dp), k.dtype),
          jax.ShapeDtypeStruct((bsz, nh, g.Kp, g.Dp), v.dtype),
      ],
      mlen,
      (qp, kp, vp, r_pad, up, rrp, docp, dop, lsep, deltap),
      "txl_attention_dkv",
      p,
  )
  # dr: keys padded so that each tile's band of 2b keys starts at row >= 0.
  k_len = g.Kp + g.Tp + 2 * g.b
  kd = _pad_to(kp, 2, k_len, front=p.T - 1 + g.b)
  vd = _pad_to(vp, 2, k_len, front=p.T - 1 + g.b)
  r_blk = ((None, g.b, g.Dp), lambda b, h, n: (h, n, 0))
  bias = ((None, 1, g.Dp), lambda b, h, n: (h, 0, 0))
  (dr_b,) = _call(
      fl,
      g,
      functools.partial(_dr_kernel, p, g, fl),
      (bsz, nh, g.Kp // g.b),
      [
          full(g.Tp, g.Dp),
          full(k_len, g.Dp),
          full(k_len, g.Dp),
          r_blk,
          bias,
          bias,
          ((None, g.Tp, 1), lambda b, h, n: (b, 0, 0)),
          full(g.Tp, g.Dp),
          full(g.Tp, 1),
          full(g.Tp, 1),
      ],
      [blk(g.Dp)],
      [jax.ShapeDtypeStruct((bsz, nh, g.Kp, g.Dp), f32)],
      mlen,
      (qp, kd, vd, _pad_to(_pad_to(r, 2, g.Dp), 1, g.Kp), up, rrp, docp, dop, lsep, deltap),
      "txl_attention_dr",
      p,
  )
  dq = (dqu + dqv)[:, :, : p.T, :dh].astype(q.dtype)
  du = jnp.sum(dqu[:, :, : p.T, :dh], axis=(0, 2))
  drr = jnp.sum(dqv[:, :, : p.T, :dh], axis=(0, 2))
  dr = jnp.sum(dr_b, axis=0)[:, : p.K, :dh].astype(r.dtype)
  return dq, dk[:, :, : p.K, :dh], dv[:, :, : p.K, :dh], dr, du, drr


def _on_backend(fn, flavor: Flavor | None, *args):
  """``fn(flavor, *args)`` for the given flavor, or per platform at lowering:
  tpu -> Mosaic, cuda/rocm -> Triton, anything else -> TPU's kernels in
  interpret mode (CPU; exact, slow)."""
  if flavor is not None:
    return fn(flavor, *args)
  return jax.lax.platform_dependent(
      *args,
      tpu=functools.partial(fn, TPU),
      cuda=functools.partial(fn, GPU),
      rocm=functools.partial(fn, GPU),
      default=functools.partial(fn, INTERPRET),
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(flavor, p, q, k, v, r, u, rr, mlen, doc):
  return _on_backend(lambda fl, *a: _forward(fl, p, *a)[0], flavor, q, k, v, r, u, rr, mlen, doc)


def _attention_fwd(flavor, p, q, k, v, r, u, rr, mlen, doc):
  o, lse = _on_backend(lambda fl, *a: _forward(fl, p, *a), flavor, q, k, v, r, u, rr, mlen, doc)
  return o, (q, k, v, r, u, rr, mlen, doc, o, lse)


def _attention_bwd(flavor, p, res, do):
  q, k, v, r, u, rr, mlen, doc, o, lse = res
  delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
  dq, dk, dv, dr, du, drr = _on_backend(
      lambda fl, *a: _backward(fl, p, *a), flavor, q, k, v, r, u, rr, mlen, doc, lse, delta, do
  )
  return dq, dk, dv, dr, du.astype(u.dtype), drr.astype(rr.dtype), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def rel_attention(
    q_BxTxHxDh: Array,
    k_BxKxHxDh: Array,
    v_BxKxHxDh: Array,
    r_KxHxDh: Array,
    u_HxDh: Array,
    rr_HxDh: Array,
    mlen_B: Array,
    doc_pos_BxT: Array | None = None,
    *,
    mem_len: int,
    same_length: bool,
    flavor: Flavor | None = None,
) -> Array:
  """Transformer-XL attention vectors, fused: [B, T, H, Dh] in q's dtype.

  Equals ``attention_ops.attend`` with attn_type 0's score function
  (before ``o_net``, without dropatt) for every query that may attend to
  at least one key; differentiable in q, k, v, r, u and rr.

  Args:
    q_BxTxHxDh: queries of the T segment positions.
    k_BxKxHxDh: keys of the K = mem_len + T positions (memory slots first).
    v_BxKxHxDh: their values.
    r_KxHxDh: the projected position rows W_kR R for distances K-1..0
      (clamp_len already applied).
    u_HxDh: the content bias u of Sec. 3.3.
    rr_HxDh: the position bias v of Sec. 3.3.
    mlen_B: int32 [B], valid memory slots per row (``attention_mask``).
    doc_pos_BxT: optional int [B, T], each query's offset in its document.
    mem_len: M (static).
    same_length: every query sees at most M keys (static).
    flavor: force a backend's kernels (tests: ``Flavor("gpu", 16,
      interpret=True)``); None chooses per platform at lowering time.

  Under a context mesh (``sharding.traced_with_mesh``; the train, eval and
  generation steps set one) of more than one device the call is a
  ``shard_map``: each device runs the kernels on its batch rows (mesh axes
  "data", "fsdp") and heads ("model"); an axis that does not divide its
  dimension is not used (those inputs are replicated).

  Raises:
    ValueError: if the shapes do not agree.
  """
  bsz, t, nh, dh = q_BxTxHxDh.shape
  klen = k_BxKxHxDh.shape[1]
  if (
      k_BxKxHxDh.shape != (bsz, klen, nh, dh)
      or v_BxKxHxDh.shape != k_BxKxHxDh.shape
      or r_KxHxDh.shape != (klen, nh, dh)
      or klen != mem_len + t
      or u_HxDh.shape != (nh, dh)
      or rr_HxDh.shape != (nh, dh)
  ):
    raise ValueError(
        f"rel_attention: shapes do not agree: q {q_BxTxHxDh.shape}, k {k_BxKxHxDh.shape}, "
        f"v {v_BxKxHxDh.shape}, r {r_KxHxDh.shape}, u {u_HxDh.shape}, v-bias {rr_HxDh.shape}, "
        f"mem_len {mem_len} (need K = mem_len + T keys and position rows)"
    )
  dtype = q_BxTxHxDh.dtype
  p = Problem(
      T=t,
      K=klen,
      M=mem_len,
      same_length=bool(same_length),
      scale=dh**-0.5,
      has_doc=doc_pos_BxT is not None,
  )
  doc = (
      jnp.full((bsz, t), NO_DOCUMENT, jnp.int32)
      if doc_pos_BxT is None
      else doc_pos_BxT.astype(jnp.int32)
  )
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, N, H, Dh] -> [B, H, N, Dh]

  def local(q, k, v, r, u, rr, mlen, doc):  # on one device's rows and heads
    out_BxHxTxDh = _attention(
        flavor,
        p,
        heads_first(q),
        heads_first(k),
        heads_first(v),
        jnp.swapaxes(r, 0, 1),
        u,
        rr,
        mlen,
        doc,
    )
    return jnp.swapaxes(out_BxHxTxDh, 1, 2)

  args = (
      q_BxTxHxDh,
      k_BxKxHxDh.astype(dtype),
      v_BxKxHxDh.astype(dtype),
      r_KxHxDh.astype(dtype),
      u_HxDh.astype(dtype),
      rr_HxDh.astype(dtype),
      mlen_B.astype(jnp.int32),
      doc,
  )
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(*args)
  # Pallas kernels are not partitioned by XLA: one call per device, on its
  # rows (the batch axes) and heads ("model"), where those divide.
  rows = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  rows = rows if rows and bsz % math.prod(mesh.shape[a] for a in rows) == 0 else None
  heads = "model" if "model" in mesh.axis_names and nh % mesh.shape["model"] == 0 else None
  bthd = P(rows, None, heads, None)
  specs = (
      bthd,
      bthd,
      bthd,
      P(None, heads, None),
      P(heads, None),
      P(heads, None),
      P(rows),
      P(rows, None),
  )
  return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=bthd, check_vma=False)(*args)


def xla_reference(
    q_BxTxHxDh: Array,
    k_BxKxHxDh: Array,
    v_BxKxHxDh: Array,
    r_KxHxDh: Array,
    u_HxDh: Array,
    rr_HxDh: Array,
    mlen_B: Array,
    doc_pos_BxT: Array | None = None,
    *,
    mem_len: int,
    same_length: bool,
) -> Array:
  """What ``rel_attention`` replaces: attn_type 0's XLA path, the
  [H, B, T, K] scores and probabilities of ``attention_ops`` (no blocks, no
  dropatt): [B, T, H, Dh] in q's dtype.  For the tests and the benchmark."""
  t, dh = q_BxTxHxDh.shape[1], q_BxTxHxDh.shape[3]
  mask_1xBxTxK = jnp.swapaxes(
      attention_ops.attention_mask(t, mem_len, mlen_B, same_length, doc_pos_BxT), 0, 1
  )
  score_HxBxTxK = (
      attention_ops.content_scores(q_BxTxHxDh + u_HxDh, k_BxKxHxDh)
      + attention_ops.rel_shift(attention_ops.position_scores(q_BxTxHxDh + rr_HxDh, r_KxHxDh))
  ) * dh**-0.5
  prob_HxBxTxK = jax.nn.softmax(jnp.where(mask_1xBxTxK, score_HxBxTxK, MASK_VALUE), axis=-1)
  vec_HxBxTxDh = attention_ops.weighted_values(prob_HxBxTxK.astype(q_BxTxHxDh.dtype), v_BxKxHxDh)
  return jnp.transpose(vec_HxBxTxDh, (1, 2, 0, 3))
