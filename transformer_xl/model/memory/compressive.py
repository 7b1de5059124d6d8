"""The compressive memory (Rae et al. 2020, "Compressive Transformers for
Long-Range Sequence Modelling", arXiv 1911.05507): ``model.memory="compressive"``.

A ``MemoryVariant`` (``variant.py``): each layer keeps ``cmem_len``
compressed slots in front of the XL memory's ``mem_len``, filled with the
states the XL memory drops, compressed by ``cmem_fn`` (``compress``); the
attention-reconstruction loss trains the compression (``CompressiveMemory``).
Its settings are ``model.compressive`` (``CompressiveSettings``); evaluation
may give it more slots (``eval.compressive.cmem_len``, as the paper does).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model.attention_ops import MASK_VALUE, normal_init
from transformer_xl.model.memory.settings import extra_positions
from transformer_xl.model.memory.state import layer_update
from transformer_xl.model.memory.variant import MemoryVariant, register

if TYPE_CHECKING:
  from transformer_xl.model.config import ModelConfig

Array = jax.Array

# model.cmem_fn: the compression functions of Sec. 3.1 / Table 1 of the paper.
CMEM_FNS = ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")
# Those with learned parameters (trained by the reconstruction loss alone).
CMEM_LEARNED = ("conv", "dilated_conv")
# The compression network's parameters (``compress``): trained by the
# reconstruction loss alone, clipped apart (``CompressiveMemory.param_groups``).
CMEM_PARAMS = ("cmem_kernel", "cmem_bias")


@dataclasses.dataclass(frozen=True)
class CompressiveSettings:
  """``model.compressive``: the compressive memory's settings.

  Attributes:
    cmem_len: compressed-memory slots per layer (the paper's n_cm; 0 = none,
      the XL memory exactly).  The layers attend over cmem_len + mem_len
      memory slots.  Evaluation may use more (``eval.compressive.cmem_len``).
    cmem_ratio: the compression rate c >= 1: each segment's T evicted
      states become T // c compressed slots; the segment length (tgt_len,
      eval.tgt_len, plus the positions other memories add) must be a
      multiple of it (a pass of another length, generation's one-token
      passes, compresses the newest (T // c) c states).
    cmem_fn: the compression function, one of ``CMEM_FNS``: "max_pool",
      "mean_pool", "conv" (learned, kernel = stride = c; the paper's best),
      "dilated_conv" (learned, kernel c, dilation 2, stride c) or
      "most_used" (the states that received the most attention);
      ``compress``.
  """

  cmem_len: int = 0
  cmem_ratio: int = 4
  cmem_fn: str = "conv"


# The name of the attention-reconstruction loss in the "losses" collection
# (training logs it as train/aux_loss/attn_recon).
RECON_LOSS = "attn_recon"


def compressive_count(key_count_B: Array, mem_len: int, cmem_len: int, ratio: int, tgt_len: int):
  """The compressive memory's key-layout count after a segment, int32 [B].

  The count before the segment, ``key_count_B`` = cmlen + mlen - pad (the
  valid compressed slots, the valid XL slots, the front padding still to
  come), splits as x = min(count, M) (XL slots, negative with padding) and
  cmlen = max(count - M, 0): compressed slots are only ever valid behind a
  full XL memory (they come from states the XL memory dropped, and it drops
  states only once full), so the valid keys stay one contiguous run and one
  count describes them (``CompressiveMemory``).

  Of the T states that the XL update drops (the first T of [XL memory;
  segment]), ``n = clip(x + T - M, 0, T)`` are valid (a suffix); the newest
  ``(T // c) * c`` of the T are compressed, c at a time, and a compressed
  slot is valid when its c states all were: ``n // c`` new valid slots.

  Returns:
    ``min(M, x + T) + min(Nc, cmlen + n // c)``.
  """
  x_B = jnp.minimum(key_count_B, mem_len)
  cm_B = jnp.maximum(key_count_B - mem_len, 0)
  n_valid_B = jnp.clip(x_B + tgt_len - mem_len, 0, tgt_len)
  new_B = n_valid_B // ratio
  return (jnp.minimum(mem_len, x_B + tgt_len) + jnp.minimum(cmem_len, cm_B + new_B)).astype(
      jnp.int32
  )


def content_attention(
    q_BxTxHxDh: Array, k_BxNxHxDh: Array, v_BxNxHxDh: Array, valid_BxN: Array
) -> tuple[Array, Array]:
  """The content-based attention of the reconstruction loss (Rae et al.
  2020, Algorithm 2: ``attn(h, m) = softmax((h W_q)(m W_k)^T) (m W_v)``),
  per head, scaled by 1/sqrt(Dh) as the layer's attention, over the valid
  keys only; no relative-position terms, no u bias, no output projection.

  Args:
    q_BxTxHxDh: queries; k_BxNxHxDh, v_BxNxHxDh: keys and values (float32).
    valid_BxN: bool, the keys that may be attended.

  Returns:
    (out_BxTxHxDh float32, prob_BxHxTxN float32).  A row without a valid
    key gets uniform weights (the caller leaves it out of the loss).
  """
  d_head = q_BxTxHxDh.shape[-1]
  score_BxHxTxN = jnp.einsum("bthd,bnhd->bhtn", q_BxTxHxDh, k_BxNxHxDh) / d_head**0.5
  score_BxHxTxN = jnp.where(valid_BxN[:, None, None, :], score_BxHxTxN, MASK_VALUE)
  prob_BxHxTxN = jax.nn.softmax(score_BxHxTxN, axis=-1)
  return jnp.einsum("bhtn,bnhd->bthd", prob_BxHxTxN, v_BxNxHxDh), prob_BxHxTxN


def compress(
    module: nn.Module,
    cfg: ModelConfig,
    win_BxNxD: Array,
    usage_BxN: Array | None = None,
    new_B: Array | None = None,
) -> Array:
  """f_c of Rae et al. 2020 (Sec. 3.1): N = G c states -> G slots, float32.

  ``cmem_fn`` (``CMEM_FNS``), c = ``cmem_ratio`` (``CompressiveSettings``):

  * "max_pool", "mean_pool": over each run of c states (kernel = stride = c).
  * "conv": a learned 1D convolution, kernel = stride = c: slot g is
    ``sum_j x[g c + j] @ W[j] + b``, W [c, D, D] (param ``cmem_kernel``,
    N(0, init_std) like every weight of the model), b [D] (``cmem_bias``,
    zeros).  The paper's best function.
  * "dilated_conv": a learned 1D convolution of kernel c with dilation 2
    and stride c (the paper names dilated convolutions without their
    shape; our choice): slot g is ``sum_j x[g c + c - 1 - 2 (c - 1 - j)]
    @ W[j] + b``, taps reaching back from the last state of its run over
    every second state, zeros before the window.  Same params as "conv".
  * "most_used": the ``new_B[b]`` states that received the most attention,
    in their order, as the last slots (the paper: memories sorted by their
    average attention, the most used preserved).  The usage is
    ``usage_BxN`` (the caller's: the mean over heads and queries of this
    segment's content-based attention over the window,
    ``content_attention``; the layer's full attention probabilities are
    not returned by the attention, and never formed by the fused kernel);
    states that are not valid have usage -inf; ties go to the older
    state.  No parameters.

  The caller zeroes the states of the window that are not valid, so that
  no tap reads a stale state.

  Args:
    module: the layer (a compact module: parameters are created in its
      scope, stacked over layers by the scan).
    cfg: the ModelConfig.
    win_BxNxD: the states to compress, N = G c (any float dtype).
    usage_BxN: "most_used" only: float32 usage per state.
    new_B: "most_used" only: int32 [B] <= G, the valid slots to fill.

  Returns:
    float32 [B, G, D]; slots before the last ``new_B[b]`` are not valid.
  """
  settings = CompressiveMemory.settings(cfg)
  c, fn = settings.cmem_ratio, settings.cmem_fn
  b, n, d = win_BxNxD.shape
  g = n // c
  x_BxNxD = win_BxNxD.astype(jnp.float32)
  if fn == "max_pool":
    return x_BxNxD.reshape(b, g, c, d).max(axis=2)
  if fn == "mean_pool":
    return x_BxNxD.reshape(b, g, c, d).mean(axis=2)
  if fn == "most_used":
    order_BxN = jnp.argsort(-usage_BxN, axis=-1, stable=True)  # most used first
    rank_BxN = jnp.argsort(order_BxN, axis=-1, stable=True)
    keys_BxN = jnp.where(rank_BxN < new_B[:, None], jnp.arange(n)[None, :], -1)
    idx_BxG = jnp.maximum(jnp.sort(keys_BxN, axis=-1)[:, n - g :], 0)  # the chosen, in order, last
    return jnp.take_along_axis(x_BxNxD, idx_BxG[:, :, None], axis=1)
  kernel_CxDxD = module.param(
      "cmem_kernel", normal_init(cfg.init_std, None, "embed", None), (c, d, d), jnp.float32
  )
  bias_D = module.param(
      "cmem_bias", nn.with_logical_partitioning(nn.initializers.zeros, (None,)), (d,), jnp.float32
  )
  if fn == "conv":
    taps_BxGxCxD = x_BxNxD.reshape(b, g, c, d)
  else:  # dilated_conv: left-padded with c - 1 zeros, tap j of slot g at g c + 2 j
    padded_BxPxD = jnp.pad(x_BxNxD, ((0, 0), (c - 1, 0), (0, 0)))
    idx_GxC = jnp.arange(g)[:, None] * c + 2 * jnp.arange(c)[None, :]
    taps_BxGxCxD = padded_BxPxD[:, idx_GxC]
  return jnp.einsum("bgcd,cde->bge", taps_BxGxCxD, kernel_CxDxD) + bias_D


def _qkv_kernel(module: nn.Module) -> Array:
  """The layer's ``qkv_net`` kernel [D, 3, H, Dh] (attn_type 0 and 1),
  read from the layer's variables after its attention ran, float32."""
  kernel = module.variables["params"]["attn"]["qkv_net"]["kernel"]
  return jnp.asarray(nn.unbox(kernel), jnp.float32)


@register
class CompressiveMemory(MemoryVariant):
  """The compressive memory of Rae et al. 2020 (arXiv 1911.05507, Sec. 3).

  Per layer, ``cmem_len`` = Nc compressed slots in front of the XL memory's
  M = mem_len slots: ``mems_LxBxMxD`` holds [compressed memory; memory]
  (Nc + M slots, ``slots``), and the key layout is the XL one over
  [compressed memory; memory; segment] (Algorithm 1, line 5: ``mem =
  concat(cm, m)``).  Each segment (``layer_update``):

  * the memory is updated as XL's: the last M of [memory; segment];
  * the T states that this drops, the first T of [memory; segment] (the
    paper's ``old_mem = m[:n_s]`` when M >= T), are compressed at rate c =
    ``cmem_ratio`` into T // c slots by ``cmem_fn`` (``compress``) and
    appended to the compressed memory, FIFO, truncated to its last Nc
    (Algorithm 1, lines 8-11).  The training and evaluation segment
    lengths must be multiples of c (``config_problems``, ``eval_problems``);
    a pass of another length (generation's one-token passes) compresses
    the newest (T // c) c of them, and the T % c oldest are dropped as XL
    drops them (with c > 1 a one-token pass compresses nothing:
    generation keeps the prompt's compressed memory and drops the states
    it evicts after it).
  * the attention-reconstruction loss (Sec. 3.2, Algorithm 2) is sown into
    "losses" as ``RECON_LOSS``: per layer, the mean squared error between
    ``content_attention`` of the layer's input over the old states and over
    their compression, with the queries, old states and attention weights
    (the layer's ``qkv_net``) stop-gradiented, so that only the
    compression parameters learn from it; the memory the network reads is
    stop-gradiented as XL's, so the language-model loss gives the
    compression parameters no gradient.  Mean over queries, heads and
    head width, then over the rows that compressed at least one valid
    slot (0 when none did); training sums it over layers and weighs it
    with ``train.aux_loss_weight``.  The paper optimises it with its own
    optimiser; here it joins the objective (its gradient reaches only the
    compression parameters) and the compression parameters are clipped
    apart from the rest (``train_state.clip_groups_by_global_norm``; Adam
    is per parameter): two optimisers with the same settings.

  Decisions where the paper is silent:

  * Empty slots are masked (as XL's here; the paper attends to its zero
    initial memories): a compressed slot is valid when all its c states
    were, so one count, ``mlen_B`` = valid compressed + valid XL slots,
    describes the keys (``compressive_count``): compressed slots fill only
    behind a full XL memory.  A reset (``reset_B``) empties both.
  * Positions: a compressed slot counts as one position; the relative
    distances run on over [compressed memory; memory; segment] without a
    gap (the paper's Algorithm 1 concatenates cm and m and applies the
    Transformer-XL attention to the result, so the relative encoding sees
    one position per slot).  ``same_length`` and ``clamp_len`` count the
    compressed slots the same way; the learned tables of attn_type 1
    cover Nc + M + T distances.
  * The fused kernel needs nothing new: the layout is XL's with Nc + M
    slots.
  * Generation's decoding cache is refused (``decode_cache``; the cache is
    a FIFO of the projected inputs, the compressed slots are not):
    generation projects the memory on every token.
  * attn_type 0 and 1 (relative; the paper's is type 0) and post-LayerNorm
    (the paper's) only (``config_problems``).

  ``cmem_len = 0`` is the XL memory exactly (no slot, no parameter, no loss).
  """

  name = "compressive"
  Settings = CompressiveSettings
  EVAL_OVERRIDES = ("cmem_len",)
  LEGACY_KEYS = ("cmem_len", "cmem_ratio", "cmem_fn")
  LEGACY_EVAL_KEYS = {"cmem_len": -1}  # -1 meant model.cmem_len
  DECODE_CACHE = False

  @classmethod
  def settings_problems(cls, section):
    problems = []
    cmem_len, ratio, fn = section["cmem_len"], section["cmem_ratio"], section["cmem_fn"]
    if isinstance(cmem_len, bool) or not isinstance(cmem_len, int) or cmem_len < 0:
      problems.append(
          f"model.compressive.cmem_len={cmem_len!r} must be an integer >= 0 (0 = no "
          "compressed memory)."
      )
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
      problems.append(
          f"model.compressive.cmem_ratio={ratio!r} must be an integer >= 1 (the compression "
          "rate c)."
      )
    if fn not in CMEM_FNS:
      problems.append(f"model.compressive.cmem_fn={fn!r}: use one of {CMEM_FNS}.")
    return problems

  @classmethod
  def config_problems(cls, fields):
    problems = []
    s = fields[cls.name]
    c, tgt_len = s["cmem_ratio"], fields.get("tgt_len", 1)
    length = tgt_len + extra_positions(fields)
    if length % c and s["cmem_len"]:
      problems.append(
          f"model.tgt_len={tgt_len} must be a multiple of model.compressive.cmem_ratio={c} "
          f"(each segment's {length} evicted states are compressed {c} at a time"
          + (
              f"; {length - tgt_len} of them are other memories' positions)"
              if length != tgt_len
              else ")"
          )
          + "."
      )
    if fields.get("attn_type", 0) not in (0, 1):
      problems.append(
          f"model.memory='compressive' needs a relative attention: model.attn_type "
          f"0 or 1 (got {fields['attn_type']})."
      )
    if fields.get("pre_lnorm", False):
      problems.append(
          "model.memory='compressive' is post-LayerNorm (the paper's): set model.pre_lnorm=False."
      )
    return problems

  @classmethod
  def param_groups(cls, cfg):
    s = cls.settings(cfg)
    return (CMEM_PARAMS,) if s.cmem_len > 0 and s.cmem_fn in CMEM_LEARNED else ()

  @classmethod
  def eval_settings(cls, settings, overrides, sliding):
    if sliding:  # each window from an empty memory: nothing to compress
      return dataclasses.replace(settings, cmem_len=0)
    return super().eval_settings(settings, overrides, sliding)

  @classmethod
  def eval_problems(cls, fields, eval_fields):
    s = fields[cls.name]
    cmem_len = (eval_fields.get(cls.name) or {}).get("cmem_len")
    if cmem_len is not None and (
        isinstance(cmem_len, bool) or not isinstance(cmem_len, int) or cmem_len < 0
    ):
      return [
          f"eval.compressive.cmem_len={cmem_len!r} must be unset (= model.compressive.cmem_len) "
          "or an integer >= 0 (compressed-memory slots at evaluation)."
      ]
    c, tgt_len = s["cmem_ratio"], eval_fields.get("tgt_len", 1)
    if eval_fields.get("method") == "sliding":
      return []  # a sliding window has no memory, so nothing to compress
    length = tgt_len + extra_positions(fields)
    if length % c and (s["cmem_len"] if cmem_len is None else cmem_len):
      return [
          f"eval.tgt_len={tgt_len} must be a multiple of model.compressive.cmem_ratio={c} with "
          "model.memory='compressive'."
      ]
    return []

  @classmethod
  def example(cls):
    return {"memory": cls.name, cls.name: {"cmem_len": 4, "cmem_ratio": 2, "cmem_fn": "conv"}}

  @classmethod
  def slots(cls, mem_len, cfg):
    return mem_len + cls.settings(cfg).cmem_len

  @classmethod
  def layer_update(cls, module, cfg, mem_BxMxD, h_BxTxD, key_count_B):
    s = cls.settings(cfg)
    nc = s.cmem_len
    if nc == 0:
      return layer_update(mem_BxMxD, h_BxTxD)
    c, tgt_len = s.cmem_ratio, h_BxTxD.shape[1]
    mem_len = mem_BxMxD.shape[1] - nc
    n_slot = tgt_len // c
    cmem_BxNcxD, xl_BxMxD = mem_BxMxD[:, :nc], mem_BxMxD[:, nc:]
    new_xl_BxMxD = layer_update(xl_BxMxD, h_BxTxD)
    if n_slot == 0:
      return jax.lax.stop_gradient(jnp.concatenate([cmem_BxNcxD, new_xl_BxMxD], axis=1))
    n_win = n_slot * c
    cat_BxKxD = jnp.concatenate([xl_BxMxD, h_BxTxD], axis=1)
    win_BxNxD = jax.lax.stop_gradient(cat_BxKxD[:, tgt_len - n_win : tgt_len])  # old_mem
    x_B = jnp.minimum(key_count_B, mem_len)
    new_B = jnp.clip(x_B + tgt_len - mem_len, 0, tgt_len) // c  # valid new slots
    valid_slot_BxG = jnp.arange(n_slot)[None, :] >= (n_slot - new_B)[:, None]
    valid_state_BxN = jnp.repeat(valid_slot_BxG, c, axis=1)
    win_BxNxD = jnp.where(valid_state_BxN[:, :, None], win_BxNxD, 0)

    # Algorithm 2: SG on the queries' input, the old memories and Q, K, V.
    kernel_Dx3xHxDh = jax.lax.stop_gradient(_qkv_kernel(module))
    proj = lambda x, i: jnp.einsum("bnd,dhk->bnhk", x.astype(jnp.float32), kernel_Dx3xHxDh[:, i])
    q_BxTxHxDh = proj(jax.lax.stop_gradient(h_BxTxD), 0)
    old_BxTxHxDh, old_prob_BxHxTxN = content_attention(
        q_BxTxHxDh, proj(win_BxNxD, 1), proj(win_BxNxD, 2), valid_state_BxN
    )
    usage_BxN = None
    if s.cmem_fn == "most_used":
      usage_BxN = jnp.where(valid_state_BxN, old_prob_BxHxTxN.mean(axis=(1, 2)), -jnp.inf)
    comp_BxGxD = compress(module, cfg, win_BxNxD, usage_BxN, new_B)
    new_BxTxHxDh, _ = content_attention(
        q_BxTxHxDh, proj(comp_BxGxD, 1), proj(comp_BxGxD, 2), valid_slot_BxG
    )
    err_B = jnp.mean(jnp.square(old_BxTxHxDh - new_BxTxHxDh), axis=(1, 2, 3))
    has_B = new_B > 0
    loss = jnp.sum(jnp.where(has_B, err_B, 0.0)) / jnp.maximum(jnp.sum(has_B), 1)
    module.sow("losses", RECON_LOSS, loss)

    cmem_cat_BxKxD = jnp.concatenate([cmem_BxNcxD, comp_BxGxD.astype(mem_BxMxD.dtype)], axis=1)
    new_cmem_BxNcxD = cmem_cat_BxKxD[:, cmem_cat_BxKxD.shape[1] - nc :]
    return jax.lax.stop_gradient(jnp.concatenate([new_cmem_BxNcxD, new_xl_BxMxD], axis=1))

  @classmethod
  def advance(cls, cfg, memory, new_mems_LxBxMxD, tgt_len):
    s = cls.settings(cfg)
    if s.cmem_len == 0:
      return memory.advance(new_mems_LxBxMxD, tgt_len)
    count_B = compressive_count(
        memory.key_count_B(),
        memory.mem_len - s.cmem_len,
        s.cmem_len,
        s.cmem_ratio,
        tgt_len,
    )
    return memory.advance(new_mems_LxBxMxD, tgt_len, count_B)
