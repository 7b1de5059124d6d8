"""The kNN memory of Memorizing Transformers (Wu et al. 2022, "Memorizing
Transformers", arXiv 2203.08913, Sec. 3): its store and its reads, as pure
functions.

Per row, head and memory layer, a store of ``memory_size`` (S) (key, value)
pairs of past segments, written one whole segment at a time into a ring
buffer (oldest evicted first), never differentiated; each query reads its
``k`` nearest keys (cosine similarity: keys and queries unit-normalised),
attends over them without position terms, and the result is combined with
the layer's local attention by a learned per-head gate (Sec. 3.2).  The
functions follow the authors' JAX code, google-research/meliad
(``transformer/memory/memory_layer.py``: ``MemoryOnTpu``,
``_retrieve_topk_gatherless``; ``transformer/attention.py``:
``external_attention``; ``transformer/memory/transformer_layer.py``: the
gate), and are checked against fixtures made by running it
(``scripts/make_knn_fixtures.py``, ``tests/test_knn_memory.py``).

Traits of the authors' code kept here (each a decision the paper leaves
open):

* **Bucketed retrieval** (``retrieve(mode="bucketed")``, their default, a
  TPU-friendly search with no gather): the S slots are grouped by index
  modulo k (slot s is in group s mod k); neighbour n is the best slot of
  group n, in group order, so the k neighbours are not the true top k.  The
  selection is a softmax of the scores times 1e6 over each group (a one-hot
  for distinct scores; exact ties share).  ``"exact"`` is a true top k
  (``jax.lax.top_k``) and ``"approx"`` the TPU-native approximate one
  (``jax.lax.approx_max_k`` with a recall target), both by score order.
* **Empty slots** are those whose key sums to 0 (the store starts and resets
  to zeros); they score ``EMPTY_SCORE`` (their -1e6, cast to bfloat16:
  -999424).  A group with no written slot returns a zero key and value,
  and the memory attention does not mask those (a zero key has logit 0).
* **Per segment: reset, read, write**: a token never finds its own segment
  in the store, and the previous segment is seen twice (in the XL cache and
  in the store).
* The memory attention scales the logits of normalised queries and keys by
  a learned per-head scale (theirs is the layer's own attention scale, used
  by its local attention too; Transformer-XL's local attention has none, so
  the memory attention has its own) and is combined as ``local * (1 - g) +
  memory * g``, ``g = sigmoid(bias)``, the bias a per-head parameter
  starting at 0 (theirs: ``external_memory_bias``).

Shapes: B rows, H heads, E queries (the segment), S slots, k neighbours,
Dh the head width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# The score of an empty slot: meliad's ``-1e6`` mask, computed in bfloat16.
EMPTY_SCORE = float(np.float32(jnp.asarray(-1e6, jnp.bfloat16)))
# The retrieval modes (``retrieve``).
RETRIEVALS = ("bucketed", "exact", "approx")
# The bucketed selection's softmax temperature (theirs).
_SELECT_SHARPNESS = 1e6


def normalize(x: Array) -> Array:
  """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (meliad's
  ``normalize_kq``): unit keys and queries, so a dot product is a cosine.
  Float32 in and out."""
  x = jnp.asarray(x, jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-6)


def write(
    keys_BxHxSxDh: Array,
    values_BxHxSxDh: Array,
    index_B: Array,
    new_keys_BxHxTxDh: Array,
    new_values_BxHxTxDh: Array,
) -> tuple[Array, Array, Array]:
  """Writes one segment into the store: T entries at slot ``index % S``
  onwards (S a multiple of T, so a write never wraps inside itself; the
  oldest entries are overwritten once the store is full).  No gradient
  flows into the store (meliad ``MemoryOnTpu.update``).

  Args:
    keys_BxHxSxDh, values_BxHxSxDh: the store.
    index_B: int32 [B], entries written to each row since its last reset.
    new_keys_BxHxTxDh, new_values_BxHxTxDh: the segment's (normalised) keys
      and values; a zero key marks an entry as empty (e.g. padding).

  Returns:
    (keys, values, index_B + T), the store's dtypes.

  Raises:
    ValueError: S is not a multiple of T.
  """
  s, t = keys_BxHxSxDh.shape[2], new_keys_BxHxTxDh.shape[2]
  if s % t:
    raise ValueError(f"the store's {s} slots must be a multiple of the segment's {t} entries.")
  start_B = (index_B % s).astype(jnp.int32)

  def put(store_HxSxDh, new_HxTxDh, start):
    new_HxTxDh = jax.lax.stop_gradient(new_HxTxDh).astype(store_HxSxDh.dtype)
    return jax.lax.dynamic_update_slice(store_HxSxDh, new_HxTxDh, (0, start, 0))

  keys = jax.vmap(put)(keys_BxHxSxDh, new_keys_BxHxTxDh, start_B)
  values = jax.vmap(put)(values_BxHxSxDh, new_values_BxHxTxDh, start_B)
  return keys, values, (index_B + t).astype(jnp.int32)


def reset(
    keys_BxHxSxDh: Array, values_BxHxSxDh: Array, index_B: Array, reset_B: Array
) -> tuple[Array, Array, Array]:
  """Empties the store of the rows where ``reset_B`` (bool [B]) is True:
  zeros and index 0 (meliad ``MemoryOnTpu.reset``)."""
  keep_B = ~reset_B
  keep = keep_B[:, None, None, None].astype(keys_BxHxSxDh.dtype)
  return (
      keys_BxHxSxDh * keep,
      values_BxHxSxDh * keep.astype(values_BxHxSxDh.dtype),
      jnp.where(keep_B, index_B, 0).astype(jnp.int32),
  )


def scores(q_BxHxExDh: Array, keys_BxHxSxDh: Array) -> Array:
  """The retrieval scores, float32 [B, H, E, S]: the dot products of the
  (normalised) queries and keys, ``EMPTY_SCORE`` added on empty slots (a
  key that sums to 0).  No gradient."""
  q = jax.lax.stop_gradient(jnp.asarray(q_BxHxExDh, jnp.float32))
  k = jax.lax.stop_gradient(jnp.asarray(keys_BxHxSxDh, jnp.float32))
  score_BxHxExS = jnp.einsum("bhed,bhsd->bhes", q, k)
  empty_BxHxS = jnp.sum(k, axis=-1) == 0
  return score_BxHxExS + jnp.where(empty_BxHxS, EMPTY_SCORE, 0.0)[:, :, None, :]


def retrieve(
    q_BxHxExDh: Array,
    keys_BxHxSxDh: Array,
    values_BxHxSxDh: Array,
    num_neighbors: int,
    mode: str = "bucketed",
    recall_target: float = 0.95,
) -> tuple[Array, Array, Array, Array]:
  """The ``num_neighbors`` (k) entries each query reads (no gradient).

  Args:
    q_BxHxExDh: the (normalised) queries.
    keys_BxHxSxDh, values_BxHxSxDh: the store.
    num_neighbors: k; with ``"bucketed"`` a divisor of S.
    mode: one of ``RETRIEVALS`` (see the module docstring).
    recall_target: ``"approx"`` only: ``jax.lax.approx_max_k``'s.

  Returns:
    (keys_BxHxExkxDh, values_BxHxExkxDh, score_BxHxExk, slot_BxHxExk): the
    neighbours' keys and values (the store's dtypes), their scores (float32)
    and slots (int32).  ``"bucketed"``: neighbour n is the best of the slots
    s with s mod k = n, selected by a softmax of the scores times 1e6 over
    the group (meliad ``_chunking_sparsify``); the others in decreasing
    score.

  Raises:
    ValueError: an unknown mode, k > S, or (bucketed) S not a multiple of k.
  """
  b, h, s, d = keys_BxHxSxDh.shape
  k = num_neighbors
  if mode not in RETRIEVALS:
    raise ValueError(f"retrieval mode {mode!r}: use one of {RETRIEVALS}.")
  if k > s or (mode == "bucketed" and s % k):
    raise ValueError(
        f"{k} neighbours from {s} slots: k must be at most S"
        + (" and divide it (bucketed retrieval)." if mode == "bucketed" else ".")
    )
  score_BxHxExS = scores(q_BxHxExDh, keys_BxHxSxDh)
  keys = jax.lax.stop_gradient(keys_BxHxSxDh)
  values = jax.lax.stop_gradient(values_BxHxSxDh)
  if mode == "bucketed":
    e = score_BxHxExS.shape[2]
    grouped_BxHxExGxk = score_BxHxExS.reshape(b, h, e, s // k, k)  # slot g k + n: group n
    select_BxHxExGxk = jax.nn.softmax(grouped_BxHxExGxk * _SELECT_SHARPNESS, axis=3)
    top_BxHxExk = jnp.max(grouped_BxHxExGxk, axis=3)
    slot_BxHxExk = jnp.argmax(grouped_BxHxExGxk, axis=3) * k + jnp.arange(k)
    sel = lambda x: jnp.einsum(
        "bhegn,bhgnd->bhend",
        select_BxHxExGxk,
        x.reshape(b, h, s // k, k, d).astype(jnp.float32),
    ).astype(x.dtype)
    return sel(keys), sel(values), top_BxHxExk, slot_BxHxExk.astype(jnp.int32)
  if mode == "exact":
    top_BxHxExk, slot_BxHxExk = jax.lax.top_k(score_BxHxExS, k)
  else:
    top_BxHxExk, slot_BxHxExk = jax.lax.approx_max_k(score_BxHxExS, k, recall_target=recall_target)
  gather = jax.vmap(jax.vmap(lambda x_SxD, i_Exk: x_SxD[i_Exk]))  # over B, H
  return gather(keys, slot_BxHxExk), gather(values, slot_BxHxExk), top_BxHxExk, slot_BxHxExk


def attend(
    q_BxExHxDh: Array, keys_BxExHxkxDh: Array, values_BxExHxkxDh: Array, scale_H: Array
) -> Array:
  """The memory attention (meliad ``external_attention``): each query over
  its k neighbours, logits ``scale_h * q . key`` (no position terms, no
  mask), float32 [B, E, H, Dh].  The gradient reaches the queries and the
  scale (the neighbours are constants)."""
  logits_BxHxExk = jnp.einsum(
      "behd,behkd->bhek",
      jnp.asarray(q_BxExHxDh, jnp.float32),
      jnp.asarray(keys_BxExHxkxDh, jnp.float32),
  )
  logits_BxHxExk = logits_BxHxExk * jnp.asarray(scale_H, jnp.float32)[None, :, None, None]
  prob_BxHxExk = jax.nn.softmax(logits_BxHxExk, axis=-1)
  return jnp.einsum("bhek,behkd->behd", prob_BxHxExk, jnp.asarray(values_BxExHxkxDh, jnp.float32))


def gate(local_BxExHxDh: Array, memory_BxExHxDh: Array, bias_H: Array) -> Array:
  """``local * (1 - g) + memory * g`` with ``g = sigmoid(bias_H)`` per head
  (meliad's "TRAINABLE_WEIGHTED_MEAN"), float32 [B, E, H, Dh]."""
  g_1x1xHx1 = jax.nn.sigmoid(jnp.asarray(bias_H, jnp.float32))[None, None, :, None]
  local = jnp.asarray(local_BxExHxDh, jnp.float32)
  return local * (1 - g_1x1xHx1) + jnp.asarray(memory_BxExHxDh, jnp.float32) * g_1x1xHx1
