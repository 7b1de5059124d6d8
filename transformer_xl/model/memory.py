"""The recurrence memory of Transformer-XL (Dai et al. 2019, Sec. 3.2).

The memory is explicit state, never a mutable collection: a ``Memory`` goes
into every call of the model and the next ``Memory`` comes out.  This module
is the one place that knows its fields; everything else goes through the
methods below.

State, per batch row b (the rows axis of each field is ``Memory.ROW_AXES``):

  mems_LxBxMxD  the *inputs* of each of the L layers at the last M = mem_len
                positions, compute dtype, right-aligned;
  mlen_B        int32, how many of those M slots hold states (0: an empty
                memory, the reference's start with no memory; shapes stay
                static, empty slots are masked);
  pad_B         int32 or unset: positions at the front of the next segment
                that are padding (evaluation and generation only);
  mem_tokens_BxNxD, mem_tokens_fresh_B
                or unset: the memory tokens of the Recurrent Memory
                Transformer (model.num_mem_tokens > 0; the last section
                of this module) and the rows that read the learned ones.

Key layout: a layer attends over K = M + T keys, its M memory slots then the
T positions of the segment; the valid slots are the last ``mlen_B[b]`` of
the M, so key k of row b is visible when ``k >= M - mlen_B[b]``
(``attention_ops.attention_mask``).  Front padding (``pad_B``, set by
``Memory.with_front_padding``) masks the segment's first positions the
same way: the layout's count is ``Memory.key_count_B`` = mlen_B - pad_B.

Life of a segment:

  reset    ``Memory.reset``: rows flagged ``reset_B`` get ``mlen_B = 0``
           (a new stream; the stale states stay, masked).
  read     ``TransformerXL.hidden_from_embeddings`` hands layer l the slice
           ``mems_LxBxMxD[l]`` (scanned input) and builds the mask from
           ``Memory.key_count_B``; ``layer_read`` stops the gradient into it.
  update   ``layer_update``: the layer's new memory is the last M of
           [memory; segment inputs] (the reference's ``end - M .. end``
           window, ``end = M + T``).
  advance  ``Memory.advance``: the stacked new memories with
           ``advance_mlen``'s count, ``min(M, mlen_B + T)``.

Memory variants (``MemoryVariant``, ``model.memory``) fill the slots their
own way with the same pytree and key layout: the compressive memory
(``CompressiveMemory``, Rae et al. 2020) keeps ``cmem_len`` compressed
slots in front of the M, and ``mlen_B`` counts the valid slots of both.

Row-wise work (gradient-accumulation chunks, gathering generation rows,
shardings over the batch mesh axes) uses ``Memory.map_rows`` and
``Memory.shardings``, which read the row axes.  The pytree (these field
names; ``pad_B`` and the memory tokens only when set) is what checkpoints
hold: a field that training carries breaks them, unless it is left out
while unset as ``pad_B`` is.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_xl.model import axes
from transformer_xl.model.attention_ops import MASK_VALUE, normal_init

if TYPE_CHECKING:  # config.py validates model.memory against VARIANTS (imports this module)
  from transformer_xl.model.config import ModelConfig

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-layer recurrence memory (Dai et al. 2019, Sec. 3.2).

  A pytree whose children are its array fields: ``pad_B`` is a child only
  when set, so the memory that training carries (and its checkpoints
  hold) has exactly the two fields that checkpoints have always held.

  Attributes:
    mems_LxBxMxD: cached inputs of each layer, [n_layer, B, mem_len,
      d_model], compute dtype, right-aligned.
    mlen_B: int32 [B], in [0, M]: how many of the last slots hold states.
    pad_B: int32 [B] >= 0, or None (no padding): how many positions at the
      front of the next segment are padding, masked as keys like empty
      slots, so that the rest of the row is read as if it stood alone (the
      sliding-window evaluator with mem_len 0; generation's prompts of
      different lengths).  Padding longer than a segment carries over to
      the next one (``advance``).
    mem_tokens_BxNxD: the memory tokens (Bulatov et al. 2022) the next
      segment reads, [B, num_mem_tokens, d_model], compute dtype, or None
      (model.num_mem_tokens = 0): the last segment's written tokens
      (``write_tokens``).  Set together with ``mem_tokens_fresh_B``.
    mem_tokens_fresh_B: bool [B] or None: rows that read the learned
      initial tokens (the parameter ``mem_tokens``) instead of
      ``mem_tokens_BxNxD``: a new stream (``init_memory``) or a reset row
      (``reset``); ``read_tokens``.
  """

  mems_LxBxMxD: Array
  mlen_B: Array
  pad_B: Array | None = None
  mem_tokens_BxNxD: Array | None = None
  mem_tokens_fresh_B: Array | None = None

  # field -> (rows axis, number of axes); class-level, not pytree fields.
  ROW_AXES: ClassVar[Mapping[str, int]] = types.MappingProxyType(
      {
          "mems_LxBxMxD": 1,
          "mlen_B": 0,
          "pad_B": 0,
          "mem_tokens_BxNxD": 0,
          "mem_tokens_fresh_B": 0,
      }
  )
  NDIMS: ClassVar[Mapping[str, int]] = types.MappingProxyType(
      {
          "mems_LxBxMxD": 4,
          "mlen_B": 1,
          "pad_B": 1,
          "mem_tokens_BxNxD": 3,
          "mem_tokens_fresh_B": 1,
      }
  )
  TOKEN_FIELDS: ClassVar[tuple[str, ...]] = ("mem_tokens_BxNxD", "mem_tokens_fresh_B")

  def replace(self, **changes: Any) -> Memory:
    """A copy with ``changes`` (field name -> value)."""
    return dataclasses.replace(self, **changes)

  def _present(self) -> tuple[str, ...]:
    """The fields that are children of the pytree (pad_B and the memory
    tokens only when set; a Memory that jax rebuilt from a pytree structure
    keeps that structure's fields whatever its children, which jax may
    replace by None, e.g. for jit's default output layouts)."""
    names = self.__dict__.get("_names")
    if names is not None:
      return names
    return (
        ("mems_LxBxMxD", "mlen_B")
        + (() if self.pad_B is None else ("pad_B",))
        + (() if self.mem_tokens_BxNxD is None else self.TOKEN_FIELDS)
    )

  @property
  def mem_len(self) -> int:
    """M, the memory slots per layer (static)."""
    return self.mems_LxBxMxD.shape[2]

  def key_count_B(self) -> Array:
    """The key layout's count per row, int32 [B]: key k (of K = M + T) is
    visible when ``k >= M - count`` (``attention_ops.attention_mask``, the
    Pallas kernel): the valid slots, minus the front padding (a negative
    count masks the segment's first positions)."""
    return self.mlen_B if self.pad_B is None else self.mlen_B - self.pad_B

  def map_rows(self, fn: Callable[[Any, int], Any]) -> Memory:
    """A Memory of ``fn(field, rows_axis)`` for each field that is set.

    For row-wise work that must treat every field alike: selecting or
    gathering rows (``lambda x, axis: jnp.take(x, idx, axis=axis)``),
    splitting rows into micro-batches and back.  ``rows_axis`` is the
    field's batch axis (``ROW_AXES``): 1 for mems_LxBxMxD, 0 for the others.
    """
    return self.replace(
        **{name: fn(getattr(self, name), self.ROW_AXES[name]) for name in self._present()}
    )

  @classmethod
  def _names(cls, padded: bool, tokens: bool) -> list[str]:
    """The fields of a Memory with or without ``pad_B`` and the memory tokens."""
    return [
        n
        for n in cls.ROW_AXES
        if (padded or n != "pad_B") and (tokens or n not in cls.TOKEN_FIELDS)
    ]

  @classmethod
  def shardings(cls, mesh: Mesh, padded: bool = False, tokens: bool = False) -> Memory:
    """NamedShardings of a Memory on ``mesh``: each field's rows split over
    the batch mesh axes (``axes.BATCH_AXES`` present in ``mesh``, as the
    batch's rows), its other axes replicated; ``padded``: with ``pad_B``;
    ``tokens``: with the memory tokens (``has_tokens(cfg)``)."""
    rows = tuple(a for a in axes.BATCH_AXES if a in mesh.axis_names)

    def spec(name: str) -> PartitionSpec:
      row_axis, ndim = cls.ROW_AXES[name], cls.NDIMS[name]
      return PartitionSpec(*(rows if i == row_axis else None for i in range(ndim)))

    return cls(**{name: NamedSharding(mesh, spec(name)) for name in cls._names(padded, tokens)})

  @classmethod
  def replicated_shardings(cls, mesh: Mesh, padded: bool = False, tokens: bool = False) -> Memory:
    """NamedShardings of a Memory held whole on every device of ``mesh``."""
    return cls(
        **{name: NamedSharding(mesh, PartitionSpec()) for name in cls._names(padded, tokens)}
    )

  def reset(self, reset_B: Array) -> Memory:
    """Empties the memory of the rows where ``reset_B`` (bool [B]) is True
    (and drops their padding).

    Only the counts change: empty slots are masked, so their stale
    contents never reach an output.  With memory tokens the rows are
    flagged to read the learned initial tokens (``mem_tokens_fresh_B``).
    """
    out = self.replace(mlen_B=jnp.where(reset_B, 0, self.mlen_B))
    if self.pad_B is not None:
      out = out.replace(pad_B=jnp.where(reset_B, 0, self.pad_B))
    if self.mem_tokens_fresh_B is not None:
      out = out.replace(mem_tokens_fresh_B=self.mem_tokens_fresh_B | reset_B)
    return out

  def with_front_padding(self, pad_B: Array) -> Memory:
    """This memory, with ``pad_B[b]`` (int32 [B], >= 0) padding positions at
    the front of row b's next segment.  Meant for an empty memory
    (``init_memory``): the padded positions are masked as keys, like empty
    slots, so the rest of the segment is read as if it stood alone."""
    return self.replace(pad_B=jnp.asarray(pad_B, jnp.int32))

  def advance(self, new_mems_LxBxMxD: Array, tgt_len: int, count_B: Array | None = None) -> Memory:
    """The memory after a segment of ``tgt_len`` inputs.

    Padding is consumed first: a row with p padding positions before the
    segment keeps ``max(p - T, 0)`` of them and gains ``max(T - p, 0)``
    valid slots (``advance_mlen``).

    Args:
      new_mems_LxBxMxD: the layers' new memories (``layer_update``, stacked
        over layers), [n_layer, B, M, d_model].
      tgt_len: T, the segment length.
      count_B: the key layout's count after the segment, int32 [B] (valid
        slots, or minus the padding still to come), when a memory variant
        counts otherwise (``MemoryVariant.advance``); None: ``advance_mlen``.
    """
    if count_B is None:
      count_B = advance_mlen(self.key_count_B(), self.mem_len, tgt_len)
    if self.pad_B is None:
      return self.replace(mems_LxBxMxD=new_mems_LxBxMxD, mlen_B=count_B)
    return self.replace(
        mems_LxBxMxD=new_mems_LxBxMxD,
        mlen_B=jnp.maximum(count_B, 0),
        pad_B=jnp.maximum(-count_B, 0).astype(jnp.int32),
    )


