"""How the same model is computed: speed and memory trade-offs, never its numbers.

Four settings of ``config.model`` change how a step is computed but not
what it computes (the same parameters and outputs, to float32 rounding), so
a checkpoint may be used with other values of them (``FREE_MODEL_KEYS``):

* ``remat``: which activations each layer keeps for the backward pass
  (``REMAT_POLICIES``, MaxText's named policies);
* ``attn_block``: queries per block of the blockwise attention
  (``attn_block_size``; ``attention_ops.query_blocks``);
* ``scan_unroll``: layers per iteration of the ``nn.scan`` loop over layers
  (``scan_unroll_layers``);
* ``attention_impl``: "xla" or "pallas", the fused kernel of attn_type 0
  (``pallas_attention``).

``attn_block`` and ``scan_unroll`` default to -1, "chosen per backend",
resolved here.  The CPU choices were measured with
``benchmarks/vs_pytorch.py`` (``benchmarks/results/REPORT.md`` has the
runs); GPU and TPU get the plain computation until they are measured.
"""

from __future__ import annotations

import jax

# Names that attention.py and models.PositionwiseFF tag with ``checkpoint_name``:
# every projection's output.  The [B, H, T, K] scores and probabilities are not in
# this list, so the "save_*" policies recompute them in the backward pass.
PROJ_NAMES = ("qkv", "r_head_k", "attn_out", "ff_1", "ff_2")

# model.remat -> the jax.checkpoint policy of each layer (None = save nothing,
# recompute the whole layer).
REMAT_POLICIES = {
    "none": None,  # no rematerialisation at all
    "full": None,  # save only the layer's inputs
    "dots": jax.checkpoint_policies.checkpoint_dots,  # every matmul, scores included
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("qkv", "r_head_k"),
    "save_proj": jax.checkpoint_policies.save_only_these_names(*PROJ_NAMES),
}

# Model fields that may differ between a checkpoint and the run that loads it.
FREE_MODEL_KEYS = ("remat", "attn_block", "scan_unroll", "attention_impl")

# What attn_block -1 means when training on CPU: blocks of 64 queries were the
# fastest of 0 (none), 32 and 64 in training; evaluation was faster without blocks.
CPU_TRAIN_ATTN_BLOCK = 64


def scan_unroll_layers(scan_unroll: int, n_layer: int) -> int:
  """``model.scan_unroll`` with -1 ("per backend") resolved: layers per
  iteration of the loop over layers (``nn.scan``'s ``unroll``), in [1, n_layer].

  -1 gives n_layer, a fully unrolled loop, on the CPU backend (faster in
  training: the scanned loop stacks every layer's backward-pass residuals
  into [L, ...] buffers and runs one layer at a time; it also takes more
  peak memory) and 1 on GPU and TPU, where nothing has been measured yet
  and an unrolled loop multiplies the compile time (on CPU, 24 layers: 17 s
  against 5 s).  The parameters ([L, ...] stacked) and the results are the
  same either way, to float32 rounding.
  """
  if scan_unroll < 0:
    return n_layer if jax.default_backend() == "cpu" else 1
  return max(1, min(scan_unroll, n_layer))


def attn_block_size(attn_block: int, deterministic: bool) -> int:
  """``model.attn_block`` with -1 ("per backend") resolved: queries per block.

  -1 gives ``CPU_TRAIN_ATTN_BLOCK`` (64) when training on the CPU
  backend (``deterministic`` False: the blocks are rematerialised, so the
  backward pass keeps no [B, H, T, K] scores) and 0, the full computation,
  otherwise: in evaluation, and on GPU and TPU, where nothing has been
  measured yet.  Other values are returned as they are.  The result is the
  same either way (``attention_ops.query_blocks``), to fp32 rounding.
  """
  if attn_block >= 0:
    return attn_block
  return CPU_TRAIN_ATTN_BLOCK if (not deterministic and jax.default_backend() == "cpu") else 0
