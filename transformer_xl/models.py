"""The Transformer-XL language model (Dai et al. 2019) as pure Flax modules.

The memory is explicit state, never a mutable collection:
``Memory(mems_LxBxMxD, mlen_B)`` goes in, the next ``Memory`` comes out.
``mems_LxBxMxD[l]`` holds the cached *inputs* of layer l for the last M =
mem_len positions, right-aligned; ``mlen_B[b]`` counts how many of those
slots hold states (0 at the start of a stream: empty slots are masked, so a
fresh stream behaves exactly like the reference, which starts with no
memory, while shapes stay static).

The whole memory path is in :meth:`DecoderLayer.__call__` (read, concat,
stop-gradient, truncate, return) and :meth:`TransformerXL.__call__` (valid
counts).  The layer stack is one ``nn.scan`` whose scanned input is the
memory and whose scanned output is the new memory.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from transformer_xl import adaptive, attention

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters, with the reference implementation's names and meanings.

  Attributes:
    n_token: vocabulary size.
    n_layer, d_model, n_head, d_head, d_inner: sizes (Dai et al. 2019, Sec. 4).
    dropout: rate at the embeddings, attention output, both feed-forward
      sites and the final hidden state.
    dropatt: rate on the attention probabilities.
    tgt_len: T, tokens predicted per segment.
    mem_len: M, cached positions per layer.
    ext_len: positions at the end of a segment that are not cached
      (reference ``ext_len``; 0 in every reference script).
    clamp_len: largest relative distance encoded (0 = no clamp).
    same_length: every query attends to at most mem_len keys.
    pre_lnorm: LayerNorm before each sub-block (default: after, as in the
      paper).
    untie_r: per-layer u, v (``r_w_bias``, ``r_r_bias``) instead of shared.
    tie_weight: output softmax weights shared with the input embedding
      (all cluster tables with the adaptive softmax).
    d_embed: embedding size of the first cluster; 0 or None means d_model.
      With d_embed != d_model the embedding and softmax are projected
      (reference ``d_embed``).
    div_val: cluster i embeds in ``d_embed // div_val**i`` dimensions
      (Baevski & Auli 2018; reference ``div_val``; 1 = one table).
    cutoffs: adaptive input/softmax cluster boundaries, strictly increasing
      and < n_token; () = a plain dense softmax (reference ``cutoffs``).
    tie_projs: () (nothing tied) or one bool per cluster (len(cutoffs) + 1):
      the softmax uses the embedding's projection for that cluster
      (reference ``tie_projs``; wt103 uses (False, True, True, True)).  A
      no-op where there is no projection (div_val == 1, d_embed == d_model).
    proj_init_std: std of the embedding/softmax projection init (0.01).
    attn_type: attention variant (0 = the paper's; see attention.py).
    init_std: std of weight, embedding and u/v initialisation (0.02).
    dtype: compute dtype name ("float32" or "bfloat16"); parameters are
      float32; softmax and loss are float32.
    remat: rematerialise each layer in the backward pass
      ("none", "full" or "dots" = keep matmul outputs).
  """

  n_token: int
  n_layer: int = 12
  d_model: int = 512
  n_head: int = 8
  d_head: int = 64
  d_inner: int = 2048
  dropout: float = 0.1
  dropatt: float = 0.0
  tgt_len: int = 512
  mem_len: int = 512
  ext_len: int = 0
  clamp_len: int = 0
  same_length: bool = False
  pre_lnorm: bool = False
  untie_r: bool = False
  tie_weight: bool = True
  attn_type: int = 0
  init_std: float = 0.02
  dtype: str = "float32"
  remat: str = "none"
  d_embed: Optional[int] = None
  div_val: int = 1
  cutoffs: tuple = ()
  tie_projs: tuple = ()
  proj_init_std: float = 0.01

  def __post_init__(self):
    """Normalises cutoffs / tie_projs to tuples and validates the adaptive fields.

    Raises:
      ValueError: cutoffs not strictly increasing or not < n_token, div_val
        < 1, len(tie_projs) not in {0, len(cutoffs) + 1} (see
        :func:`adaptive.check_adaptive_config`).
    """
    object.__setattr__(self, "cutoffs", tuple(int(c) for c in (self.cutoffs or ())))
    object.__setattr__(self, "tie_projs", tuple(bool(t) for t in (self.tie_projs or ())))
    adaptive.check_adaptive_config(self.n_token, self.embed_dim, self.d_model, self.cutoffs,
                                   self.div_val, self.tie_projs)

  @property
  def embed_dim(self) -> int:
    """``d_embed`` resolved: d_model when d_embed is 0 or None."""
    return self.d_model if not self.d_embed else int(self.d_embed)

  @property
  def compute_dtype(self):
    """``dtype`` as a numpy dtype."""
    return jnp.dtype(self.dtype)


