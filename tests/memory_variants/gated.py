"""``gated_test``: a store of keys and values read at attention time through a
learned gate, the shape of a kNN memory (test only).

Beside the XL memory (unchanged), each layer keeps per row and head a store
of the last ``store_len`` keys and values its attention projected (a FIFO,
written a whole segment at a time, no gradient into it).  Each query
attends over the store's valid entries (content only: no position terms),
and the result is combined with the layer's own attention by a learned
per-head gate, ``local * (1 - g) + store * g`` with ``g = sigmoid(b)``, b
starting at 0 (Memorizing Transformers' combination, Wu et al. 2022, Sec.
3.2).  Per segment: reset, read, write, so a token never reads its own
segment from the store.  A reset row (a new stream, a document start)
empties its store.

It uses the interface's settings (``model.gated_test.store_len``), its
per-layer state (``STATE``, the heads split over the ``model`` mesh axis)
and the attention-time hook (``combine``), and nothing else of the package
knows it.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model import attention_ops, memory


@dataclasses.dataclass(frozen=True)
class GatedSettings:
  """``model.gated_test``.

  Attributes:
    store_len: entries of the store per layer, row and head (>= 1).
  """

  store_len: int = 4


@memory.register
class GatedStore(memory.MemoryVariant):
  """A per-layer store of keys and values, read through a learned gate."""

  name = "gated_test"
  Settings = GatedSettings
  STATE = {
      "store_keys_LxBxHxSxDh": memory.Leaf(("layers", "batch", "heads", None, "kv")),
      "store_values_LxBxHxSxDh": memory.Leaf(("layers", "batch", "heads", None, "kv")),
      "store_count_LxB": memory.Leaf(("layers", "batch")),
  }
  DOCUMENTS = False  # the store does not keep documents apart inside a segment

  @classmethod
  def settings_problems(cls, section):
    n = section["store_len"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      return [f"model.gated_test.store_len={n!r} must be an integer >= 1."]
    return []

  @classmethod
  def example(cls):
    return {"memory": cls.name, cls.name: {"store_len": 6}}

  @classmethod
  def init_state(cls, cfg, batch_size):
    s = cls.settings(cfg).store_len
    shape = (cfg.n_layer, batch_size, cfg.n_head, s, cfg.d_head)
    return {
        "store_keys_LxBxHxSxDh": jnp.zeros(shape, cfg.compute_dtype),
        "store_values_LxBxHxSxDh": jnp.zeros(shape, cfg.compute_dtype),
        "store_count_LxB": jnp.zeros((cfg.n_layer, batch_size), jnp.int32),
    }

  @classmethod
  def reset(cls, state, reset_B):
    return {**state, "store_count_LxB": jnp.where(reset_B[None, :], 0, state["store_count_LxB"])}

  @classmethod
  def combine(cls, attn, cfg, q_BxExHxDh, k_BxKxHxDh, v_BxKxHxDh, vec_BxExHxDh, state, key_count_B):
    keys_BxHxSxDh = state["store_keys_LxBxHxSxDh"]
    values_BxHxSxDh = state["store_values_LxBxHxSxDh"]
    count_B = state["store_count_LxB"]
    s, e, d_head = keys_BxHxSxDh.shape[2], q_BxExHxDh.shape[1], q_BxExHxDh.shape[-1]
    # Read: the queries over the valid entries (right-aligned), no positions.
    score_BxHxExS = jnp.einsum(
        "behd,bhsd->bhes", q_BxExHxDh, keys_BxHxSxDh, preferred_element_type=jnp.float32
    ) / jnp.sqrt(jnp.float32(d_head))
    valid_BxS = jnp.arange(s)[None, :] >= (s - count_B)[:, None]
    score_BxHxExS = jnp.where(valid_BxS[:, None, None, :], score_BxHxExS, attention_ops.MASK_VALUE)
    prob_BxHxExS = jax.nn.softmax(score_BxHxExS, axis=-1) * (count_B > 0)[:, None, None, None]
    store_BxExHxDh = jnp.einsum(
        "bhes,bhsd->behd", prob_BxHxExS, values_BxHxSxDh.astype(jnp.float32)
    )
    bias_H = attn.param(
        "gate_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("heads",)), (cfg.n_head,)
    )
    g_1x1xHx1 = jax.nn.sigmoid(bias_H)[None, None, :, None]
    out_BxExHxDh = vec_BxExHxDh.astype(jnp.float32) * (1 - g_1x1xHx1) + store_BxExHxDh * g_1x1xHx1
    # Write: the segment's keys and values (the valid ones: front padding is
    # at the segment's start), oldest evicted first.
    seg_k_BxHxExDh = jnp.swapaxes(k_BxKxHxDh[:, -e:], 1, 2).astype(keys_BxHxSxDh.dtype)
    seg_v_BxHxExDh = jnp.swapaxes(v_BxKxHxDh[:, -e:], 1, 2).astype(values_BxHxSxDh.dtype)
    new_keys = jnp.concatenate([keys_BxHxSxDh, seg_k_BxHxExDh], axis=2)[:, :, -s:]
    new_values = jnp.concatenate([values_BxHxSxDh, seg_v_BxHxExDh], axis=2)[:, :, -s:]
    written_B = jnp.maximum(e - jnp.maximum(-key_count_B, 0), 0)
    new_state = {
        "store_keys_LxBxHxSxDh": jax.lax.stop_gradient(new_keys),
        "store_values_LxBxHxSxDh": jax.lax.stop_gradient(new_values),
        "store_count_LxB": jnp.minimum(s, count_B + written_B).astype(jnp.int32),
    }
    return out_BxExHxDh.astype(vec_BxExHxDh.dtype), new_state
