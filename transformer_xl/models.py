"""The Transformer-XL language model (Dai et al. 2019) as pure Flax modules.

The memory (Sec. 3.2) is explicit state, never a mutable collection:
``Memory(mems_LxBxMxD, mlen_B)`` goes into every call and the next
``Memory`` comes out.  ``mems_LxBxMxD[l]`` caches the *inputs* of layer l for
the last M = mem_len positions, right-aligned; ``mlen_B[b]`` counts how many
of those slots hold states (0 at the start of a stream: empty slots are
masked, so a fresh stream behaves exactly like the reference implementation,
which starts with no memory, while shapes stay static).

The whole memory path, in the order a segment meets it:

  reset      :func:`reset_memory`, first thing in :meth:`TransformerXL.hidden`:
             rows flagged ``reset_B`` get ``mlen_B = 0`` (a new stream).
  read       ``nn.scan`` over layers hands layer l its slice
             ``mems_LxBxMxD[l]`` (scanned input) in :meth:`TransformerXL.hidden`.
  concat     :meth:`DecoderLayer.__call__`: ``[SG(m) o h]`` ...
  stop-grad  ... with ``jax.lax.stop_gradient`` on the memory (no gradient
             ever flows into a previous segment);
  truncate   ... keeping the last M inputs (the reference's ``end - M .. end``
             window, ``end = M + T - ext_len``) as the layer's new memory;
  return     the scan stacks the layers' new memories (scanned output) and
             :func:`advance_mlen` counts the valid slots; both go out as the
             next :class:`Memory`.

The layer stack is one ``nn.scan`` (parameters stacked on a leading
``layers`` axis); each layer may be rematerialised with a named policy
(:data:`REMAT_POLICIES`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from transformer_xl import adaptive, attention

Array = jax.Array

DTYPES = ("float32", "bfloat16")

# Names that attention.py and PositionwiseFF tag with checkpoint_name: every
# projection's output.  The [B, H, T, K] scores and probabilities are not in
# this list, so the "save_*" policies recompute them in the backward pass.
PROJ_NAMES = ("qkv", "r_head_k", "attn_out", "ff_1", "ff_2")

# model.remat -> the jax.checkpoint policy of each layer (MaxText's pattern;
# None = save nothing, recompute the whole layer).
REMAT_POLICIES = {
    "none": None,   # no rematerialisation at all
    "full": None,   # save only the layer's inputs
    "dots": jax.checkpoint_policies.checkpoint_dots,  # every matmul, scores included
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names("qkv", "r_head_k"),
    "save_proj": jax.checkpoint_policies.save_only_these_names(*PROJ_NAMES),
}

# What attn_block -1 means when training on CPU; measured with benchmarks/vs_pytorch.py on
# the 2-core CPU of the README (B 8, tgt_len = mem_len 128, d_model 256):
# blocks of 64 queries 1,503 tokens/s, 32: 1,446, none: 1,291 (scanned loop over
# layers); with the unrolled loop 1,817 against 1,588 without blocks.  Evaluation
# was faster without blocks (2,481 against 2,061 tokens/s with 64).
CPU_TRAIN_ATTN_BLOCK = 64


def scan_unroll_layers(scan_unroll: int, n_layer: int) -> int:
  """``model.scan_unroll`` with -1 ("per backend") resolved: layers per
  iteration of the loop over layers (``nn.scan``'s ``unroll``), in [1, n_layer].

  -1 gives n_layer, a fully unrolled loop, on the CPU backend (measured with
  benchmarks/vs_pytorch.py on the 2-core CPU of the README, 6 layers:
  training 1,817 against 1,632 tokens/s scanned, peak RSS 907 against 733
  MiB; the scanned loop stacks every layer's backward-pass residuals into
  [L, ...] buffers and runs one layer at a time) and 1 on GPU and TPU, where
  nothing has been measured yet and an unrolled loop multiplies the compile
  time (on CPU, 24 layers: 17 s against 5 s).  The parameters ([L, ...]
  stacked) and the results are the same either way, to float32 rounding.
  """
  if scan_unroll < 0:
    return n_layer if jax.default_backend() == "cpu" else 1
  return max(1, min(scan_unroll, n_layer))


def attn_block_size(attn_block: int, deterministic: bool) -> int:
  """``model.attn_block`` with -1 ("per backend") resolved: queries per block.

  -1 gives :data:`CPU_TRAIN_ATTN_BLOCK` (64) when training on the CPU
  backend (``deterministic`` False: the blocks are rematerialised, so the
  backward pass keeps no [B, H, T, K] scores) and 0, the full computation,
  otherwise: in evaluation, and on GPU and TPU, where nothing has been
  measured yet.  Other values are returned as they are.  The result is the
  same either way (:func:`attention.query_blocks`), to fp32 rounding.
  """
  if attn_block >= 0:
    return attn_block
  return CPU_TRAIN_ATTN_BLOCK if (not deterministic and jax.default_backend() == "cpu") else 0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model's hyperparameters: the one definition of their names and defaults.

  ``default_config.get_config().model`` is derived from these fields (all
  but ``n_token``, which comes from the corpus); the names and meanings are
  the reference implementation's (``train.py`` arguments).  The defaults
  are the enwik8 12-layer base model.

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
    attn_type: attention variant, the reference's numbering (attention.py):
      0 = Transformer-XL (Sec. 3.3), 1 = Shaw et al. (2018) learned
      relative, 2 = Vaswani et al. (2017) absolute sinusoid, 3 = Al-Rfou et
      al. (2018) learned absolute per layer (needs n_head * d_head ==
      d_model).
    max_klen: rows of the learned position tables of types 1 and 3; 0 =
      the training attention length tgt_len + ext_len + mem_len (the
      reference's ``max_klen``).  The eval config keeps the training value.
    attn_block: queries per block of the blockwise attention (0 = the full
      [B, H, T, K] computation at once); the result is the same, the
      temporaries O(attn_block x K) (attention._attend).  -1 (the default)
      = chosen per backend and use by :func:`attn_block_size`.
    scan_unroll: layers per iteration of the ``nn.scan`` loop over layers
      (1 = one layer per iteration; n_layer or more = fully unrolled); the
      parameters and results are the same.  -1 (the default) = chosen per
      backend by :func:`scan_unroll_layers`.
    init_std: std of weight, embedding and u/v initialisation (0.02).
    dtype: compute dtype name, one of :data:`DTYPES`; parameters are
      float32; softmax and loss are float32.
    remat: rematerialisation policy of each layer in the backward pass, a
      key of :data:`REMAT_POLICIES`: "none", "full" (recompute the layer),
      "dots" (keep every matmul output), "save_qkv_proj" (keep the q, k, v
      and W_kR R projections), "save_proj" (keep every projection; the
      [B, H, T, K] scores are recomputed).
    d_embed: embedding size of the first cluster; 0 (or None) = d_model.
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

  Raises:
    ValueError (on construction): every problem :func:`config_problems`
      finds, in one message.
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
  max_klen: int = 0
  attn_block: int = -1
  scan_unroll: int = -1
  init_std: float = 0.02
  dtype: str = "float32"
  remat: str = "none"
  d_embed: Optional[int] = 0
  div_val: int = 1
  cutoffs: tuple = ()
  tie_projs: tuple = ()
  proj_init_std: float = 0.01

  def __post_init__(self):
    object.__setattr__(self, "cutoffs", tuple(int(c) for c in (self.cutoffs or ())))
    object.__setattr__(self, "tie_projs", tuple(bool(t) for t in (self.tie_projs or ())))
    problems = config_problems(dataclasses.asdict(self))
    if problems:
      raise ValueError("Invalid model config: " + " ".join(problems))

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """{field: default} for every field but n_token (``default_config.model``)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "n_token"}

  @property
  def pos_table_len(self) -> int:
    """``max_klen`` resolved: tgt_len + ext_len + mem_len when it is 0."""
    return self.max_klen or self.tgt_len + self.ext_len + self.mem_len

  @property
  def embed_dim(self) -> int:
    """``d_embed`` resolved: d_model when d_embed is 0 or None."""
    return self.d_model if not self.d_embed else int(self.d_embed)

  @property
  def compute_dtype(self):
    """``dtype`` as a numpy dtype."""
    return jnp.dtype(self.dtype)