@flax.struct.dataclass
class Memory:
  """Per-layer recurrence memory (Dai et al. 2019, Sec. 3.2).

  Attributes:
    mems_LxBxMxD: cached inputs of each layer, [n_layer, B, mem_len,
      d_model], compute dtype, right-aligned.
    mlen_B: int32 [B], how many of the last slots hold states.
  """

  mems_LxBxMxD: Array
  mlen_B: Array


def init_memory(config: ModelConfig, batch_size: int, mem_len: Optional[int] = None) -> Memory:
  """Empty memory: zeros with no valid slot (the reference's empty start).

  Args:
    config: model config (n_layer, d_model, dtype).
    batch_size: B.
    mem_len: slots per layer; defaults to config.mem_len.
  """
  m = config.mem_len if mem_len is None else mem_len
  return Memory(
      mems_LxBxMxD=jnp.zeros((config.n_layer, batch_size, m, config.d_model), config.compute_dtype),
      mlen_B=jnp.zeros((batch_size,), jnp.int32))


def reset_memory(memory: Memory, reset_B: Array) -> Memory:
  """Empties the memory of the rows where ``reset_B`` (bool [B]) is True.

  Only the valid-slot count changes: empty slots are masked, so their
  stale contents never reach an output.
  """
  return memory.replace(mlen_B=jnp.where(reset_B, 0, memory.mlen_B))


