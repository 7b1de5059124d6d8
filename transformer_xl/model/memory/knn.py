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

import dataclasses
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl.model.memory.state import DOC_POS, LAYER_INDEX, Leaf
from transformer_xl.model.memory.variant import MemoryVariant, register

Array = jax.Array

# The score of an empty slot: meliad's ``-1e6`` mask, computed in bfloat16.
EMPTY_SCORE = float(np.asarray(-1e6, dtype=jnp.bfloat16))  # numpy (ml_dtypes): no backend at import
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
  """Writes one segment into the store, a ring buffer: entry j at slot
  ``(index + j) mod S``, overwriting the oldest once the store is full
  (meliad ``MemoryOnTpu.update``, which writes at ``index mod S`` a segment
  of T entries, S a multiple of T: the same slots).  A segment longer than
  the store leaves its last S entries.  No gradient flows into the store.

  Args:
    keys_BxHxSxDh: the store's keys.
    values_BxHxSxDh: the store's values.
    index_B: int32 [B], entries written to each row since its last reset.
    new_keys_BxHxTxDh: the segment's (normalised) keys; a zero key marks an
      entry as empty (e.g. padding).
    new_values_BxHxTxDh: the segment's values.

  Returns:
    (keys, values, index_B + T), the store's dtypes.
  """
  s, t = keys_BxHxSxDh.shape[2], new_keys_BxHxTxDh.shape[2]
  skip = max(t - s, 0)  # entries overwritten within this write
  slot_BxT = (index_B[:, None] + skip + jnp.arange(t - skip)[None, :]) % s

  def put(store_BxHxSxDh, new_BxHxTxDh):
    new_BxHxTxDh = jax.lax.stop_gradient(new_BxHxTxDh[:, :, skip:]).astype(store_BxHxSxDh.dtype)
    return jax.vmap(lambda x_HxSxD, n_HxTxD, i_T: x_HxSxD.at[:, i_T].set(n_HxTxD))(
        store_BxHxSxDh, new_BxHxTxDh, slot_BxT
    )

  keys = put(keys_BxHxSxDh, new_keys_BxHxTxDh)
  values = put(values_BxHxSxDh, new_values_BxHxTxDh)
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
    keys_BxHxSxDh: the store's keys.
    values_BxHxSxDh: the store's values.
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


# ---- The memory variant: model.memory = "knn" --------------------------------------


@dataclasses.dataclass(frozen=True)
class KNNSettings:
  """``model.knn``: the kNN memory's settings (meliad's names in brackets;
  defaults as their gin configs).

  Attributes:
    memory_size: S, (key, value) entries per row, head and memory layer
      (``memory_on_tpu_factory.database_size``: 8192; the paper's largest
      runs 32768, up to 262144); 0: no store, the memory layers attend
      locally only (the model without its memory: ``eval.knn.memory_size=0``).
    num_neighbors: k, the entries each query reads
      (``TransformerLayer.memory_num_neighbors``: 128); with "bucketed"
      retrieval a divisor of ``memory_size``.
    layers: the layers with a memory, negative counting from the top
      (``DecoderStack.memory_layer_indices``: (-4,), the 9th of 12 as the
      paper).  Every layer has the gate's and the scale's parameters (the
      layers are one scan), used only here.
    retrieval: "bucketed" (theirs), "exact" or "approx" (``RETRIEVALS``).
    recall_target: "approx" only: ``jax.lax.approx_max_k``'s (0, 1].
  """

  memory_size: int = 8192
  num_neighbors: int = 128
  layers: tuple[int, ...] = (-4,)
  retrieval: str = "bucketed"
  recall_target: float = 0.95

  def __post_init__(self):  # a config file's list, hashable as the model config needs
    if isinstance(self.layers, list):
      object.__setattr__(self, "layers", tuple(self.layers))

  def memory_layers(self, n_layer: int) -> tuple[int, ...]:
    """``layers`` as indices in [0, n_layer), sorted: the order of the
    store's leading axis."""
    return tuple(sorted({i % n_layer for i in self.layers}))


_STORE = Leaf((None, "batch", "heads", None, "kv"), carried=True)


def _store_problems(s, eval_keys=()):
  """The store's size against k (``s``: the settings as a dict), each key
  named ``model.knn.<key>``, or ``eval.knn.<key>`` when in ``eval_keys``
  (the evaluation's overrides)."""
  name = lambda key: f"{'eval' if key in eval_keys else 'model'}.knn.{key}"
  size, k = s["memory_size"], s["num_neighbors"]
  if size == 0:  # no store: nothing is read
    return []
  if k > size:
    return [f"{name('num_neighbors')}={k} is more than {name('memory_size')}={size} entries."]
  if s["retrieval"] == "bucketed" and size % k:
    return [
        f"{name('memory_size')}={size} must be a multiple of {name('num_neighbors')}={k} "
        f"with {name('retrieval')}='bucketed' (slots grouped by index mod k), or use "
        "retrieval='exact'."
    ]
  return []


