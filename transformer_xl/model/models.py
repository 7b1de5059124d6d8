"""The Transformer-XL language model (Dai et al. 2019) as pure Flax modules.

The memory (Sec. 3.2) is explicit state, never a mutable collection:
``Memory(mems_LxBxMxD, mlen_B)`` goes into every call and the next
``Memory`` comes out.  ``mems_LxBxMxD[l]`` caches the *inputs* of layer l for
the last M = mem_len positions, right-aligned; ``mlen_B[b]`` counts how many
of those slots hold states (0 at the start of a stream: empty slots are
masked, so a fresh stream behaves exactly like the reference implementation,
which starts with no memory, while shapes stay static).  The state and
every operation on it (reset, the per-layer update, the count of valid
slots, row-wise maps and shardings) are in the memory package
(memory/state.py).

The whole memory path, in the order a segment meets it:

  reset      ``Memory.reset``, first thing in ``TransformerXL.hidden``:
             rows flagged ``reset_B`` get ``mlen_B = 0`` (a new stream).
  documents  with ``doc_pos_BxT`` the mask hides the slots (and segment keys)
             of earlier documents (``attention_ops.attention_mask``); the
             memory itself is left as it is.
  read       ``nn.scan`` over layers hands layer l its slice
             ``mems_LxBxMxD[l]`` (scanned input) in ``TransformerXL.hidden``.
  concat     ``DecoderLayer.__call__``: ``[SG(m) o h]`` ...
  stop-grad  ... with the gradient stopped on the memory (``memory.layer_read``:
             no gradient ever flows into a previous segment);
  truncate   ... keeping the last M inputs (the reference's ``end - M .. end``
             window, ``end = M + T``) as the layer's new memory
             (``memory.layer_update``);
  return     the scan stacks the layers' new memories (scanned output) and
             ``Memory.advance`` counts the valid slots (``advance_mlen``);
             both go out as the next ``Memory``.

The memory variants (``memory.variant``) join this path through the hooks
of the model's ``memory.plan``, called where they belong: ``extend`` and
``mask`` before the layers (positions a variant adds to the segment, e.g.
memory tokens), ``before_layer``, ``position_scores`` and ``combine`` (in
the attention), ``layer_update`` and ``after_layer`` in each layer (with the
layer's slice of the variants' per-layer state, scanned like the memory,
and their carried state, the scan's carry, with the layer's index),
``advance`` and ``finish`` after them.  Nothing here names a variant.

The layer stack is one ``nn.scan`` (parameters stacked on a leading
``layers`` axis); each layer may be rematerialised with a named policy
(``tuning.REMAT_POLICIES``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from transformer_xl.model import adaptive, attention, attention_ops, tuning
from transformer_xl.model import memory as memory_lib
from transformer_xl.model.config import ModelConfig  # re-exported: the model's hyperparameters

Array = jax.Array


class LayerCache(NamedTuple):
  """What a layer reads and returns when decoding with a cache
  (``TransformerXL.decode``): its memory and the ``CachedKV`` of it
  (None on the first pass, which projects the memory and starts the cache).
  Stacked over layers ([n_layer, ...] leading axes) outside the scan."""

  mem: Array
  kv: attention_ops.CachedKV | None


class DecoderLayer(nn.Module):
  """One Transformer-XL layer; the body of the ``nn.scan`` over layers.

  Dai et al. 2019, Sec. 3.2 and the equations at the end of Sec. 3.3.
  Post-LayerNorm by default: ``LN(h + Dropout(Attn))`` then ``LN(x + FF(x))``;
  with ``pre_lnorm`` the LayerNorm comes first (applied to concat(memory,
  h) before the qkv projection, as in the reference) and there is none after.

  Attributes:
    config: the ModelConfig.
    variant: the attention class of ``config.attn_type`` (``attention.variant``).
    record_attention: as ``TransformerXL``.
  """

  config: ModelConfig
  variant: type
  record_attention: bool = False

  @nn.compact
  def __call__(
      self,
      carry: tuple[Array, dict[str, Array]],
      mem_BxMxD: Array,
      state: dict[str, Array],
      layer_index: Array,
      pos: Any,
      mask_Bx1xTxK: Array,
      key_count_B: Array,
      deterministic: bool,
  ):
    """Runs the layer on one segment and returns the layer's next memory.

    Args:
      carry: (h_BxTxD, carried): the layer input for the segment and the
        memory variants' carried state (``memory.Plan.carried_state``; {} for
        most), by name: the scan carry.
      mem_BxMxD: this layer's memory (its inputs at the previous M positions),
        or, decoding with a cache, a ``LayerCache`` of it.
      state: this layer's slice of the memory variants' per-layer state
        (``memory.Plan.layer_state``; {} for most), by name.
      layer_index: int32 scalar, this layer's index (scanned in).
      pos: the variant's position terms, the same for every layer
        (``variant.model_inputs``; e.g. attn_type 0's R, u and v).
      mask_Bx1xTxK: attention mask (attention_ops.attention_mask), or with
        ``attention_impl="pallas"`` the ``attention_ops.MaskParts`` it is
        made from.
      key_count_B: int32 [B], the key layout's count (``Memory.key_count_B``),
        for the memory's hooks (``MemoryVariant.layer_update``).
      deterministic: disables dropout (static).

    Returns:
      ((out_BxTxD, carried), (new_mem_BxMxD, new_state)): the layer output
      and the next carried state (next carry), the new memory of this layer
      (decoding: a ``LayerCache`` of the new memory and the new cache) and
      the layer's next per-layer state.
    """
    cfg = self.config
    h_BxTxD, carried = carry
    plan = memory_lib.plan(cfg)
    decode = isinstance(mem_BxMxD, LayerCache)
    cached = mem_BxMxD.kv if decode else None
    mem_BxMxD = mem_BxMxD.mem if decode else mem_BxMxD

    # ---- The memory path (Sec. 3.2): h~ = [SG(m) o h] ----------------------
    mem_BxMxD = memory_lib.layer_read(mem_BxMxD)  # stop-gradient
    hooks = plan.layer_hooks(  # the variants' hooks, this layer
        self, {**state, **carried}, key_count_B, layer_index
    )
    h_BxTxD = hooks.before_layer(h_BxTxD)
    mem_BxMxD, h_BxTxD, pos = self.variant.layer_inputs(  # (absolute positions
        self, cfg, mem_BxMxD, h_BxTxD, pos
    )  # are cached too)
    # concat, truncate: the layer's next memory, after the attention (below),
    # whose parameters a memory variant may read (e.g. for an auxiliary
    # reconstruction loss).
    update = lambda: plan.layer_update(self, mem_BxMxD, h_BxTxD, key_count_B)
    # --------------------------------------------------------------------------

    attn = self.variant.from_config(
        cfg,
        deterministic=deterministic,
        record=self.record_attention,
        block_size=(  # a memory that needs every query at once: one block
            0 if plan.one_block else tuning.attn_block_size(cfg.attn_block, deterministic)
        ),
        name="attn",
        decode=decode,
    )
    drop = nn.Dropout(cfg.dropout)
    ff = PositionwiseFF(cfg, name="pos_ff")

    # The attention reads concat(memory, segment) as its two parts (attention_ops.kv_rows).
    # Decoding with a cache, the memory part is its cached projection.
    if cfg.pre_lnorm:  # the LayerNorm of cat_BxKxD, row by row
      attn_norm = _layer_norm("attn_layer_norm")
      mem_in = cached if cached is not None else attn_norm(mem_BxMxD).astype(cfg.compute_dtype)
      attn_out = attn(
          h_BxTxD,
          mem_in,
          attn_norm(h_BxTxD).astype(cfg.compute_dtype),
          pos,
          mask_Bx1xTxK,
          hooks=hooks,
      )
      attn_out, new_mem_BxMxD = _split_cache(attn_out, update(), decode)
      x_BxTxD = h_BxTxD + drop(attn_out, deterministic=deterministic)
      ff_in = _layer_norm("ff_layer_norm")(x_BxTxD).astype(cfg.compute_dtype)
      out_BxTxD = x_BxTxD + ff(ff_in, deterministic)
    else:
      attn_out = attn(
          h_BxTxD,
          cached if cached is not None else mem_BxMxD,
          h_BxTxD,
          pos,
          mask_Bx1xTxK,
          hooks=hooks,
      )
      attn_out, new_mem_BxMxD = _split_cache(attn_out, update(), decode)
      x_BxTxD = _layer_norm("attn_layer_norm")(
          h_BxTxD + drop(attn_out, deterministic=deterministic)
      )
      x_BxTxD = x_BxTxD.astype(cfg.compute_dtype)
      out_BxTxD = _layer_norm("ff_layer_norm")(x_BxTxD + ff(x_BxTxD, deterministic))
    out_BxTxD = hooks.after_layer(out_BxTxD.astype(cfg.compute_dtype))
    new_carried = {n: hooks.state[n] for n in carried}
    new_state = {n: x for n, x in hooks.state.items() if n not in carried}
    return (out_BxTxD, new_carried), (new_mem_BxMxD, new_state)


def _split_cache(attn_out: Any, new_mem_BxMxD: Array, decode: bool) -> tuple[Array, Any]:
  """(attention output, what the layer returns as its memory): decoding, the
  attention returned (output, next CachedKV), which goes beside the memory."""
  if not decode:
    return attn_out, new_mem_BxMxD
  out_BxTxD, kv = attn_out
  return out_BxTxD, LayerCache(new_mem_BxMxD, kv)


def _layer_norm(name: str) -> nn.LayerNorm:
  """LayerNorm with the reference init: weight N(1, 0.02), bias 0, eps 1e-5."""
  scale_init = lambda key, shape, dtype: 1.0 + 0.02 * jax.random.normal(key, shape, dtype)
  return nn.LayerNorm(
      epsilon=1e-5,
      dtype=jnp.float32,
      name=name,
      scale_init=nn.with_logical_partitioning(scale_init, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
  )


class PositionwiseFF(nn.Module):
  """Linear -> ReLU -> Dropout -> Linear -> Dropout (reference ``PositionwiseFF``).

  The two linear outputs are tagged ``ff_1`` and ``ff_2`` for the remat
  policies (``tuning.REMAT_POLICIES``).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: Array, deterministic: bool) -> Array:
    """[B, T, d_model] -> [B, T, d_model] in the compute dtype."""
    cfg = self.config
    h_BxTxF = nn.Dense(
        cfg.d_inner,
        dtype=cfg.compute_dtype,
        name="ff_1",
        kernel_init=attention_ops.normal_init(cfg.init_std, "embed", "mlp"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
    )(x_BxTxD)
    h_BxTxF = checkpoint_name(h_BxTxF, "ff_1")
    h_BxTxF = nn.Dropout(cfg.dropout)(nn.relu(h_BxTxF), deterministic=deterministic)
    out_BxTxD = nn.Dense(
        cfg.d_model,
        dtype=cfg.compute_dtype,
        name="ff_2",
        kernel_init=attention_ops.normal_init(cfg.init_std, "mlp", "embed"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    )(h_BxTxF)
    out_BxTxD = checkpoint_name(out_BxTxD, "ff_2")
    return nn.Dropout(cfg.dropout)(out_BxTxD, deterministic=deterministic)


class TransformerXL(nn.Module):
  """Transformer-XL language model (Dai et al. 2019).

  Adaptive embedding ``word_emb`` (scaled by sqrt(d_model); a plain
  embedding without cutoffs) -> dropout -> n_layer DecoderLayers
  (``nn.scan``) -> dropout -> projected adaptive log-softmax ``crit`` (a
  dense softmax with bias without cutoffs; weights tied to the embedding
  with ``tie_weight``, projections with ``tie_projs``).  See adaptive.py for
  the parameters of ``word_emb`` and ``crit``.

  Attributes:
    config: ``ModelConfig`` (validated when it was constructed).
    record_attention: every layer sows its attention probabilities into the
      "intermediates" collection (``attention._Attention.record``; stacked
      over layers by the scan), for ``analysis.attention``.
  """

  config: ModelConfig
  record_attention: bool = False

  def setup(self):
    cfg = self.config
    self.word_emb = adaptive.AdaptiveEmbedding(
        n_token=cfg.n_token,
        d_embed=cfg.embed_dim,
        d_proj=cfg.d_model,
        cutoffs=cfg.cutoffs,
        div_val=cfg.div_val,
        init_std=cfg.init_std,
        proj_init_std=cfg.proj_init_std,
        dtype=cfg.compute_dtype,
    )
    self.crit = adaptive.ProjectedAdaptiveLogSoftmax(
        n_token=cfg.n_token,
        d_embed=cfg.embed_dim,
        d_proj=cfg.d_model,
        cutoffs=cfg.cutoffs,
        div_val=cfg.div_val,
        tie_weight=cfg.tie_weight,
        tie_projs=cfg.tie_projs,
        init_std=cfg.init_std,
        proj_init_std=cfg.proj_init_std,
    )
    self.variant = attention.variant(cfg)  # the attention type, chosen once
    self.shared_pos = self.variant.model_params(self, cfg)  # e.g. type 0's u, v
    self.drop = nn.Dropout(cfg.dropout)
    self.memory_plan = memory_lib.plan(cfg)  # the memory variants on, and their hooks
    self.memory_params = self.memory_plan.model_params(self)  # e.g. the memory tokens' init

    layer_cls = DecoderLayer
    if cfg.remat != "none":
      # static_argnums counts self as 0: `deterministic` is argument 8.
      layer_cls = nn.remat(
          layer_cls, prevent_cse=False, static_argnums=(8,), policy=tuning.REMAT_POLICIES[cfg.remat]
      )
    self.layers = nn.scan(
        layer_cls,
        variable_axes={"params": 0, "intermediates": 0, "losses": 0},  # losses: sown, stacked
        split_rngs={"params": True, "dropout": True},
        # Scanned: the memory, the variants' per-layer state, the layer index.
        # Broadcast: the position terms, mask, key count, deterministic.
        in_axes=(0, 0, 0) + (nn.broadcast,) * 4,
        out_axes=0,
        length=cfg.n_layer,
        unroll=tuning.scan_unroll_layers(cfg.scan_unroll, cfg.n_layer),
        metadata_params={nn.PARTITION_NAME: "layers"},
    )(cfg, self.variant, record_attention=self.record_attention)

  def hidden(
      self,
      tokens_BxT: Array,
      memory: memory_lib.Memory,
      deterministic: bool = True,
      reset_B: Array | None = None,
      doc_pos_BxT: Array | None = None,
  ):
    """Final hidden states and the next memory.

    Args:
      tokens_BxT: int32 token ids of the segment.
      memory: the previous segments' ``Memory``; mem_len is read from
        its shape (so evaluation may use a longer memory than training).
      deterministic: disables dropout (needs a "dropout" rng otherwise).
      reset_B: optional bool [B]: rows that start a new stream here (their
        memory is emptied first, ``Memory.reset``).
      doc_pos_BxT: optional int32 [B, T]: each position's offset from the
        first input of its document; a query attends to no key of another
        document (``attention_ops.attention_mask``).  None: one stream.

    Returns:
      (hidden_BxTxD in the compute dtype, next Memory).
    """
    emb_BxTxD = self.word_emb(tokens_BxT)
    return self.hidden_from_embeddings(
        emb_BxTxD, memory, deterministic, reset_B, doc_pos_BxT=doc_pos_BxT
    )

  def decode(
      self,
      tokens_BxT: Array,
      memory: memory_lib.Memory,
      kv_cache: attention_ops.CachedKV | None = None,
  ):
    """``hidden`` (no dropout) with a decoding cache, for generation.

    Each layer reads its memory's keys and values (and attn_type 0's
    position keys) from ``kv_cache`` instead of projecting the M memory
    states again: a pass of one token costs O(d_model^2) in projections,
    not O(M d_model^2).  The memory stays the source of truth and is
    updated exactly as ``hidden`` does; the cache is rolled beside it
    (``attention_ops.CachedKV``), so the result equals ``hidden``'s.
    The position keys are those of one query, so after the first pass (any
    T, ``kv_cache=None``: the cache is made from the memory) passes must
    have T = 1.  attn_type 0 and 1 only.

    Args:
      tokens_BxT: int32 token ids.
      memory: the ``Memory``.
      kv_cache: the previous pass's cache, leading axis [n_layer]; None:
        project the memory (the first pass).

    Returns:
      (hidden_BxTxD, next Memory, next cache: ``CachedKV`` with
      [n_layer, B, M, H, Dh] keys and values and [n_layer, M + 1, H, Dh]
      position keys, or None for attn_type 1).

    Raises:
      NotImplementedError: attn_type 2 or 3 (absolute positions: a cached
        state would carry the position of an earlier window), or a memory
        the cache cannot carry (``MemoryVariant.DECODE_CACHE``: not a FIFO
        of the layer inputs, or written at every pass).
    """
    refusal = self.memory_plan.refusal(decode=True)
    if refusal:
      raise NotImplementedError(refusal + ".")
    return self.hidden_from_embeddings(
        self.word_emb(tokens_BxT), memory, True, decode=True, kv_cache=kv_cache
    )

  def hidden_from_embeddings(
      self,
      emb_BxTxD: Array,
      memory: memory_lib.Memory,
      deterministic: bool = True,
      reset_B: Array | None = None,
      doc_pos_BxT: Array | None = None,
      *,
      decode: bool = False,
      kv_cache: attention_ops.CachedKV | None = None,
  ):
    """As ``hidden``, from the scaled word embeddings [B, T, d_model]
    (the output of ``word_emb``): where the memory enters and leaves the model.
    With ``decode``, as ``decode`` (and the next cache is returned too).

    The memory's variants add their positions to the segment before the
    layers (``memory.Plan.extend``; e.g. memory tokens) and take them back
    after them (``memory.Plan.finish``): the segment's hidden states come out.

    Raises:
      ValueError: the segment is empty; documents (``doc_pos_BxT``) or the
        decoding cache with a memory that cannot take them
        (``memory.Plan.refusal``).
    """
    cfg = self.config
    plan = self.memory_plan
    mem_len = memory.mem_len
    seg_len = emb_BxTxD.shape[1]
    if seg_len < 1:
      raise ValueError(f"segment length {seg_len}: a segment needs at least one position.")
    refusal = plan.refusal(documents=doc_pos_BxT is not None, decode=decode)
    if refusal:
      raise ValueError(refusal + ".")
    if reset_B is not None:  # reset
      memory = memory.reset(reset_B)
    emb_BxTxD = emb_BxTxD.astype(cfg.compute_dtype)
    emb_BxTxD = plan.extend(self.memory_params, memory, emb_BxTxD)  # the layers' positions
    tgt_len = emb_BxTxD.shape[1]
    mems_LxBxMxD = memory.mems_LxBxMxD.astype(cfg.compute_dtype)
    emb_BxTxD, mems_LxBxMxD, pos = self.variant.model_inputs(  # e.g. R of Sec. 3.3
        cfg,
        self.shared_pos,
        emb_BxTxD,
        mems_LxBxMxD,
        dropout=lambda x: self.drop(x, deterministic=deterministic),
    )
    h_BxTxD = self.drop(emb_BxTxD, deterministic=deterministic)
    mask = attention_ops.MaskParts(memory.key_count_B(), doc_pos_BxT)
    if cfg.attention_impl == "xla" or self.record_attention:  # the fused kernel masks in-kernel
      mask = plan.mask(mask.dense(tgt_len, mem_len, cfg.same_length))

    layer_mems = LayerCache(mems_LxBxMxD, kv_cache) if decode else mems_LxBxMxD
    (h_BxTxD, new_carried), (new_mems_LxBxMxD, new_layer_state) = self.layers(  # read
        (h_BxTxD, plan.carried_state(memory, doc_pos_BxT)),  # (scanned in),
        layer_mems,
        plan.layer_state(memory),
        jnp.arange(cfg.n_layer, dtype=jnp.int32),
        pos,
        mask,
        memory.key_count_B(),
        deterministic,
    )  # new memory (out)
    if decode:
      new_mems_LxBxMxD, kv_cache = new_mems_LxBxMxD
    new_carried.pop(memory_lib.DOC_POS, None)  # the documents' offsets: an input only
    new_memory = plan.advance(  # return
        memory, new_mems_LxBxMxD, tgt_len, {**new_layer_state, **new_carried}
    )
    h_BxTxD = self.drop(h_BxTxD, deterministic=deterministic)
    h_BxTxD, new_memory = plan.finish(h_BxTxD, new_memory, seg_len)  # the segment's states
    return (h_BxTxD, new_memory, kv_cache) if decode else (h_BxTxD, new_memory)

  def _shared(self):
    """The embedding tables / projections when the softmax ties to them."""
    cfg = self.config
    if not (cfg.tie_weight or any(cfg.tie_projs)):
      return None, None
    return self.word_emb.shared()

  def log_probs(self, hidden_BxTxD: Array) -> Array:
    """Log-probabilities over the vocabulary, float32 [B, T, n_token] (nats)."""
    return self.crit.log_prob(hidden_BxTxD, *self._shared())

  def nll(self, hidden_BxTxD: Array, targets_BxT: Array) -> Array:
    """Per-token negative log-likelihood of ``targets_BxT``, float32 [B, T] (nats)."""
    return self.crit.nll(hidden_BxTxD, targets_BxT, *self._shared())

  def __call__(
      self,
      tokens_BxT: Array,
      memory: memory_lib.Memory,
      targets_BxT: Array | None = None,
      deterministic: bool = True,
      reset_B: Array | None = None,
      doc_pos_BxT: Array | None = None,
  ):
    """Scores one segment.

    Args:
      tokens_BxT: int32 inputs.
      memory: ``Memory`` of the previous segments.
      targets_BxT: int32 next tokens; when given the per-token negative
        log-likelihood is returned, otherwise log-probabilities.
      deterministic: disables dropout.
      reset_B: optional bool [B], rows whose memory is emptied first.
      doc_pos_BxT: optional int32 [B, T], offsets in the documents
        (``hidden``).

    Returns:
      (nll_BxT float32 in nats, next Memory) with targets, else
      (log_probs_BxTxV float32, next Memory).
    """
    hidden_BxTxD, new_memory = self.hidden(
        tokens_BxT, memory, deterministic, reset_B, doc_pos_BxT=doc_pos_BxT
    )
    if targets_BxT is None:
      return self.log_probs(hidden_BxTxD), new_memory
    return self.nll(hidden_BxTxD, targets_BxT), new_memory


def init_params(model: TransformerXL, rng: Array) -> Any:
  """Freshly initialised parameters (reference init), logically boxed.

  The one parameter-init closure of the package: training, the converter
  and the benchmarks go through it (``jax.eval_shape`` of it gives the
  parameter shapes and logical axes without allocating).

  Args:
    model: the model; its config's tgt_len gives the dummy segment length.
    rng: PRNG key.

  Returns:
    The ``params`` collection (``nn.Partitioned`` leaves; ``nn.unbox``
    strips the axis metadata).
  """
  cfg = model.config
  tok_1xT = jnp.zeros((1, cfg.tgt_len), jnp.int32)
  return model.init(rng, tok_1xT, memory_lib.init_memory(cfg, 1), tok_1xT)["params"]
