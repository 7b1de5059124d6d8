"""The attention variants of Transformer-XL and its ablations, one class each.

Each attention variant of the reference implementation (``attn_type``; the
ablations of Tables 6 and 7) is one class that owns its positional scheme,
registered in ``ATTENTION_TYPES`` and chosen once by ``variant``:

* 0, ``RelPartialLearnableAttention``: Transformer-XL (Sec. 3.3), the
  sinusoid R and the biases u and v;
* 1, ``RelLearnableAttention``: Shaw et al. (2018), learned relative
  embeddings and biases;
* 2, ``SinusoidAbsoluteAttention``: Vaswani et al. (2017), standard
  attention, sinusoid absolute positions added to the input;
* 3, ``LearnedAbsoluteAttention``: Al-Rfou et al. (2018), standard
  attention, learned absolute positions added before every layer.

How models.py uses a variant (the hooks of ``_Attention``; a new
variant overrides the ones it needs and adds itself to the registry):

* ``model_params``: in ``TransformerXL.setup``, the parameters shared by
  all layers (type 0's u and v), in the model's scope;
* ``model_inputs``: before the layers; may change the embeddings and the
  memory (type 2) and returns ``pos``, the position terms every layer
  receives (type 0's R);
* ``layer_inputs``: in each layer, before its input is cached; per-layer
  parameters in the layer's scope (type 0's untied u, v; type 3's
  positions, added to memory and segment);
* ``__call__``: ``attn(h_BxTxD, mem_in_BxMxD, seg_in_BxTxD, pos,
  mask_Bx1xTxK, hooks=None)``, the attention output of the segment; the
  memory's hooks of the layer (``memory.LayerHooks``) adjust the position
  scores (``position_scores``, attn_type 0) and the attention vectors
  before the output projection (``combine``: ``_Attention._output``);
* ``config_problems``: what the variant needs of the other sizes.

What every variant shares (the Appendix B shift, the mask, the
projections, the blockwise softmax attention) is in ``attention_ops.py``;
a variant is its parameters, its positional scheme and its score function.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from jax.ad_checkpoint import checkpoint_name

from transformer_xl.model import pallas_attention
from transformer_xl.model.attention_ops import (
    MASK_VALUE,
    CachedKV,
    Kernel,
    MaskParts,
    absolute_positions,
    attend,
    content_scores,
    kv_rows,
    normal_init,
    output_projection,
    position_scores,
    position_table,
    qkv,
    rel_shift,
    sinusoid_pos_emb,
)

Array = jax.Array
Dtype = Any


class _Attention(nn.Module):
  """The attributes every attention type shares, and the variant interface.

  Attributes:
    n_head, d_head, d_model: sizes.
    dropatt: dropout rate on the attention probabilities.
    init_std: std of the N(0, std) weight initialisation (reference 0.02).
    dtype: compute dtype; parameters are kept in ``param_dtype``.
    deterministic: disables dropout.
    record: sow the attention probabilities (float32 [B, H, T, K], before
      dropatt) into the "intermediates" collection as "prob" (and, for
      attn_type 0, the decomposition "prob_a", "prob_b", "prob_d") for the
      attention maps of ``analysis.attention``; a no-op unless that
      collection is mutable.  Computes the full attention (one block).
    block_size: queries per block of the blockwise attention (0 = all T in
      one block): see ``attend``.
    decode: generation with a decoding cache (types 0 and 1 only): the
      memory part of the input may be an ``attention_ops.CachedKV`` (its
      keys and values are not projected again), and ``__call__`` returns
      (output, the next CachedKV) (``_output``).

  The class methods below are the hooks through which models.py uses a
  variant (module docstring); ``cfg`` is a ``default_config.ModelConfig``.
  The defaults do nothing.
  """

  n_head: int
  d_head: int
  d_model: int
  dropatt: float = 0.0
  init_std: float = 0.02
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  deterministic: bool = True
  record: bool = False
  block_size: int = 0
  decode: bool = False

  PAPER: ClassVar[str] = ""  # the variant's name in the paper's Table 6
  DECODE_CACHE: ClassVar[bool] = False  # supports ``decode`` (a cache of projected memory)

  @classmethod
  def from_config(
      cls,
      cfg: Any,
      deterministic: bool,
      record: bool,
      block_size: int,
      name: str,
      decode: bool = False,
  ) -> _Attention:
    """The module of one layer: the common attributes from ``cfg``, and
    the variant's own (``own_attributes``).

    Raises:
      NotImplementedError: ``decode`` for a type without a decoding cache.
    """
    if decode and not cls.DECODE_CACHE:
      raise NotImplementedError(
          f"{cls.__name__} has no decoding cache (attn_type 0 and 1 "
          "have one): generate without it."
      )
    return cls(
        n_head=cfg.n_head,
        d_head=cfg.d_head,
        d_model=cfg.d_model,
        dropatt=cfg.dropatt,
        init_std=cfg.init_std,
        dtype=cfg.compute_dtype,
        deterministic=deterministic,
        record=record,
        block_size=block_size,
        name=name,
        decode=decode,
        **cls.own_attributes(cfg),
    )

  def _output(
      self,
      vec_BxTxHxDh: Array,
      q_BxTxHxDh: Array,
      k_BxKxHxDh: Array,
      v_BxKxHxDh: Array,
      r_KxHxDh: Array | None,
      hooks: Any,
  ) -> Any:
    """The attention's output from its vectors: the memory's ``combine``
    hook (``hooks``, or None), ``o_net`` (``output_projection``), and with
    ``decode`` the CachedKV of the last M = K - T key rows (which the next
    memory holds) and the position keys: (out, CachedKV)."""
    if hooks is not None:
      vec_BxTxHxDh = hooks.combine(self, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, vec_BxTxHxDh)
    out_BxTxD = output_projection(self, vec_BxTxHxDh)
    if not self.decode:
      return out_BxTxD
    t = out_BxTxD.shape[1]
    return out_BxTxD, CachedKV(k_BxKxHxDh[:, t:], v_BxKxHxDh[:, t:], r_KxHxDh)

  @classmethod
  def own_attributes(cls, cfg: Any) -> dict[str, Any]:
    """The variant's attributes beyond ``_Attention``'s, from ``cfg``."""
    return {}

  @classmethod
  def config_problems(cls, fields: Mapping[str, Any]) -> list[str]:
    """What this variant needs of the other model fields: one message per
    problem, naming ``model.<key>`` and the fix ([] if none)."""
    return []

  @classmethod
  def model_params(cls, model: nn.Module, cfg: Any) -> Any:
    """Parameters shared by every layer, created in ``model``'s scope (called
    from ``TransformerXL.setup``); None when there are none."""
    return None

  @classmethod
  def model_inputs(
      cls,
      cfg: Any,
      shared: Any,
      emb_BxTxD: Array,
      mems_LxBxMxD: Array,
      dropout: Callable[[Array], Array],
  ) -> tuple[Array, Array, Any]:
    """Before the layers: (emb_BxTxD, mems_LxBxMxD, pos), ``pos`` a pytree
    broadcast to every layer.  ``dropout`` is the model's (reference: the
    positions of type 0 are dropped out like the embeddings)."""
    return emb_BxTxD, mems_LxBxMxD, None

  @classmethod
  def layer_inputs(
      cls, layer: nn.Module, cfg: Any, mem_BxMxD: Array, h_BxTxD: Array, pos: Any
  ) -> tuple[Array, Array, Any]:
    """In each layer, before concat(memory, segment) is cached: (mem_BxMxD,
    h_BxTxD, pos) of that layer; parameters created in ``layer``'s scope."""
    return mem_BxMxD, h_BxTxD, pos