def _flatten_with_keys(memory: Memory):
  names = memory._present()
  return [(jax.tree_util.GetAttrKey(n), getattr(memory, n)) for n in names], names


def _flatten(memory: Memory):
  names = memory._present()
  return [getattr(memory, n) for n in names], names


def _unflatten(names: tuple[str, ...], children) -> Memory:
  memory = Memory(**dict(zip(names, children)))
  object.__setattr__(memory, "_names", names)  # not a field: ``replace`` recomputes it
  return memory


jax.tree_util.register_pytree_with_keys(Memory, _flatten_with_keys, _unflatten, _flatten)


def init_memory(config: ModelConfig, batch_size: int, mem_len: int | None = None) -> Memory:
  """Empty memory: zeros with no valid slot (the reference's empty start).

  Args:
    config: model config (n_layer, d_model, dtype).
    batch_size: B.
    mem_len: the memory length (``mem_len``); defaults to config.mem_len.
      The slots per layer are the variant's ``slots(mem_len, config)`` (mem_len for
      the XL memory).

  Returns:
    A Memory of zeros [n_layer, B, M, d_model] in the compute dtype and an
    int32 [B] count of 0; with memory tokens (``has_tokens``) also zeros
    [B, num_mem_tokens, d_model] flagged fresh (every row reads the learned
    initial tokens).
  """
  m = variant(config).slots(config.mem_len if mem_len is None else mem_len, config)
  memory = Memory(
      mems_LxBxMxD=jnp.zeros((config.n_layer, batch_size, m, config.d_model), config.compute_dtype),
      mlen_B=jnp.zeros((batch_size,), jnp.int32),
  )
  if not has_tokens(config):
    return memory
  return memory.replace(
      mem_tokens_BxNxD=jnp.zeros(
          (batch_size, config.num_mem_tokens, config.d_model), config.compute_dtype
      ),
      mem_tokens_fresh_B=jnp.ones((batch_size,), jnp.bool_),
  )