def _layer_norm(name: str) -> nn.LayerNorm:
  """LayerNorm with the reference init: weight N(1, 0.02), bias 0, eps 1e-5."""
  scale_init = lambda key, shape, dtype: 1.0 + 0.02 * jax.random.normal(key, shape, dtype)
  return nn.LayerNorm(
      epsilon=1e-5, dtype=jnp.float32, name=name,
      scale_init=nn.with_logical_partitioning(scale_init, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


class PositionwiseFF(nn.Module):
  """Linear -> ReLU -> Dropout -> Linear -> Dropout (reference ``PositionwiseFF``)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: Array, deterministic: bool) -> Array:
    """[B, T, d_model] -> [B, T, d_model] in the compute dtype."""
    cfg = self.config
    h_BxTxF = nn.Dense(
        cfg.d_inner, dtype=cfg.compute_dtype, name="ff_1",
        kernel_init=attention.normal_init(cfg.init_std, "embed", "mlp"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x_BxTxD)
    h_BxTxF = nn.Dropout(cfg.dropout)(nn.relu(h_BxTxF), deterministic=deterministic)
    out_BxTxD = nn.Dense(
        cfg.d_model, dtype=cfg.compute_dtype, name="ff_2",
        kernel_init=attention.normal_init(cfg.init_std, "mlp", "embed"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(h_BxTxF)
    return nn.Dropout(cfg.dropout)(out_BxTxD, deterministic=deterministic)


class DecoderLayer(nn.Module):
  """One Transformer-XL layer; the body of the ``nn.scan`` over layers.

  Dai et al. 2019, Sec. 3.2 and the equations at the end of Sec. 3.3.
  Post-LayerNorm by default: ``LN(h + Dropout(Attn))`` then ``LN(x + FF(x))``;
  with ``pre_lnorm`` the LayerNorm comes first (applied to concat(memory,
  h) before the qkv projection, as in the reference) and there is none after.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, h_BxTxD: Array, mem_BxMxD: Array, pos_emb_KxD: Array,
               mask_Bx1xTxK: Array, r_w_bias_HxDh: Optional[Array],
               r_r_bias_HxDh: Optional[Array], deterministic: bool):
    """Runs the layer on one segment and returns the layer's next memory.

    Args:
      h_BxTxD: layer input for the segment (the scan carry).
      mem_BxMxD: this layer's memory (this layer's inputs for the previous
        M positions).
      pos_emb_KxD: sinusoid R for distances K-1..0, K = M + T.
      mask_Bx1xTxK: attention mask (attention.attention_mask).
      r_w_bias_HxDh, r_r_bias_HxDh: shared u and v, or None with untie_r
        (then this layer owns its own).
      deterministic: disables dropout (static).

    Returns:
      (out_BxTxD, new_mem_BxMxD): the layer output (next carry) and the new
      memory of this layer.
    """
    cfg = self.config
    mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]

    # ---- The memory path (Sec. 3.2): h~ = [SG(m) o h] ----------------------
    cat_BxKxD = jnp.concatenate(                              # read + concat
        [jax.lax.stop_gradient(mem_BxMxD), h_BxTxD], axis=1)  # stop-gradient
    end = mem_len + tgt_len - cfg.ext_len                     # the reference's
    new_mem_BxMxD = jax.lax.stop_gradient(                    # end/beg window:
        cat_BxKxD[:, end - mem_len:end])                      # truncate to M
    # --------------------------------------------------------------------------

    if cfg.untie_r:
      bias_init = attention.normal_init(cfg.init_std, "heads", "kv")
      r_w_bias_HxDh = self.param("r_w_bias", bias_init, (cfg.n_head, cfg.d_head))
      r_r_bias_HxDh = self.param("r_r_bias", bias_init, (cfg.n_head, cfg.d_head))

    attn_cls = attention.get_attention(cfg.attn_type)
    attn = attn_cls(
        n_head=cfg.n_head, d_head=cfg.d_head, d_model=cfg.d_model,
        dropatt=cfg.dropatt, init_std=cfg.init_std, dtype=cfg.compute_dtype,
        deterministic=deterministic, name="attn")
    drop = nn.Dropout(cfg.dropout)
    ff = PositionwiseFF(cfg, name="pos_ff")

    if cfg.pre_lnorm:
      attn_in_BxKxD = _layer_norm("attn_layer_norm")(cat_BxKxD).astype(cfg.compute_dtype)
      attn_out = attn(attn_in_BxKxD, pos_emb_KxD, mask_Bx1xTxK, r_w_bias_HxDh, r_r_bias_HxDh)
      x_BxTxD = h_BxTxD + drop(attn_out, deterministic=deterministic)
      ff_in = _layer_norm("ff_layer_norm")(x_BxTxD).astype(cfg.compute_dtype)
      out_BxTxD = x_BxTxD + ff(ff_in, deterministic)
    else:
      attn_out = attn(cat_BxKxD, pos_emb_KxD, mask_Bx1xTxK, r_w_bias_HxDh, r_r_bias_HxDh)
      x_BxTxD = _layer_norm("attn_layer_norm")(
          h_BxTxD + drop(attn_out, deterministic=deterministic))
      x_BxTxD = x_BxTxD.astype(cfg.compute_dtype)
      out_BxTxD = _layer_norm("ff_layer_norm")(x_BxTxD + ff(x_BxTxD, deterministic))
    return out_BxTxD.astype(cfg.compute_dtype), new_mem_BxMxD


_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
}