def segment_problems(tgt_len: int, mem_len: int, clamp_len: int, same_length: bool,
                     ext_len: int = 0, section: str = "model") -> list[str]:
  """Problems of a segment layout (training ``model.*`` or ``eval.*``).

  Returns:
    One message per problem, naming ``<section>.<key>`` and the fix; [] if
    none.
  """
  problems = []
  if tgt_len < 1 or mem_len < 0 or clamp_len < 0:
    problems.append(f"{section}: tgt_len must be >= 1 and mem_len, clamp_len >= 0 (got "
                    f"{tgt_len}, {mem_len}, {clamp_len}).")
  if same_length and mem_len < 1:
    problems.append(f"{section}.same_length=True needs {section}.mem_len >= 1 (with no memory "
                    "every key would be masked).")
  if not 0 <= ext_len < max(tgt_len, 1):
    problems.append(f"{section}.ext_len={ext_len} must be in [0, tgt_len={tgt_len}).")
  return problems


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Every problem of a set of model hyperparameters, before anything is built.

  Args:
    fields: ModelConfig fields by name (e.g. ``config.model.to_dict()``);
      without ``n_token`` (the vocabulary is not known before the corpus is
      loaded) the checks that need it are skipped.

  Returns:
    One message per problem, naming ``model.<key>`` and the fix; [] if none.
  """
  f = {**ModelConfig.defaults(), **fields}
  problems = []
  for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner"):
    if f[key] < 1:
      problems.append(f"model.{key}={f[key]} must be >= 1.")
  if f["d_model"] % 2:
    problems.append(f"model.d_model={f['d_model']} must be even (sinusoid encoding).")
  problems += segment_problems(f["tgt_len"], f["mem_len"], f["clamp_len"], f["same_length"],
                               f["ext_len"])
  for key in ("dropout", "dropatt"):
    if not 0.0 <= f[key] < 1.0:
      problems.append(f"model.{key}={f[key]} must be in [0, 1).")
  for key in ("init_std", "proj_init_std"):
    if not 0.0 < f[key] < float("inf"):
      problems.append(f"model.{key}={f[key]} must be > 0 (the std of a normal initialiser).")
  if f["dtype"] not in DTYPES:
    problems.append(f"model.dtype={f['dtype']!r}: use one of {DTYPES}.")
  if f["remat"] not in REMAT_POLICIES:
    problems.append(f"model.remat={f['remat']!r}: use one of {tuple(REMAT_POLICIES)}.")
  if f["attn_type"] not in attention.ATTENTION_TYPES:
    problems.append(f"model.attn_type={f['attn_type']}: use one of "
                    f"{sorted(attention.ATTENTION_TYPES)} (0 Transformer-XL, 1 Shaw et al., "
                    "2 Vaswani et al., 3 Al-Rfou et al.).")
  if f["attn_type"] == 3 and f["n_head"] * f["d_head"] != f["d_model"]:
    problems.append(f"model.attn_type=3 adds a [d_model] row of its [max_klen, n_head, d_head] "
                    f"table: it needs n_head * d_head == d_model (got {f['n_head']} * "
                    f"{f['d_head']} != {f['d_model']}).")
  if f["attn_block"] < -1:
    problems.append(f"model.attn_block={f['attn_block']} must be >= -1 (-1 = chosen per "
                    "backend, 0 = no blocks, N = queries per block).")
  if f["scan_unroll"] < -1 or f["scan_unroll"] == 0:
    problems.append(f"model.scan_unroll={f['scan_unroll']} must be -1 (chosen per backend) or "
                    ">= 1 (layers per iteration of the loop over layers).")
  if f["max_klen"] < 0:
    problems.append(f"model.max_klen={f['max_klen']} must be >= 0 (0 = tgt_len + ext_len + "
                    "mem_len).")
  embed_dim = f["d_model"] if not f["d_embed"] else int(f["d_embed"])
  problems += adaptive.config_problems(f.get("n_token"), embed_dim, f["d_model"],
                                       tuple(f["cutoffs"] or ()), f["div_val"],
                                       tuple(f["tie_projs"] or ()))
  return problems


# ---------------------------------------------------------------------------
# The memory (Sec. 3.2).


@flax.struct.dataclass
class Memory:
  """Per-layer recurrence memory (Dai et al. 2019, Sec. 3.2).

  Attributes:
    mems_LxBxMxD: cached inputs of each layer, [n_layer, B, mem_len,
      d_model], compute dtype, right-aligned.
    mlen_B: int32 [B], how many of the last slots hold states.  A negative
      value -p (only with mem_len 0: the sliding-window evaluator) says
      that the segment's first p positions are padding, masked as keys
      like empty slots.
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