@register
class KNNMemory(MemoryVariant):
  """The kNN memory of Memorizing Transformers (Wu et al. 2022, Sec. 3),
  ``model.memory="knn"``: the XL memory (its cache, unchanged) and, at the
  layers ``model.knn.layers``, a store of past keys and values read by the
  attention (``combine``): the module docstring says what is the authors'
  and what is decided here.

  State (``Memory.variant_state``; carried through the layers, one store
  per memory layer N, not per layer): ``knn_keys_NxBxHxSxDh`` (normalised
  keys) and ``knn_values_NxBxHxSxDh`` in the compute dtype, and
  ``knn_index_NxB`` (int32, entries written since the row's last reset).
  Heads split over the ``model`` mesh axis, rows over the batch axes.
  Bytes per row and memory layer: ``2 H S Dh`` times the compute dtype's
  size, plus 4 (for H = 8, Dh = 64, S = 32768 in bfloat16: 64 MiB).

  Per segment, in each memory layer: the rows that start a stream are
  emptied (``reset``, before the layers); each query of the segment reads
  its neighbours from the store as it was before the segment; the
  segment's keys (normalised) and values are written (front padding as
  empty entries).  With documents masked apart (``state.DOC_POS`` in the
  hooks' state), a document's start empties the store: its queries read
  nothing (a zero memory vector, as an empty store gives) and the segment
  writes its last document's entries only, into an emptied store.
  Parameters per layer (all layers; used at the memory
  layers): ``knn_gate_bias`` [H] (zeros) and ``knn_scale`` [H] (ones; the
  memory attention scales its logits by its absolute value, as meliad's
  ``attention_scale``).
  """

  name = "knn"
  Settings = KNNSettings
  # The paper evaluates with larger stores than it trains with (Sec. 4.2).
  EVAL_OVERRIDES = ("memory_size", "num_neighbors", "retrieval")
  EVAL_WITHOUT = types.MappingProxyType({"memory_size": 0})  # --mode=eval's "without the store"
  STATE = {
      "knn_keys_NxBxHxSxDh": _STORE,
      "knn_values_NxBxHxSxDh": _STORE,
      "knn_index_NxB": Leaf((None, "batch"), carried=True),
  }
  DOCUMENTS = True  # a document's start empties the row's store (``combine``)
  DECODE_CACHE = False  # each pass writes the store
  WHOLE_SEGMENTS = True  # a token never reads its own segment: generation re-runs segments

  @classmethod
  def settings_problems(cls, section):
    problems = []
    for key, least in (("memory_size", 0), ("num_neighbors", 1)):
      n = section[key]
      if isinstance(n, bool) or not isinstance(n, int) or n < least:
        problems.append(f"model.knn.{key}={n!r} must be an integer >= {least}.")
    layers = section["layers"]
    if (
        not isinstance(layers, (tuple, list))
        or not layers
        or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
    ):
      problems.append(
          f"model.knn.layers={layers!r} must be a non-empty tuple of layer indices, e.g. (-4,)."
      )
    if section["retrieval"] not in RETRIEVALS:
      problems.append(f"model.knn.retrieval={section['retrieval']!r}: use one of {RETRIEVALS}.")
    r = section["recall_target"]
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1:
      problems.append(f"model.knn.recall_target={r!r} must be in (0, 1].")
    return problems

  @classmethod
  def config_problems(cls, fields):
    s, n_layer = fields[cls.name], fields.get("n_layer", 1)
    problems = []
    bad = [i for i in s["layers"] if not -n_layer <= i < n_layer]
    if bad:
      problems.append(
          f"model.knn.layers={tuple(s['layers'])!r}: layer {bad[0]} is not one of the "
          f"{n_layer} layers (use -{n_layer} .. {n_layer - 1})."
      )
    return problems + _store_problems(s)

  @classmethod
  def eval_problems(cls, fields, eval_fields):
    given = {k: v for k, v in (eval_fields.get(cls.name) or {}).items() if v is not None}
    if not given:  # the model's own settings: config_problems checks them
      return []
    problems = cls.settings_problems({**fields[cls.name], **given})
    if problems:  # those of the overrides given, under their eval.knn.* names
      named = [p for p in problems if any(f"model.knn.{k}=" in p for k in given)]
      for k in given:
        named = [p.replace(f"model.knn.{k}=", f"eval.knn.{k}=") for p in named]
      return named
    return _store_problems({**fields[cls.name], **given}, eval_keys=given) if given else []

  @classmethod
  def example(cls):
    return {
        "memory": cls.name,
        cls.name: {"memory_size": 16, "num_neighbors": 4, "layers": (-1,)},
    }

  @classmethod
  def init_state(cls, cfg, batch_size):
    s = cls.settings(cfg)
    n = len(s.memory_layers(cfg.n_layer))
    shape = (n, batch_size, cfg.n_head, s.memory_size, cfg.d_head)
    return {
        "knn_keys_NxBxHxSxDh": jnp.zeros(shape, cfg.compute_dtype),
        "knn_values_NxBxHxSxDh": jnp.zeros(shape, cfg.compute_dtype),
        "knn_index_NxB": jnp.zeros((n, batch_size), jnp.int32),
    }

  @classmethod
  def reset(cls, state, reset_B):
    keys, values, index = jax.vmap(lambda k, v, i: reset(k, v, i, reset_B))(
        state["knn_keys_NxBxHxSxDh"], state["knn_values_NxBxHxSxDh"], state["knn_index_NxB"]
    )
    return {"knn_keys_NxBxHxSxDh": keys, "knn_values_NxBxHxSxDh": values, "knn_index_NxB": index}

  @classmethod
  def combine(cls, attn, cfg, q_BxExHxDh, k_BxKxHxDh, v_BxKxHxDh, vec_BxExHxDh, state, key_count_B):
    s = cls.settings(cfg)
    heads = lambda init: nn.with_logical_partitioning(init, ("heads",))
    bias_H = attn.param("knn_gate_bias", heads(nn.initializers.zeros), (cfg.n_head,), jnp.float32)
    scale_H = attn.param("knn_scale", heads(nn.initializers.ones), (cfg.n_head,), jnp.float32)
    if s.memory_size == 0:  # no store: the local attention alone
      return vec_BxExHxDh, {k: state[k] for k in cls.STATE}
    layers = jnp.asarray(s.memory_layers(cfg.n_layer), jnp.int32)
    hit_N = layers == state[LAYER_INDEX]
    j = jnp.argmax(hit_N)  # this layer's store (when it has one)
    e = q_BxExHxDh.shape[1]
    store = (state["knn_keys_NxBxHxSxDh"], state["knn_values_NxBxHxSxDh"], state["knn_index_NxB"])
    # Documents inside the segment (data.documents="reset"): a document's start empties the
    # row's store, as a reset row's.  Its queries read nothing (what an empty store gives: a
    # zero memory vector), and the segment writes its last document's entries only, into an
    # emptied store.
    i_E = jnp.arange(e)
    doc_pos_BxE = state.get(DOC_POS)
    if doc_pos_BxE is None:
      read_BxE = jnp.ones((q_BxExHxDh.shape[0], e), bool)
      last_start_B = jnp.full((q_BxExHxDh.shape[0],), -1)
    else:  # a query's document started in this segment where doc_pos <= its position
      read_BxE = doc_pos_BxE > i_E[None, :]
      last_start_B = jnp.max(jnp.where(read_BxE, -1, i_E[None, :] - doc_pos_BxE), axis=1)

    def read_and_write(operands):
      (keys_N, values_N, index_N), vec = operands
      keys, values, index = keys_N[j], values_N[j], index_N[j]
      q_n = normalize(q_BxExHxDh)
      rk, rv, _, _ = retrieve(
          jnp.swapaxes(q_n, 1, 2),
          keys,
          values,
          s.num_neighbors,
          s.retrieval,
          s.recall_target,
      )
      memory_BxExHxDh = attend(
          q_n, jnp.swapaxes(rk, 1, 2), jnp.swapaxes(rv, 1, 2), jnp.abs(scale_H)
      )
      if doc_pos_BxE is not None:
        memory_BxExHxDh = jnp.where(read_BxE[:, :, None, None], memory_BxExHxDh, 0)
      out = gate(vec, memory_BxExHxDh, bias_H).astype(vec.dtype)
      # The segment's entries; the front padding (key_count_B < 0) and the entries before
      # the last document start as empty ones, in a store emptied at that start.
      if doc_pos_BxE is not None:
        keys, values, index = reset(keys, values, index, last_start_B >= 0)
      first_B = jnp.maximum(jnp.maximum(-key_count_B, 0), last_start_B)
      valid_BxE = i_E[None, :] >= first_B[:, None]
      new_k = jnp.where(valid_BxE[:, :, None, None], normalize(k_BxKxHxDh[:, -e:]), 0.0)
      new_v = jnp.where(valid_BxE[:, :, None, None], v_BxKxHxDh[:, -e:], 0)
      keys, values, index = write(
          keys, values, index, jnp.swapaxes(new_k, 1, 2), jnp.swapaxes(new_v, 1, 2)
      )
      new_store = (keys_N.at[j].set(keys), values_N.at[j].set(values), index_N.at[j].set(index))
      return out, new_store

    def skip(operands):
      store_, vec = operands
      return vec, store_

    out, (keys_N, values_N, index_N) = jax.lax.cond(
        jnp.any(hit_N), read_and_write, skip, (store, vec_BxExHxDh)
    )
    return out, {
        "knn_keys_NxBxHxSxDh": keys_N,
        "knn_values_NxBxHxSxDh": values_N,
        "knn_index_NxB": index_N,
    }