def reset_memory(memory: Memory, reset_B: Array) -> Memory:
  """``memory.reset(reset_B)``: rows where ``reset_B`` (bool [B]) is True
  start empty."""
  return memory.reset(reset_B)


def advance_mlen(mlen_B: Array, mem_len: int, tgt_len: int) -> Array:
  """The key layout's count after caching a segment: ``min(M, count + T)``,
  int32 [B] (``Memory.key_count_B``: the valid slots, or minus the padding
  still to come when negative)."""
  return jnp.minimum(mem_len, mlen_B + tgt_len).astype(jnp.int32)


def layer_read(mem_BxMxD: Array) -> Array:
  """A layer's memory as it enters the layer: ``SG(m)`` of Sec. 3.2, no
  gradient ever flows into a previous segment.  [B, M, d_model], dtype
  kept."""
  return jax.lax.stop_gradient(mem_BxMxD)


def layer_update(mem_BxMxD: Array, h_BxTxD: Array) -> Array:
  """A layer's next memory: the last M of [memory; segment].

  The reference's ``cat[end - M:end]`` with ``end = M + T``
  (``_update_mems``): the memory is a FIFO of the layer's last M inputs.
  Its gradient is stopped.

  Args:
    mem_BxMxD: the layer's memory as read (``layer_read``, after the
      variant's ``layer_inputs``), [B, M, d_model].
    h_BxTxD: the layer's inputs for the segment, [B, T, d_model], the
      memory's dtype.

  Returns:
    new_mem_BxMxD, [B, M, d_model], the inputs' dtype.
  """
  mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]
  cat_BxKxD = jnp.concatenate([mem_BxMxD, h_BxTxD], axis=1)  # h~ = [SG(m) o h]
  end = mem_len + tgt_len
  return jax.lax.stop_gradient(cat_BxKxD[:, end - mem_len : end])