@functools.cache
def _log_dropatt_fallback() -> None:
  """Once per process: the kernel has no dropatt, training uses the XLA path."""
  logging.warning(
      "model.attention_impl='pallas' has no dropatt: training steps with "
      "model.dropatt > 0 use the XLA attention (evaluation, scoring and "
      "generation use the kernel)."
  )


def _uv_biases(module: nn.Module, cfg: Any) -> tuple[Array, Array]:
  """u and v of Sec. 3.3 (reference ``r_w_bias``, ``r_r_bias``), [n_head,
  d_head], created in ``module``'s scope."""
  init = normal_init(cfg.init_std, "heads", "kv")
  return (
      module.param("r_w_bias", init, (cfg.n_head, cfg.d_head)),
      module.param("r_r_bias", init, (cfg.n_head, cfg.d_head)),
  )


class RelPartialLearnableAttention(_Attention):
  """Multi-head attention with the relative encoding of Dai et al. 2019 (attn_type 0).

  Reference: ``RelPartialLearnableMultiHeadAttn``.  One fused ``qkv_net``
  (W_q, W_kE, W_v; no bias) over concat(memory, segment), a separate
  ``r_net`` (W_kR; no bias) over the sinusoid R, an ``o_net`` (no bias).
  Scores are scaled by 1/sqrt(d_head); softmax in float32.  The positional
  scheme: R for distances K-1..0 (with the model's dropout, as in the
  reference) and u, v shared by all layers (the model's ``r_w_bias``,
  ``r_r_bias``) or, with ``untie_r``, per layer (the layer's).

  Given ``attention_ops.MaskParts`` instead of a dense mask (the model does
  so with ``attention_impl="pallas"``), the scores, mask, softmax and
  weighted values are the fused kernel's (``pallas_attention``), except in
  a training step with dropatt > 0, which falls back to the XLA path
  (logged once).

  Its attributes are ``_Attention``'s, plus the one below.  The memory's
  ``position_scores`` hook may adjust the (b)+(d) terms after the shift
  (the memory tokens' keys after their query).

  Attributes:
    same_length: the config's (the kernel forms the mask itself).
  """

  same_length: bool = False

  PAPER: ClassVar[str] = "Transformer-XL"
  DECODE_CACHE: ClassVar[bool] = True

  @classmethod
  def own_attributes(cls, cfg):
    return {"same_length": cfg.same_length}

  @classmethod
  def model_params(cls, model, cfg):
    return None if cfg.untie_r else _uv_biases(model, cfg)

  @classmethod
  def model_inputs(cls, cfg, shared, emb_BxTxD, mems_LxBxMxD, dropout):
    klen = mems_LxBxMxD.shape[2] + emb_BxTxD.shape[1]
    pos_emb_KxD = dropout(sinusoid_pos_emb(klen, cfg.d_model, cfg.clamp_len))
    return emb_BxTxD, mems_LxBxMxD, (pos_emb_KxD, shared)

  @classmethod
  def layer_inputs(cls, layer, cfg, mem_BxMxD, h_BxTxD, pos):
    pos_emb_KxD, shared = pos
    u_v = _uv_biases(layer, cfg) if cfg.untie_r else shared
    return mem_BxMxD, h_BxTxD, (pos_emb_KxD, *u_v)

  @nn.compact
  def __call__(
      self,
      h_BxTxD: Array,
      mem_in_BxMxD: Array,
      seg_in_BxTxD: Array,
      pos: tuple[Array, Array, Array],
      mask_Bx1xTxK: Array,
      hooks: Any = None,
  ) -> Array:
    """Attention output for the T segment positions.

    Args:
      h_BxTxD: the segment's layer input [B, T, d_model] before any
        LayerNorm (used by type 2 and 3's queries; not here).
      mem_in_BxMxD, seg_in_BxTxD: the attention input, concat(memory,
        segment) = [B, K, d_model] in two parts (LayerNorm-ed with
        pre_lnorm); queries come from the segment part.  With ``decode``
        the memory part may be the ``CachedKV`` of the memory (its keys,
        values and position keys are used as they are).
      pos: (pos_emb_KxD, r_w_bias_HxDh, r_r_bias_HxDh): the sinusoid R for
        distances K-1..0 (``sinusoid_pos_emb``), u and v of Sec. 3.3,
        [n_head, d_head].
      mask_Bx1xTxK: bool, True where attention is allowed
        (``attention_mask``), or the ``MaskParts`` it is made from.
      hooks: the memory's hooks of this layer (``memory.LayerHooks``), or None.

    Returns:
      [B, T, d_model] in ``dtype`` (the o_net output, before dropout and the
      residual); with ``decode`` also the next ``CachedKV`` (``_output``).
    """
    pos_emb_KxD, r_w_bias_HxDh, r_r_bias_HxDh = pos
    q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh = qkv(self, mem_in_BxMxD, seg_in_BxTxD)
    t, klen = q_BxTxHxDh.shape[1], k_BxKxHxDh.shape[1]
    if isinstance(mem_in_BxMxD, CachedKV):  # the same distances every step: computed once
      r_KxHxDh = mem_in_BxMxD.r_KxHxDh
    else:
      r_KxHxDh = nn.DenseGeneral(
          (self.n_head, self.d_head),
          use_bias=False,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          kernel_init=normal_init(self.init_std, "embed", "heads", "kv"),
          name="r_net",
      )(pos_emb_KxD.astype(self.dtype))
      r_KxHxDh = checkpoint_name(r_KxHxDh, "r_head_k")

    u = r_w_bias_HxDh.astype(self.dtype)
    v = r_r_bias_HxDh.astype(self.dtype)

    if isinstance(mask_Bx1xTxK, MaskParts):  # model.attention_impl="pallas"
      if self.dropatt == 0 or self.deterministic:
        vec_BxTxHxDh = pallas_attention.rel_attention(
            q_BxTxHxDh,
            k_BxKxHxDh,
            v_BxKxHxDh,
            r_KxHxDh,
            u,
            v,
            mask_Bx1xTxK.key_count_B,
            mask_Bx1xTxK.doc_pos_BxT,
            mem_len=klen - t,
            same_length=self.same_length,
        )
        return self._output(vec_BxTxHxDh, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, r_KxHxDh, hooks)
      _log_dropatt_fallback()
      mask_Bx1xTxK = mask_Bx1xTxK.dense(t, klen - t, self.same_length)

    def score(q_BxQxHxDh, k_BxJxHxDh, pos):
      (r_JxHxDh,) = pos  # distances J-1..0 of this block's keys
      # (a) + (c): content terms.
      ac_HxBxQxJ = content_scores(q_BxQxHxDh + u, k_BxJxHxDh)
      # (b) + (d): position terms against every distance J-1..0, then shifted.
      raw_HxBxQxJ = position_scores(q_BxQxHxDh + v, r_JxHxDh)
      bd_HxBxQxJ = rel_shift(raw_HxBxQxJ)
      if hooks is not None:  # e.g. the memory tokens' (one block: memory.Plan.one_block)
        bd_HxBxQxJ = hooks.position_scores(raw_HxBxQxJ, bd_HxBxQxJ)
      return ac_HxBxQxJ + bd_HxBxQxJ

    if self.record:  # Appendix D, Fig. 7: terms (a), (b) and (d), each softmax-ed alone
      terms = {
          "a": jnp.einsum(
              "bihd,bjhd->bhij", q_BxTxHxDh, k_BxKxHxDh, preferred_element_type=jnp.float32
          ),
          "b": rel_shift(
              jnp.einsum("bihd,jhd->bhij", q_BxTxHxDh, r_KxHxDh, preferred_element_type=jnp.float32)
          ),
          "d": rel_shift(
              jnp.broadcast_to(
                  jnp.einsum("hd,jhd->hj", v, r_KxHxDh, preferred_element_type=jnp.float32)[
                      None, :, None, :
                  ],
                  mask_Bx1xTxK.shape[:1] + (self.n_head,) + mask_Bx1xTxK.shape[2:],
              )
          ),
      }
      for name, term in terms.items():
        term = jnp.where(mask_Bx1xTxK, term * (1.0 / self.d_head**0.5), MASK_VALUE)
        self.sow("intermediates", f"prob_{name}", jax.nn.softmax(term, axis=-1))
    vec_BxTxHxDh = attend(
        self, score, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, (r_KxHxDh,), mask_Bx1xTxK
    )
    return self._output(vec_BxTxHxDh, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, r_KxHxDh, hooks)