def advance_mlen(mlen_B: Array, mem_len: int, tgt_len: int, ext_len: int) -> Array:
  """Valid slots after caching a segment: ``min(M, mlen + T - ext_len)``, int32 [B]."""
  return jnp.minimum(mem_len, mlen_B + tgt_len - ext_len).astype(jnp.int32)


class DecoderLayer(nn.Module):
  """One Transformer-XL layer; the body of the ``nn.scan`` over layers.

  Dai et al. 2019, Sec. 3.2 and the equations at the end of Sec. 3.3.
  Post-LayerNorm by default: ``LN(h + Dropout(Attn))`` then ``LN(x + FF(x))``;
  with ``pre_lnorm`` the LayerNorm comes first (applied to concat(memory,
  h) before the qkv projection, as in the reference) and there is none after.
  """

  config: ModelConfig
  record_attention: bool = False

  @nn.compact
  def __call__(self, h_BxTxD: Array, mem_BxMxD: Array, pos_emb_KxD: Array,
               mask_Bx1xTxK: Array, r_w_bias_HxDh: Optional[Array],
               r_r_bias_HxDh: Optional[Array], deterministic: bool):
    """Runs the layer on one segment and returns the layer's next memory.

    Args:
      h_BxTxD: layer input for the segment (the scan carry).
      mem_BxMxD: this layer's memory (its inputs at the previous M positions).
      pos_emb_KxD: sinusoid R for distances K-1..0, K = M + T (attn_type 0;
        None otherwise).
      mask_Bx1xTxK: attention mask (attention.attention_mask).
      r_w_bias_HxDh, r_r_bias_HxDh: attn_type 0's shared u and v, or None
        with untie_r (then this layer owns its own) or for the other types.
      deterministic: disables dropout (static).

    Returns:
      (out_BxTxD, new_mem_BxMxD): the layer output (next carry) and the new
      memory of this layer.
    """
    cfg = self.config
    mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]

    # ---- The memory path (Sec. 3.2): h~ = [SG(m) o h] ----------------------
    mem_BxMxD = jax.lax.stop_gradient(mem_BxMxD)              # stop-gradient
    if cfg.attn_type == 3:  # Al-Rfou et al.: this layer's learned positions,
      mem_BxMxD, h_BxTxD = attention.absolute_positions(      # cached with the
          self._position_rows(mem_len + tgt_len), mem_BxMxD, h_BxTxD)  # inputs
    cat_BxKxD = jnp.concatenate([mem_BxMxD, h_BxTxD], axis=1)  # concat
    end = mem_len + tgt_len - cfg.ext_len                     # truncate: the last
    new_mem_BxMxD = jax.lax.stop_gradient(                    # M inputs before the
        cat_BxKxD[:, end - mem_len:end])                      # ext_len tail
    # --------------------------------------------------------------------------

    if cfg.untie_r and cfg.attn_type == 0:
      bias_init = attention.normal_init(cfg.init_std, "heads", "kv")
      r_w_bias_HxDh = self.param("r_w_bias", bias_init, (cfg.n_head, cfg.d_head))
      r_r_bias_HxDh = self.param("r_r_bias", bias_init, (cfg.n_head, cfg.d_head))

    kwargs = dict(max_klen=cfg.pos_table_len, clamp_len=cfg.clamp_len) if cfg.attn_type == 1 else {}
    attn = attention.ATTENTION_TYPES[cfg.attn_type](
        n_head=cfg.n_head, d_head=cfg.d_head, d_model=cfg.d_model,
        dropatt=cfg.dropatt, init_std=cfg.init_std, dtype=cfg.compute_dtype,
        deterministic=deterministic, record=self.record_attention,
        block_size=attn_block_size(cfg.attn_block, deterministic), name="attn", **kwargs)
    drop = nn.Dropout(cfg.dropout)
    ff = PositionwiseFF(cfg, name="pos_ff")

    # The attention reads concat(memory, segment) as its two parts (attention._kv_rows).
    if cfg.pre_lnorm:  # the LayerNorm of cat_BxKxD, row by row
      attn_norm = _layer_norm("attn_layer_norm")
      attn_out = attn(h_BxTxD, attn_norm(mem_BxMxD).astype(cfg.compute_dtype),
                      attn_norm(h_BxTxD).astype(cfg.compute_dtype), pos_emb_KxD, mask_Bx1xTxK,
                      r_w_bias_HxDh, r_r_bias_HxDh)
      x_BxTxD = h_BxTxD + drop(attn_out, deterministic=deterministic)
      ff_in = _layer_norm("ff_layer_norm")(x_BxTxD).astype(cfg.compute_dtype)
      out_BxTxD = x_BxTxD + ff(ff_in, deterministic)
    else:
      attn_out = attn(h_BxTxD, mem_BxMxD, h_BxTxD, pos_emb_KxD, mask_Bx1xTxK, r_w_bias_HxDh,
                      r_r_bias_HxDh)
      x_BxTxD = _layer_norm("attn_layer_norm")(
          h_BxTxD + drop(attn_out, deterministic=deterministic))
      x_BxTxD = x_BxTxD.astype(cfg.compute_dtype)
      out_BxTxD = _layer_norm("ff_layer_norm")(x_BxTxD + ff(x_BxTxD, deterministic))
    return out_BxTxD.astype(cfg.compute_dtype), new_mem_BxMxD

  def _position_rows(self, klen: int) -> Array:
    """attn_type 3: this layer's learned absolute positions for the K keys,
    [K, d_model] (parameter ``r_emb`` [max_klen, n_head, d_head], reference
    ``MemTransformerLM.r_emb[i]``; padded with its first row when K >
    max_klen, :func:`attention.position_table`)."""
    cfg = self.config
    table = self.param("r_emb", attention.normal_init(cfg.init_std, "length", "heads", "kv"),
                       (cfg.pos_table_len, cfg.n_head, cfg.d_head))
    table_NxD = table.reshape(cfg.pos_table_len, cfg.d_model)
    return attention.position_table(table_NxD, klen).astype(cfg.compute_dtype)