# ---------------------------------------------------------------------------
# Memory variants: how a layer's memory slots are filled.  ``model.memory``
# names one; a new variant subclasses ``MemoryVariant`` and is registered
# with ``register``.  It may use more slots than ``mem_len`` (``slots``),
# learn parameters and ``sow`` auxiliary losses in its ``layer_update``; the
# key layout stays the one above (K = slots + T keys, the valid slots
# right-aligned, counted by ``advance_mlen``), so the masks, relative
# positions and the fused kernel need no change.


class MemoryVariant:
  """The XL memory (Sec. 3.2): each layer keeps its last ``mem_len`` inputs.

  The base class of memory variants; a variant overrides what differs.
  """

  name: ClassVar[str] = "xl"
  # Generation's decoding cache rolls each layer's projected keys and
  # values as a FIFO beside the memory (``attention_ops.CachedKV``): only
  # right for a memory that is a FIFO of the layer's inputs.
  decode_cache: ClassVar[bool] = True

  @staticmethod
  def slots(mem_len: int, cfg: ModelConfig) -> int:
    """Memory slots per layer for a memory length ``mem_len`` (M) of the
    model ``cfg``."""
    del cfg
    return mem_len

  @staticmethod
  def config_problems(fields: Mapping[str, Any]) -> list[str]:
    """What the variant needs of the other model fields: one message per
    problem, naming ``model.<key>`` and the fix ([] if none)."""
    del fields
    return []

  @staticmethod
  def layer_update(
      module: nn.Module, cfg: ModelConfig, mem_BxMxD: Array, h_BxTxD: Array, key_count_B: Array
  ) -> Array:
    """A layer's next memory (gradient stopped), called inside the layer
    (``DecoderLayer``, after its attention, whose parameters are then in
    ``module.variables``) so that a variant may create parameters and
    ``module.sow("losses", name, scalar)`` an auxiliary loss there.

    Args:
      module: the calling layer (a compact flax module).
      cfg: the ModelConfig.
      mem_BxMxD: the layer's memory as read (``layer_read``, after the
        attention variant's ``layer_inputs``), [B, slots, d_model].
      h_BxTxD: the layer's inputs for the segment, [B, T, d_model].
      key_count_B: int32 [B], the key layout's count before the segment
        (``Memory.key_count_B``: the valid slots, minus the front padding).

    Returns:
      new_mem_BxMxD, [B, slots, d_model], the inputs' dtype.
    """
    del module, key_count_B
    return layer_update(mem_BxMxD, h_BxTxD)

  @staticmethod
  def advance(cfg: ModelConfig, memory: Memory, new_mems_LxBxMxD: Array, tgt_len: int) -> Memory:
    """The next ``Memory`` from the layers' new memories (stacked over
    layers, [n_layer, B, slots, d_model]) after a segment of ``tgt_len``:
    ``Memory.advance``, whose count is ``advance_mlen``'s."""
    del cfg
    return memory.advance(new_mems_LxBxMxD, tgt_len)


VARIANTS: dict[str, type[MemoryVariant]] = {"xl": MemoryVariant}


def register(cls: type[MemoryVariant]) -> type[MemoryVariant]:
  """Adds a memory variant under ``cls.name`` (a class decorator).

  Raises:
    ValueError: another variant has that name.
  """
  if VARIANTS.get(cls.name, cls) is not cls:
    raise ValueError(f"a memory variant named {cls.name!r} exists: {VARIANTS[cls.name]}.")
  VARIANTS[cls.name] = cls
  return cls


def variant(cfg: ModelConfig) -> type[MemoryVariant]:
  """The memory variant of ``cfg.memory`` (a validated ModelConfig)."""
  return VARIANTS[cfg.memory]