class RelLearnableAttention(_Attention):
  """Shaw et al. (2018) learned relative attention (attn_type 1).

  Reference: ``RelLearnableMultiHeadAttn`` with the per-layer tables of
  ``MemTransformerLM``.  Parameters per layer: ``qkv_net`` and ``o_net`` as
  type 0, ``r_emb`` [max_klen, H, Dh] (learned relative key embeddings),
  ``r_w_bias`` [H, Dh] (the content bias) and ``r_bias`` [max_klen, H] (a
  learned scalar bias per distance and head); no sinusoid, no ``r_net``.
  The score is ``(q + r_w_bias) . k + shift(q . r_emb + r_bias)``: unlike
  type 0 the query carries no bias in the position term.  The tables are
  sized by the training attention length ``max_klen`` and read by
  ``position_table`` (clamped, or padded with their first row for a
  longer attention at evaluation).  ``untie_r`` does not apply: the biases
  are always per layer, as in the reference.

  Its attributes are ``_Attention``'s, plus the ones below.

  Attributes:
    max_klen: rows of the learned tables (the training tgt_len + mem_len;
      must be >= 1).
    clamp_len: cut the tables to their last clamp_len rows (0 = no cut).
  """

  max_klen: int = 0
  clamp_len: int = 0

  PAPER: ClassVar[str] = "Shaw et al. (2018)"
  DECODE_CACHE: ClassVar[bool] = True

  @classmethod
  def own_attributes(cls, cfg):
    return {"max_klen": cfg.pos_table_len, "clamp_len": cfg.clamp_len}

  @nn.compact
  def __call__(
      self,
      h_BxTxD: Array,
      mem_in_BxMxD: Array,
      seg_in_BxTxD: Array,
      pos: Any,
      mask_Bx1xTxK: Array,
      hooks: Any = None,
  ) -> Array:
    """As ``RelPartialLearnableAttention.__call__``; ``h_BxTxD`` and
    ``pos`` (None) are not used: the tables are this module's."""
    klen = mask_Bx1xTxK.shape[3]
    q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh = qkv(self, mem_in_BxMxD, seg_in_BxTxD)
    r_emb = self.param(
        "r_emb",
        normal_init(self.init_std, "length", "heads", "kv"),
        (self.max_klen, self.n_head, self.d_head),
    )
    r_w_bias = self.param(
        "r_w_bias", normal_init(self.init_std, "heads", "kv"), (self.n_head, self.d_head)
    )
    r_bias = self.param(
        "r_bias",
        nn.with_logical_partitioning(nn.initializers.zeros, ("length", "heads")),
        (self.max_klen, self.n_head),
    )
    r_emb_KxHxDh = position_table(r_emb, klen, self.clamp_len).astype(self.dtype)
    r_bias_KxH = position_table(r_bias, klen, self.clamp_len)
    w = r_w_bias.astype(self.dtype)

    def score(q_BxQxHxDh, k_BxJxHxDh, pos):
      r_emb_JxHxDh, r_bias_JxH = pos  # distances J-1..0 of this block's keys
      ac_HxBxQxJ = content_scores(q_BxQxHxDh + w, k_BxJxHxDh)
      b_HxBxQxJ = position_scores(q_BxQxHxDh, r_emb_JxHxDh)
      return ac_HxBxQxJ + rel_shift(b_HxBxQxJ + r_bias_JxH.T[:, None, None, :])

    vec_BxTxHxDh = attend(
        self, score, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, (r_emb_KxHxDh, r_bias_KxH), mask_Bx1xTxK
    )
    return self._output(vec_BxTxHxDh, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, None, hooks)