class TransformerXL(nn.Module):
  """Transformer-XL language model (Dai et al. 2019).

  Adaptive embedding ``word_emb`` (scaled by sqrt(d_model); a plain
  embedding without cutoffs) -> dropout -> n_layer DecoderLayers
  (``nn.scan``) -> dropout -> projected adaptive log-softmax ``crit`` (a
  dense softmax with bias without cutoffs; weights tied to the embedding
  with ``tie_weight``, projections with ``tie_projs``).  See adaptive.py for
  the parameters of ``word_emb`` and ``crit``.

  Attributes:
    config: :class:`ModelConfig`.
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    if cfg.d_model % 2:
      raise ValueError(f"d_model={cfg.d_model} must be even for the sinusoid encoding.")
    self.word_emb = adaptive.AdaptiveEmbedding(
        n_token=cfg.n_token, d_embed=cfg.embed_dim, d_proj=cfg.d_model, cutoffs=cfg.cutoffs,
        div_val=cfg.div_val, init_std=cfg.init_std, proj_init_std=cfg.proj_init_std,
        dtype=cfg.compute_dtype)
    self.crit = adaptive.ProjectedAdaptiveLogSoftmax(
        n_token=cfg.n_token, d_embed=cfg.embed_dim, d_proj=cfg.d_model, cutoffs=cfg.cutoffs,
        div_val=cfg.div_val, tie_weight=cfg.tie_weight, tie_projs=cfg.tie_projs,
        init_std=cfg.init_std, proj_init_std=cfg.proj_init_std)
    if not cfg.untie_r:
      bias_init = attention.normal_init(cfg.init_std, "heads", "kv")
      self.r_w_bias = self.param("r_w_bias", bias_init, (cfg.n_head, cfg.d_head))
      self.r_r_bias = self.param("r_r_bias", bias_init, (cfg.n_head, cfg.d_head))
    self.drop = nn.Dropout(cfg.dropout)

    layer_cls = DecoderLayer
    if cfg.remat != "none":
      # static_argnums counts self as 0: `deterministic` is argument 7.
      layer_cls = nn.remat(layer_cls, prevent_cse=False, static_argnums=(7,),
                           policy=_REMAT_POLICIES[cfg.remat])
    self.layers = nn.scan(
        layer_cls,
        variable_axes={"params": 0},
        split_rngs={"params": True, "dropout": True},
        # Scanned: the memory.  Broadcast: R, mask, u, v, deterministic.
        in_axes=(0,) + (nn.broadcast,) * 5,
        out_axes=0,
        length=cfg.n_layer,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )(cfg)

  def hidden(self, tokens_BxT: Array, memory: Memory, deterministic: bool = True):
    """Final hidden states and the next memory.

    Args:
      tokens_BxT: int32 token ids of the segment.
      memory: the previous segments' :class:`Memory`; mem_len is read from
        its shape (so evaluation may use a longer memory than training).
      deterministic: disables dropout (needs a "dropout" rng otherwise).

    Returns:
      (hidden_BxTxD in the compute dtype, next Memory).
    """
    emb_BxTxD = self.word_emb(tokens_BxT)
    return self.hidden_from_embeddings(emb_BxTxD, memory, deterministic)

  def hidden_from_embeddings(self, emb_BxTxD: Array, memory: Memory, deterministic: bool = True):
    """As :meth:`hidden`, from the scaled word embeddings [B, T, d_model]
    (the output of ``word_emb``).

    This is where the memory enters and leaves the model: the scan over
    layers reads ``mems_LxBxMxD[l]`` in layer l and returns its new memory
    (see :meth:`DecoderLayer.__call__`); the valid-slot counts advance here.
    """
    cfg = self.config
    _, _, mem_len, _ = memory.mems_LxBxMxD.shape
    tgt_len = emb_BxTxD.shape[1]
    if tgt_len <= cfg.ext_len:
      raise ValueError(f"segment length {tgt_len} must exceed ext_len={cfg.ext_len}.")
    h_BxTxD = self.drop(emb_BxTxD.astype(cfg.compute_dtype), deterministic=deterministic)
    pos_emb_KxD = self.drop(
        attention.sinusoid_pos_emb(mem_len + tgt_len, cfg.d_model, cfg.clamp_len),
        deterministic=deterministic)
    mask_Bx1xTxK = attention.attention_mask(tgt_len, mem_len, memory.mlen_B, cfg.same_length)
    r_w_bias = None if cfg.untie_r else self.r_w_bias
    r_r_bias = None if cfg.untie_r else self.r_r_bias

    h_BxTxD, new_mems_LxBxMxD = self.layers(
        h_BxTxD, memory.mems_LxBxMxD.astype(cfg.compute_dtype), pos_emb_KxD,
        mask_Bx1xTxK, r_w_bias, r_r_bias, deterministic)
    # Valid slots after caching T - ext_len more positions.
    new_mlen_B = jnp.minimum(mem_len, memory.mlen_B + tgt_len - cfg.ext_len)
    new_memory = Memory(mems_LxBxMxD=new_mems_LxBxMxD, mlen_B=new_mlen_B.astype(jnp.int32))
    return self.drop(h_BxTxD, deterministic=deterministic), new_memory

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

  def __call__(self, tokens_BxT: Array, memory: Memory, targets_BxT: Optional[Array] = None,
               deterministic: bool = True):
    """Scores one segment.

    Args:
      tokens_BxT: int32 inputs.
      memory: :class:`Memory` of the previous segments.
      targets_BxT: int32 next tokens; when given the per-token negative
        log-likelihood is returned, otherwise log-probabilities.
      deterministic: disables dropout.

    Returns:
      (nll_BxT float32 in nats, next Memory) with targets, else
      (log_probs_BxTxV float32, next Memory).
    """
    hidden_BxTxD, new_memory = self.hidden(tokens_BxT, memory, deterministic)
    if targets_BxT is None:
      return self.log_probs(hidden_BxTxD), new_memory
    return self.nll(hidden_BxTxD, targets_BxT), new_memory