def eval_problems(
    fields: Mapping[str, Any], tgt_len: int, method: str, window: int, cmem_len: int = -1
) -> list[str]:
  """What the compressive memory needs of the evaluation: ``eval.cmem_len``
  (the compressed slots at evaluation) -1 (= ``model.cmem_len``) or >= 0,
  and > 0 only with the compressive memory; the eval segment length
  (``eval.tgt_len``, or with ``eval.method="sliding"`` the window,
  ``eval.window``, 0 = model.tgt_len + model.mem_len) a multiple of
  ``model.cmem_ratio``, as the training one; [] if none (or a ratio that
  ``config_problems`` refuses)."""
  c = fields.get("cmem_ratio", 1)
  compressive = fields.get("memory", "xl") == "compressive"
  if not isinstance(cmem_len, int) or cmem_len < -1:
    return [
        f"eval.cmem_len={cmem_len!r} must be -1 (= model.cmem_len) or an integer >= 0 "
        "(compressed-memory slots at evaluation)."
    ]
  if cmem_len > 0 and not compressive:
    return [
        f"eval.cmem_len={cmem_len} needs model.memory='compressive' (the model has "
        f"{fields.get('memory', 'xl')!r}); leave it at -1."
    ]
  if not compressive or not isinstance(c, int) or c < 1 or method == "sliding":
    return []  # a sliding window has no memory, so nothing to compress
  if tgt_len % c and (fields.get("cmem_len", 0) if cmem_len < 0 else cmem_len):
    return [
        f"eval.tgt_len={tgt_len} must be a multiple of model.cmem_ratio={c} with "
        "model.memory='compressive'."
    ]
  return []


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Problems of ``model.memory``, of the compressive memory's fields
  (``cmem_len``, ``cmem_ratio``, ``cmem_fn``) and of what the variant
  needs; [] if none."""
  name = fields.get("memory", "xl")
  problems = []
  cmem_len, ratio = fields.get("cmem_len", 0), fields.get("cmem_ratio", 1)
  fn = fields.get("cmem_fn", CMEM_FNS[0])
  if not isinstance(cmem_len, int) or cmem_len < 0:
    problems.append(
        f"model.cmem_len={cmem_len!r} must be an integer >= 0 (0 = no compressed memory)."
    )
  elif cmem_len > 0 and name != "compressive":
    problems.append(
        f"model.cmem_len={cmem_len} needs model.memory='compressive' (got {name!r}); "
        "or set model.cmem_len=0."
    )
  if not isinstance(ratio, int) or ratio < 1:
    problems.append(f"model.cmem_ratio={ratio!r} must be an integer >= 1 (the compression rate c).")
  if fn not in CMEM_FNS:
    problems.append(f"model.cmem_fn={fn!r}: use one of {CMEM_FNS}.")
  if name not in VARIANTS:
    return problems + [f"model.memory={name!r}: use one of {tuple(sorted(VARIANTS))}."]
  return problems + VARIANTS[name].config_problems(fields) + token_config_problems(fields)


# ---------------------------------------------------------------------------
# The compressive memory (Rae et al. 2020, "Compressive Transformers for
# Long-Range Sequence Modelling", arXiv 1911.05507).

# model.cmem_fn: the compression functions of Sec. 3.1 / Table 1 of the paper.
CMEM_FNS = ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")
# Those with learned parameters (trained by the reconstruction loss alone).
CMEM_LEARNED = ("conv", "dilated_conv")
# The compression network's parameters (``compress``): trained by the
# reconstruction loss alone, with an optimiser of their own
# (``own_optimiser``).
CMEM_PARAMS = ("cmem_kernel", "cmem_bias")


def own_optimiser(cfg: ModelConfig | None) -> bool:
  """Whether the model has parameters the paper optimises apart from the
  language model: the compression network of a compressive memory with a
  learned ``cmem_fn`` and ``cmem_len`` > 0 (Rae et al. 2020, Sec. 3.2: "the
  compression network optimizes the compression objective"; their global-
  norm clipping then bounds each part's step on its own)."""
  return (
      cfg is not None
      and cfg.memory == "compressive"
      and cfg.cmem_len > 0
      and cfg.cmem_fn in CMEM_LEARNED
  )


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

  ``cfg.cmem_fn`` (``CMEM_FNS``), c = ``cfg.cmem_ratio``:

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
  c, fn = cfg.cmem_ratio, cfg.cmem_fn
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
  decode_cache = False

  @staticmethod
  def slots(mem_len: int, cfg: ModelConfig) -> int:
    return mem_len + cfg.cmem_len

  @staticmethod
  def config_problems(fields: Mapping[str, Any]) -> list[str]:
    problems = []
    c, tgt_len = fields.get("cmem_ratio", 1), fields.get("tgt_len", 1)
    if isinstance(c, int) and c >= 1 and tgt_len % c and fields.get("cmem_len", 0):
      problems.append(
          f"model.tgt_len={tgt_len} must be a multiple of model.cmem_ratio={c} (each "
          f"segment's {tgt_len} evicted states are compressed {c} at a time)."
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

  @staticmethod
  def layer_update(module, cfg, mem_BxMxD, h_BxTxD, key_count_B):
    nc = cfg.cmem_len
    if nc == 0:
      return layer_update(mem_BxMxD, h_BxTxD)
    c, tgt_len = cfg.cmem_ratio, h_BxTxD.shape[1]
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
    if cfg.cmem_fn == "most_used":
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

  @staticmethod
  def advance(cfg, memory, new_mems_LxBxMxD, tgt_len):
    if cfg.cmem_len == 0:
      return memory.advance(new_mems_LxBxMxD, tgt_len)
    count_B = compressive_count(
        memory.key_count_B(),
        memory.mem_len - cfg.cmem_len,
        cfg.cmem_len,
        cfg.cmem_ratio,
        tgt_len,
    )
    return memory.advance(new_mems_LxBxMxD, tgt_len, count_B)


# ---------------------------------------------------------------------------
# Memory tokens: the Recurrent Memory Transformer (Bulatov, Kuratov, Burtsev
# 2022, "Recurrent Memory Transformer", arXiv 2207.06881), as the authors'
# fork of the reference code implements it (booydar/LM-RMT,
# ``pytorch/mem_transformer.py``: ``MemTransformerLM`` with
# ``num_mem_tokens``, ``mem_at_end``, ``read_mem_from_cache``).
#
# Not a ``MemoryVariant``: the tokens go beside the XL cache (any mem_len,
# 0 included).  N = num_mem_tokens tokens are read at the start of each
# segment and, with ``mem_at_end``, written at its end: the layers run on
# the extended segment of E = N + T (+ N) positions
#
#     [read tokens; segment; write tokens]        (``extend_segment``)
#
# and everything else follows from that, as in the authors' ``_forward``:
#
# * the relative positions count every position of the extended segment
#   (their ``pos_seq`` runs over klen = mlen + E): the model builds R for
#   K = M + E keys;
# * the XL cache is the last M of [cache; extended segment] per layer
#   (their ``_update_mems`` over the extended hidden states): memory-token
#   positions enter the cache like segment positions, and the count
#   advances by E (``advance_mlen``);
# * the mask (``token_mask``): read rows see each other (all N, in both
#   directions) and the valid cache slots only with ``read_mem_from_cache``;
#   write rows see everything causally before them (the segment and the read
#   tokens), each other (all N) and the cache only with
#   ``read_mem_from_cache``; segment rows see the cache, the read tokens and
#   the segment causally, never the write tokens.  With ``same_length``
#   their code builds the plain same_length mask over the extended segment
#   and drops these rules: so does ``token_mask``;
# * where a memory-token row sees a key after it (distance < 0), the
#   reference's relative shift (Appendix B's trick, ``rel_shift``) leaves the
#   position term of a neighbouring entry there; exact parity needs the same
#   numbers (``future_position_scores``);
# * the loss is on the T segment positions; the written tokens are the final
#   hidden states (after the model's last dropout, as theirs) at the write
#   positions, or at the read positions without ``mem_at_end``
#   (``split_segment``), and the next segment reads them
#   (``write_tokens``, ``read_tokens``).
#
# The state is two optional fields of ``Memory`` (``mem_tokens_BxNxD``,
# ``mem_tokens_fresh_B``; absent when num_mem_tokens = 0, so the pytree and
# the checkpoints of other models are unchanged); the learned initial tokens
# are the model parameter ``mem_tokens`` [N, d_model] (``token_param``), read
# by rows that start a stream or are reset (``Memory.reset``).  The written
# tokens keep their gradient (``write_tokens``): a training step over several
# segments (``train.mem_backprop_depth``, training/train.py) backpropagates
# through them; between steps the memory is data.

MEM_TOKENS_PARAM = "mem_tokens"  # the learned initial tokens, [N, d_model]


def has_tokens(cfg: Any) -> bool:
  """Whether the model ``cfg`` (a ModelConfig) has memory tokens."""
  return getattr(cfg, "num_mem_tokens", 0) > 0


def token_config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Problems of ``model.num_mem_tokens``, ``model.mem_at_end`` and
  ``model.read_mem_from_cache`` and of what memory tokens need of the other
  model fields; [] if none."""
  n = fields.get("num_mem_tokens", 0)
  problems = []
  for key in ("mem_at_end", "read_mem_from_cache"):
    if not isinstance(fields.get(key, False), bool):
      problems.append(f"model.{key}={fields[key]!r} must be True or False.")
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    return problems + [
        f"model.num_mem_tokens={n!r} must be an integer >= 0 (0 = no memory tokens)."
    ]
  if n == 0:
    return problems
  if fields.get("attn_type", 0) != 0:
    problems.append(
        f"model.num_mem_tokens={n} needs model.attn_type=0 (the authors' attention; got "
        f"{fields['attn_type']}): set model.attn_type=0 or model.num_mem_tokens=0."
    )
  if fields.get("attention_impl", "xla") != "xla":
    problems.append(
        f"model.num_mem_tokens={n}: the memory tokens' mask is not expressible in the fused "
        "kernel: set model.attention_impl='xla'."
    )
  if fields.get("attn_block", -1) > 0:
    problems.append(
        f"model.num_mem_tokens={n}: memory tokens attend to keys after them, which the "
        "blockwise attention does not give them: set model.attn_block=0 (or -1)."
    )
  if fields.get("memory", "xl") != "xl":
    problems.append(
        f"model.num_mem_tokens={n} goes with the XL memory only (got "
        f"model.memory={fields['memory']!r}): set model.memory='xl' or model.num_mem_tokens=0."
    )
  return problems


def token_run_problems(
    fields: Mapping[str, Any], eval_method: str, documents: str, eval_documents: str = "split"
) -> list[str]:
  """What memory tokens need of the run (``default_config.validate``):
  neither the sliding-window evaluation (front padding) nor documents
  masked apart inside a segment (``data.documents='reset'``,
  ``eval.documents='whole'``) carry them; [] if none."""
  n = fields.get("num_mem_tokens", 0)
  if not isinstance(n, int) or n <= 0:
    return []
  problems = []
  if eval_method == "sliding":
    problems.append(
        f"eval.method='sliding' does not carry memory tokens (model.num_mem_tokens={n}): "
        "set eval.method='segments'."
    )
  if documents == "reset":
    problems.append(
        f"data.documents='reset' (documents masked apart) does not carry memory tokens "
        f"(model.num_mem_tokens={n}): set data.documents='stream'."
    )
  if eval_documents == "whole":
    problems.append(
        f"eval.documents='whole' (documents masked apart) does not carry memory tokens "
        f"(model.num_mem_tokens={n}): set eval.documents='split'."
    )
  return problems


def token_init(key: Array, shape: tuple[int, int], dtype: Any = jnp.float32) -> Array:
  """The authors' initial tokens (``init_mem_tokens``): ONE vector drawn
  from N(0, 1) and repeated N times (``[torch.randn(1, d_model)] * N`` lists
  the same tensor N times): [N, d_model]."""
  n, d = shape
  return jnp.broadcast_to(jax.random.normal(key, (1, d), dtype), (n, d))


def token_param(module: nn.Module, cfg: ModelConfig) -> Array | None:
  """The learned initial tokens, param ``mem_tokens`` [N, d_model] float32
  in ``module``'s scope (``TransformerXL.setup``); None without tokens."""
  if not has_tokens(cfg):
    return None
  return module.param(
      MEM_TOKENS_PARAM,
      nn.with_logical_partitioning(token_init, (None, "embed")),
      (cfg.num_mem_tokens, cfg.d_model),
      jnp.float32,
  )


def read_tokens(cfg: ModelConfig, memory: Memory, init_NxD: Array) -> Array:
  """The tokens a segment reads: the learned ``init_NxD`` for the fresh rows
  (``mem_tokens_fresh_B``), the carried ones for the others; [B, N,
  d_model] in the compute dtype.  The gradient reaches ``init_NxD`` from
  the fresh rows only (the authors' ``model.mem_tokens.repeat`` on the
  first segment, the detached written tokens after it)."""
  fresh_Bx1x1 = memory.mem_tokens_fresh_B[:, None, None]
  init_1xNxD = init_NxD.astype(cfg.compute_dtype)[None]
  return jnp.where(fresh_Bx1x1, init_1xNxD, memory.mem_tokens_BxNxD.astype(cfg.compute_dtype))


def extend_segment(cfg: ModelConfig, read_BxNxD: Array, emb_BxTxD: Array) -> Array:
  """[read tokens; segment embeddings; write tokens if ``mem_at_end``]:
  [B, E, d_model], E = N + T (+ N); the write tokens enter as copies of the
  read tokens (their ``torch.cat((word_emb, mem_tokens))``).  The tokens are
  not scaled by sqrt(d_model) as the word embeddings are (as theirs)."""
  parts = [read_BxNxD.astype(emb_BxTxD.dtype), emb_BxTxD]
  if cfg.mem_at_end:
    parts.append(parts[0])
  return jnp.concatenate(parts, axis=1)


class TokenMask(NamedTuple):
  """The dense mask of an extended segment with the key layout's count,
  which the attention needs for the memory tokens' position terms
  (``future_position_scores``); what the layers get instead of the mask when
  the model has memory tokens.

  Attributes:
    mask_Bx1xExK: bool, True where attention is allowed (``token_mask``).
    key_count_B: int32 [B], ``Memory.key_count_B`` (the valid cache slots).
  """

  mask_Bx1xExK: Array
  key_count_B: Array


def token_mask(cfg: ModelConfig, mask_Bx1xExK: Array, key_count_B: Array) -> TokenMask:
  """The authors' mask rules for the memory tokens on top of the XL mask of
  the extended segment (``attention_ops.attention_mask`` over E queries and
  K = M + E keys).

  Their ``_forward`` (1 = masked there): ``mask[:N, mlen:mlen+N] = 0``,
  ``mask[:N, :mlen] = 1 - read_mem_from_cache`` and with ``mem_at_end``
  ``mask[-N:, -N:] = 0``, ``mask[-N:, :mlen] = 1 - read_mem_from_cache``;
  nothing with ``same_length`` (the plain mask, kept here as it is).  The
  cache slots a token row may see are the valid ones only (ours are
  right-aligned with empty slots masked, theirs are all valid).

  Returns:
    ``TokenMask`` of the new bool [B, 1, E, K] mask and ``key_count_B``.
  """
  if cfg.same_length:
    return TokenMask(mask_Bx1xExK, key_count_B)
  n = cfg.num_mem_tokens
  e, k = mask_Bx1xExK.shape[2], mask_Bx1xExK.shape[3]
  m = k - e
  i_Ex1 = jnp.arange(e)[:, None]
  j_1xK = jnp.arange(k)[None, :]
  read_q_Ex1, read_k_1xK = i_Ex1 < n, (j_1xK >= m) & (j_1xK < m + n)
  write_q_Ex1 = (i_Ex1 >= e - n) & cfg.mem_at_end
  write_k_1xK = (j_1xK >= k - n) & cfg.mem_at_end
  token_slot_ExK = (read_q_Ex1 | write_q_Ex1) & (j_1xK < m)
  out = jnp.where(token_slot_ExK, mask_Bx1xExK & cfg.read_mem_from_cache, mask_Bx1xExK)
  out = out | (read_q_Ex1 & read_k_1xK) | (write_q_Ex1 & write_k_1xK)
  return TokenMask(out, key_count_B)


def future_position_scores(
    raw_HxBxExK: Array, bd_HxBxExK: Array, key_count_B: Array, n: int, mem_at_end: bool
) -> Array:
  """The position terms of memory-token rows at keys after them, as the
  authors' code computes them (exact parity needs them).

  The (b)+(d) scores are formed against every distance and shifted
  (``attention_ops.rel_shift``); at an entry (i, j) whose key comes after
  the query (j > i + M, the memory tokens' blocks, ``token_mask``) the
  shift leaves ``raw[i + 1, c]``, an entry of the next query's row: with
  their layout (mlen valid cache rows, no empty ones) that is the score of
  query i + 1 against distance ``mlen + E + 1 + i - j'`` (j' the key's
  index in the extended segment), 0 for j' = i + 1.  Ours has M - mlen
  empty slots in front (static shapes), which would move that column by
  M - mlen: this reads theirs.  The entries that no mask allows are left
  as they are.

  Args:
    raw_HxBxExK: float32 (q + v) . W_kR R against distances K-1 .. 0,
      before the shift.
    bd_HxBxExK: ``rel_shift(raw_HxBxExK)``.
    key_count_B: int32 [B], the valid cache slots (their mlen).
    n: num_mem_tokens (N).
    mem_at_end: the write block at the end of the extended segment.

  Returns:
    ``bd_HxBxExK`` with the read block (and the write block) corrected.
  """
  h, b, e, k = raw_HxBxExK.shape
  m = k - e
  i_NxN = jnp.arange(n)[:, None]
  j_NxN = jnp.arange(n)[None, :]
  col_BxNxN = jnp.clip((m - key_count_B)[:, None, None] + j_NxN - i_NxN - 2, 0, k - 1)
  col_HxBxNxN = jnp.broadcast_to(col_BxNxN[None], (h, b, n, n))
  for s in [0] + ([e - n] if mem_at_end else []):
    rows_N = jnp.minimum(jnp.arange(s + 1, s + n + 1), e - 1)  # query i + 1 (the last: unused)
    src_HxBxNxK = raw_HxBxExK[:, :, rows_N, :]
    got_HxBxNxN = jnp.take_along_axis(src_HxBxNxK, col_HxBxNxN, axis=-1)
    got_HxBxNxN = jnp.where(j_NxN == i_NxN + 1, 0.0, got_HxBxNxN)
    block = bd_HxBxExK[:, :, s : s + n, m + s : m + s + n]
    block = jnp.where(j_NxN > i_NxN, got_HxBxNxN.astype(block.dtype), block)
    bd_HxBxExK = bd_HxBxExK.at[:, :, s : s + n, m + s : m + s + n].set(block)
  return bd_HxBxExK


def split_segment(cfg: ModelConfig, h_BxExD: Array, tgt_len: int) -> tuple[Array, Array]:
  """(the segment's hidden states [B, T, d_model], the written tokens [B, N,
  d_model]) from the extended segment's final hidden states: the authors'
  ``pred_hid`` and ``mem_tokens_write`` (the write positions, or the read
  positions without ``mem_at_end``)."""
  n = cfg.num_mem_tokens
  written_BxNxD = h_BxExD[:, -n:] if cfg.mem_at_end else h_BxExD[:, :n]
  return h_BxExD[:, n : n + tgt_len], written_BxNxD


def write_tokens(memory: Memory, written_BxNxD: Array) -> Memory:
  """The memory with ``written_BxNxD`` as the tokens the next segment reads
  (no row fresh).  The tokens keep their gradient (unlike the XL memory,
  ``layer_read``): a training step over several segments
  (``train.mem_backprop_depth``) backpropagates through them; between steps
  the memory is data, so nothing flows further back."""
  return memory.replace(
      mem_tokens_BxNxD=written_BxNxD.astype(memory.mem_tokens_BxNxD.dtype),
      mem_tokens_fresh_B=jnp.zeros_like(memory.mem_tokens_fresh_B),
  )