class AbsoluteAttention(_Attention):
  """Standard multi-head attention (reference ``MultiHeadAttn``), the
  attention of the absolute types 2 and 3.

  ``q_net`` (no bias) over the segment, ``kv_net`` (no bias) over
  concat(memory, segment), ``o_net`` (no bias); no positional term in the
  score: the subclasses add absolute positions to the layer inputs instead
  (``absolute_positions``).  With ``pre_lnorm`` the reference applies
  the LayerNorm to concat(memory, segment) for the keys and values only and
  takes the queries from the un-normalised segment; so do we (the caller
  passes the raw segment as ``h_BxTxD``).

  Attributes as ``_Attention``.
  """

  @nn.compact
  def __call__(
      self,
      h_BxTxD: Array,
      mem_in_BxMxD: Array,
      seg_in_BxTxD: Array,
      pos: Any,
      mask_Bx1xTxK: Array,
      hooks: Any = None,
  ) -> Array:
    """As ``RelPartialLearnableAttention.__call__``: queries from
    ``h_BxTxD`` (the raw segment), keys and values from concat(mem_in,
    seg_in); ``pos`` (None) is not used."""
    q_BxTxHxDh = nn.DenseGeneral(
        (self.n_head, self.d_head),
        use_bias=False,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=normal_init(self.init_std, "embed", "heads", "kv"),
        name="q_net",
    )(h_BxTxD.astype(self.dtype))
    kernel_Dx2xHxDh = Kernel(
        (seg_in_BxTxD.shape[-1], 2, self.n_head, self.d_head),
        ("embed", None, "heads", "kv"),
        self.init_std,
        self.param_dtype,
        name="kv_net",
    )()
    q_BxTxHxDh = checkpoint_name(q_BxTxHxDh, "qkv")
    kv_BxKx2xHxDh = kv_rows(self, mem_in_BxMxD, seg_in_BxTxD, kernel_Dx2xHxDh)

    def score(q_BxQxHxDh, k_BxJxHxDh, pos):
      return content_scores(q_BxQxHxDh, k_BxJxHxDh)

    k_BxKxHxDh, v_BxKxHxDh = kv_BxKx2xHxDh[:, :, 0], kv_BxKx2xHxDh[:, :, 1]
    vec_BxTxHxDh = attend(self, score, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, (), mask_Bx1xTxK)
    return self._output(vec_BxTxHxDh, q_BxTxHxDh, k_BxKxHxDh, v_BxKxHxDh, None, hooks)


