"""The associative memory of ARMT (Rodkin, Kuratov, Bulatov, Burtsev 2024,
"Associative Recurrent Memory Transformer", arXiv 2407.04841), as pure
functions: one layer's read and write, exact to the authors' code
(RodkinIvan/associative-recurrent-memory-transformer,
``modeling_amt/language_modeling.py``: ``DPFP``,
``AssociativeLayerWrapper.associate`` and ``update_mem``), checked against
fixtures made by running it (``scripts/make_armt_fixtures.py``,
``tests/test_armt_memory.py``).

Per layer and row, the memory is a matrix ``A`` [d_key, d_model] and a
normaliser ``z`` [d_key], both zeros at a row's start, with
``d_key = 2 nu d_mem`` (nu = 3, the DPFP features of a d_mem projection).

* **Read** (before the layer, every row of the segment, memory-token rows
  included): ``q = phi(h W_q)``, ``read = q A / (q . z + 1e-5)``, added to
  the layer's input ``h``.  The authors skip it in a row's first segment,
  where ``A = 0`` makes it exactly 0 anyway: here it always runs.
* **Write** (after the layer, from its outputs ``m`` at the N memory-token
  rows, all from the segment's pre-write state): ``k = phi(m W_k)``, ``v =
  m W_v`` (``W_v`` starts at zeros: an untrained model reads 0), the value
  already stored under ``k``, ``v_old = k A / (k . z + 1e-5)`` (0 in a row's
  first segment), the write gate ``b = sigmoid(m w_b + b_b)``; then ``A +=
  sum_n b_n k_n (v_n - v_old_n)^T`` and ``z += sum_n g_n k_n``, where the
  correction ``g_n = clip(1 - (k_n . z + 1e-5) / (|k_n|^2 + 1e-5), 0, 1)``,
  held constant for the gradient (``detach``), is 1 in a row's first
  segment and without ``correction``.

Traits of their code kept (each said in the docs): the write gate enters
the matrix's update and not the normaliser's; the correction enters the
normaliser's and not the matrix's; denominators add a plain 1e-5 (a read
where ``q . z`` is near -1e-5 is large: the tests compare such rows with a
relative tolerance).  ``phi`` is their DPFP with nu = 3 (Schlag et al.
2021): ``x' = [relu(x), relu(-x)]``, then ``concat_j (x' * roll(x', j))``
for j = 1..nu.

Shapes: B rows, T positions of the segment (memory-token rows last), N
memory tokens, D = d_model, M = d_mem, K = d_key.  Weights are stored as
``[in, out]`` (a flax Dense kernel; the authors' torch ``Linear.weight``
transposed).  The memory variant (``model.memory="armt"``) that carries
these through a model is not built yet.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

NU = 3  # their DPFP(nu=3)
EPS = 1e-5  # their denominators' constant


def d_key(d_mem: int, nu: int = NU) -> int:
  """K = 2 nu d_mem: the width of the DPFP features."""
  return 2 * nu * d_mem


def dpfp(x: Array, nu: int = NU) -> Array:
  """Deterministic parameter-free projection (their ``DPFP``): [..., M] ->
  [..., 2 nu M], non-negative."""
  x = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
  rolled = jnp.concatenate([jnp.roll(x, j, axis=-1) for j in range(1, nu + 1)], axis=-1)
  return jnp.concatenate([x] * nu, axis=-1) * rolled


def read(A_BxKxD: Array, z_BxK: Array, h_BxTxD: Array, w_q_DxM: Array) -> Array:
  """What each row reads (their ``associate``): ``phi(h W_q) A / (phi(h W_q)
  . z + 1e-5)``, [B, T, D] in ``h``'s dtype; the layer's input is ``h`` plus
  this."""
  q_BxTxK = dpfp(h_BxTxD @ w_q_DxM)
  num_BxTxD = jnp.einsum("btk,bkd->btd", q_BxTxK, A_BxKxD)
  denom_BxTx1 = jnp.einsum("bk,btk->bt", z_BxK, q_BxTxK)[..., None] + EPS
  return (num_BxTxD / denom_BxTx1).astype(h_BxTxD.dtype)


def write(
    A_BxKxD: Array,
    z_BxK: Array,
    m_BxNxD: Array,
    w_k_DxM: Array,
    w_v_DxD: Array,
    w_b_Dx1: Array,
    b_b_1: Array,
    first_B: Array,
    correction: bool = True,
) -> tuple[Array, Array]:
  """The matrix and normaliser after one segment's write (their
  ``update_mem``), from the layer's outputs at the memory-token rows.

  Args:
    A_BxKxD, z_BxK: the state before the write.
    m_BxNxD: the layer's outputs at the N memory-token rows.
    w_k_DxM, w_v_DxD, w_b_Dx1, b_b_1: the key, value and gate projections.
    first_B: bool [B], rows writing for the first time since their start
      (no stored value to subtract, correction 1).
    correction: their ``correction`` (the normaliser's update scaled by the
      share of the key not yet stored).

  Returns:
    (A_BxKxD, z_BxK), float32.
  """
  k_BxNxK = dpfp(m_BxNxD @ w_k_DxM)
  v_BxNxD = m_BxNxD @ w_v_DxD
  num_BxNxD = jnp.einsum("bnk,bkd->bnd", k_BxNxK, A_BxKxD)
  denom_BxNx1 = jnp.einsum("bk,bnk->bn", z_BxK, k_BxNxK)[..., None] + EPS
  first_Bx1x1 = first_B[:, None, None]
  old_BxNxD = jnp.where(first_Bx1x1, 0.0, num_BxNxD / denom_BxNx1)
  if correction:
    share = 1 - denom_BxNx1 / (jnp.sum(k_BxNxK**2, axis=-1, keepdims=True) + EPS)
    coef_BxNx1 = jax.lax.stop_gradient(jnp.clip(share, 0, 1))
    coef_BxNx1 = jnp.where(first_Bx1x1, 1.0, coef_BxNx1)
  else:
    coef_BxNx1 = jnp.ones_like(denom_BxNx1)
  gate_BxN = jax.nn.sigmoid(m_BxNxD @ w_b_Dx1 + b_b_1)[..., 0]
  A_BxKxD = A_BxKxD + jnp.einsum("bnk,bnd,bn->bkd", k_BxNxK, v_BxNxD - old_BxNxD, gate_BxN)
  z_BxK = z_BxK + jnp.sum(coef_BxNx1 * k_BxNxK, axis=1)
  return A_BxKxD, z_BxK
