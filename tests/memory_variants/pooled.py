"""``pooled_test``: the XL memory plus one slot, a learned summary of what it
last dropped (test only).

Besides the XL memory of mem_len slots, each layer keeps one extra slot
holding a learned summary (a Dense projection of the mean) of the inputs
that the XL memory dropped in the last segment, and sows an auxiliary loss
(the projection's squared error against that mean) into the ``losses``
collection.  The extra slot sits at the front of the key layout, so the
masks and relative positions need no change: it becomes visible once
mem_len + 1 slots are valid, which is exactly when the XL memory first
dropped an input.  It uses ``slots`` and ``layer_update`` (a variant
shaped like the compressive memory) and has no settings.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model import attention_ops, memory


@memory.register
class PooledMemory(memory.MemoryVariant):
  """The XL memory plus one slot: a learned summary of what it last dropped."""

  name = "pooled_test"
  DECODE_CACHE = False  # not a FIFO of the layer inputs

  @classmethod
  def slots(cls, mem_len, cfg):
    return mem_len + 1 if mem_len else 0

  @classmethod
  def layer_update(cls, module, cfg, mem_BxMxD, h_BxTxD, key_count_B):
    if mem_BxMxD.shape[1] == 0:
      return memory.layer_update(mem_BxMxD, h_BxTxD)
    tgt_len = h_BxTxD.shape[1]
    xl_BxMxD = mem_BxMxD[:, 1:]
    cat_BxKxD = jnp.concatenate([xl_BxMxD, h_BxTxD], axis=1)
    dropped_mean_Bx1xD = cat_BxKxD[:, :tgt_len].mean(axis=1, keepdims=True)
    summary_Bx1xD = nn.Dense(
        cfg.d_model,
        dtype=cfg.compute_dtype,
        name="pool_proj",
        kernel_init=attention_ops.normal_init(cfg.init_std, "embed", "kv"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("kv",)),
    )(jax.lax.stop_gradient(dropped_mean_Bx1xD))
    module.sow(
        "losses",
        "pool_mse",
        jnp.mean(jnp.square(summary_Bx1xD.astype(jnp.float32) - dropped_mean_Bx1xD)),
    )
    new_xl_BxMxD = memory.layer_update(xl_BxMxD, h_BxTxD)
    return jax.lax.stop_gradient(
        jnp.concatenate([summary_Bx1xD.astype(h_BxTxD.dtype), new_xl_BxMxD], axis=1)
    )