class SinusoidAbsoluteAttention(AbsoluteAttention):
  """Vaswani et al. (2017) (attn_type 2): ``AbsoluteAttention`` with
  sinusoid absolute positions added to the embeddings and to layer 0's
  memory (reference ``MemTransformerLM._forward``, attn_type 2), counted
  from the end of the window (``absolute_positions``)."""

  PAPER: ClassVar[str] = "Vaswani et al. (2017)"

  @classmethod
  def model_inputs(cls, cfg, shared, emb_BxTxD, mems_LxBxMxD, dropout):
    klen = mems_LxBxMxD.shape[2] + emb_BxTxD.shape[1]
    mem0_BxMxD, emb_BxTxD = absolute_positions(
        sinusoid_pos_emb(klen, cfg.d_model, cfg.clamp_len), mems_LxBxMxD[0], emb_BxTxD
    )
    return emb_BxTxD, mems_LxBxMxD.at[0].set(mem0_BxMxD), None


class LearnedAbsoluteAttention(AbsoluteAttention):
  """Al-Rfou et al. (2018) (attn_type 3): ``AbsoluteAttention`` with
  learned absolute positions added to every layer's memory and segment.

  Each layer owns ``r_emb`` [max_klen, n_head, d_head] (reference
  ``MemTransformerLM.r_emb[i]``), read as [max_klen, d_model] rows counted
  from the end of the window and padded with its first row when K >
  max_klen (``position_table``); needs n_head * d_head == d_model.
  """

  PAPER: ClassVar[str] = "Al-Rfou et al. (2018)"

  @classmethod
  def config_problems(cls, fields):
    if fields["n_head"] * fields["d_head"] == fields["d_model"]:
      return []
    return [
        f"model.attn_type=3 adds a [d_model] row of its [max_klen, n_head, d_head] table: "
        f"it needs n_head * d_head == d_model (got {fields['n_head']} * "
        f"{fields['d_head']} != {fields['d_model']})."
    ]

  @classmethod
  def layer_inputs(cls, layer, cfg, mem_BxMxD, h_BxTxD, pos):
    n = cfg.pos_table_len
    table = layer.param(
        "r_emb", normal_init(cfg.init_std, "length", "heads", "kv"), (n, cfg.n_head, cfg.d_head)
    )
    klen = mem_BxMxD.shape[1] + h_BxTxD.shape[1]
    rows_KxD = position_table(table.reshape(n, cfg.d_model), klen).astype(cfg.compute_dtype)
    mem_BxMxD, h_BxTxD = absolute_positions(rows_KxD, mem_BxMxD, h_BxTxD)
    return mem_BxMxD, h_BxTxD, pos


# attn_type (the reference's numbering) -> the variant.
ATTENTION_TYPES: dict[int, type[_Attention]] = {
    0: RelPartialLearnableAttention,
    1: RelLearnableAttention,
    2: SinusoidAbsoluteAttention,
    3: LearnedAbsoluteAttention,
}


def variant(cfg: Any) -> type[_Attention]:
  """The attention class of ``cfg.attn_type`` (a validated ModelConfig)."""
  return ATTENTION_TYPES[cfg.attn_type]


def describe(cfg: Any) -> dict[str, Any]:
  """The variant of ``cfg`` for a report: {"attn_type": int, "attention":
  its name in the paper's Table 6}."""
  return {"attn_type": int(cfg.attn_type), "attention": variant(cfg).PAPER}


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """The problems of ``fields["attn_type"]`` and of what that variant needs
  (``_Attention.config_problems``); [] if none."""
  attn_type = fields["attn_type"]
  if attn_type not in ATTENTION_TYPES:
    names = ", ".join(f"{t} {cls.PAPER}" for t, cls in ATTENTION_TYPES.items())
    return [f"model.attn_type={attn_type}: use one of {sorted(ATTENTION_TYPES)} ({names})."]
  return ATTENTION_TYPES[attn_type].config_problems(fields)