def _layer_norm(name: str) -> nn.LayerNorm:
  """LayerNorm with the reference init: weight N(1, 0.02), bias 0, eps 1e-5."""
  scale_init = lambda key, shape, dtype: 1.0 + 0.02 * jax.random.normal(key, shape, dtype)
  return nn.LayerNorm(
      epsilon=1e-5, dtype=jnp.float32, name=name,
      scale_init=nn.with_logical_partitioning(scale_init, ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


class PositionwiseFF(nn.Module):
  """Linear -> ReLU -> Dropout -> Linear -> Dropout (reference ``PositionwiseFF``).

  The two linear outputs are tagged ``ff_1`` and ``ff_2`` for the remat
  policies (:data:`REMAT_POLICIES`).
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: Array, deterministic: bool) -> Array:
    """[B, T, d_model] -> [B, T, d_model] in the compute dtype."""
    cfg = self.config
    h_BxTxF = nn.Dense(
        cfg.d_inner, dtype=cfg.compute_dtype, name="ff_1",
        kernel_init=attention.normal_init(cfg.init_std, "embed", "mlp"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x_BxTxD)
    h_BxTxF = checkpoint_name(h_BxTxF, "ff_1")
    h_BxTxF = nn.Dropout(cfg.dropout)(nn.relu(h_BxTxF), deterministic=deterministic)
    out_BxTxD = nn.Dense(
        cfg.d_model, dtype=cfg.compute_dtype, name="ff_2",
        kernel_init=attention.normal_init(cfg.init_std, "mlp", "embed"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(h_BxTxF)
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
    config: :class:`ModelConfig` (validated when it was constructed).
    record_attention: every layer sows its attention probabilities into the
      "intermediates" collection (``attention._Attention.record``; stacked
      over layers by the scan), for ``analysis.attention``.
  """

  config: ModelConfig
  record_attention: bool = False

  def setup(self):
    cfg = self.config
    self.word_emb = adaptive.AdaptiveEmbedding(
        n_token=cfg.n_token, d_embed=cfg.embed_dim, d_proj=cfg.d_model, cutoffs=cfg.cutoffs,
        div_val=cfg.div_val, init_std=cfg.init_std, proj_init_std=cfg.proj_init_std,
        dtype=cfg.compute_dtype)
    self.crit = adaptive.ProjectedAdaptiveLogSoftmax(
        n_token=cfg.n_token, d_embed=cfg.embed_dim, d_proj=cfg.d_model, cutoffs=cfg.cutoffs,
        div_val=cfg.div_val, tie_weight=cfg.tie_weight, tie_projs=cfg.tie_projs,
        init_std=cfg.init_std, proj_init_std=cfg.proj_init_std)
    if cfg.attn_type == 0 and not cfg.untie_r:  # u, v shared by all layers
      bias_init = attention.normal_init(cfg.init_std, "heads", "kv")
      self.r_w_bias = self.param("r_w_bias", bias_init, (cfg.n_head, cfg.d_head))
      self.r_r_bias = self.param("r_r_bias", bias_init, (cfg.n_head, cfg.d_head))
    self.drop = nn.Dropout(cfg.dropout)

    layer_cls = DecoderLayer
    if cfg.remat != "none":
      # static_argnums counts self as 0: `deterministic` is argument 7.
      layer_cls = nn.remat(layer_cls, prevent_cse=False, static_argnums=(7,),
                           policy=REMAT_POLICIES[cfg.remat])
    self.layers = nn.scan(
        layer_cls,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        # Scanned: the memory.  Broadcast: R, mask, u, v, deterministic.
        in_axes=(0,) + (nn.broadcast,) * 5,
        out_axes=0,
        length=cfg.n_layer, unroll=scan_unroll_layers(cfg.scan_unroll, cfg.n_layer),
        metadata_params={nn.PARTITION_NAME: "layers"},
    )(cfg, record_attention=self.record_attention)

  def hidden(self, tokens_BxT: Array, memory: Memory, deterministic: bool = True,
             reset_B: Optional[Array] = None):
    """Final hidden states and the next memory.

    Args:
      tokens_BxT: int32 token ids of the segment.
      memory: the previous segments' :class:`Memory`; mem_len is read from
        its shape (so evaluation may use a longer memory than training).
      deterministic: disables dropout (needs a "dropout" rng otherwise).
      reset_B: optional bool [B]: rows that start a new stream here (their
        memory is emptied first, :func:`reset_memory`).

    Returns:
      (hidden_BxTxD in the compute dtype, next Memory).
    """
    emb_BxTxD = self.word_emb(tokens_BxT)
    return self.hidden_from_embeddings(emb_BxTxD, memory, deterministic, reset_B)

  def hidden_from_embeddings(self, emb_BxTxD: Array, memory: Memory, deterministic: bool = True,
                             reset_B: Optional[Array] = None):
    """As :meth:`hidden`, from the scaled word embeddings [B, T, d_model]
    (the output of ``word_emb``): where the memory enters and leaves the model.

    Raises:
      ValueError: the segment is not longer than ext_len.
    """
    cfg = self.config
    _, _, mem_len, _ = memory.mems_LxBxMxD.shape
    tgt_len = emb_BxTxD.shape[1]
    if tgt_len <= cfg.ext_len:
      raise ValueError(f"segment length {tgt_len} must exceed ext_len={cfg.ext_len}.")
    if reset_B is not None:                                       # reset
      memory = reset_memory(memory, reset_B)
    emb_BxTxD = emb_BxTxD.astype(cfg.compute_dtype)
    mems_LxBxMxD = memory.mems_LxBxMxD.astype(cfg.compute_dtype)
    pos_emb_KxD = r_w_bias = r_r_bias = None
    if cfg.attn_type == 0:  # R of Sec. 3.3 (with dropout, as in the reference)
      pos_emb_KxD = self.drop(
          attention.sinusoid_pos_emb(mem_len + tgt_len, cfg.d_model, cfg.clamp_len),
          deterministic=deterministic)
      if not cfg.untie_r:
        r_w_bias, r_r_bias = self.r_w_bias, self.r_r_bias
    elif cfg.attn_type == 2:  # Vaswani et al.: sinusoid positions at the input, and
      mem0_BxMxD, emb_BxTxD = attention.absolute_positions(  # to layer 0's memory
          attention.sinusoid_pos_emb(mem_len + tgt_len, cfg.d_model, cfg.clamp_len),
          mems_LxBxMxD[0], emb_BxTxD)
      mems_LxBxMxD = mems_LxBxMxD.at[0].set(mem0_BxMxD)
    h_BxTxD = self.drop(emb_BxTxD, deterministic=deterministic)
    mask_Bx1xTxK = attention.attention_mask(tgt_len, mem_len, memory.mlen_B, cfg.same_length)

    h_BxTxD, new_mems_LxBxMxD = self.layers(                      # read (scanned in),
        h_BxTxD, mems_LxBxMxD, pos_emb_KxD,                       # new memory (out)
        mask_Bx1xTxK, r_w_bias, r_r_bias, deterministic)
    new_memory = Memory(                                          # return
        mems_LxBxMxD=new_mems_LxBxMxD,
        mlen_B=advance_mlen(memory.mlen_B, mem_len, tgt_len, cfg.ext_len))
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
               deterministic: bool = True, reset_B: Optional[Array] = None):
    """Scores one segment.

    Args:
      tokens_BxT: int32 inputs.
      memory: :class:`Memory` of the previous segments.
      targets_BxT: int32 next tokens; when given the per-token negative
        log-likelihood is returned, otherwise log-probabilities.
      deterministic: disables dropout.
      reset_B: optional bool [B], rows whose memory is emptied first.

    Returns:
      (nll_BxT float32 in nats, next Memory) with targets, else
      (log_probs_BxTxV float32, next Memory).
    """
    hidden_BxTxD, new_memory = self.hidden(tokens_BxT, memory, deterministic, reset_B)
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
  return model.init(rng, tok_1xT, init_memory(cfg, 1), tok_1xT)["params"]
