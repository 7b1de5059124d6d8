"""The memory's state: the ``Memory`` pytree, its reset and update, the key
layout and the memory-variant interface (Dai et al. 2019, Sec. 3.2).

The memory is explicit state, never a mutable collection: a ``Memory`` goes
into every call of the model and the next ``Memory`` comes out.  This module
is the one place that knows its fields; everything else goes through the
methods below (the variants in this package too).

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
                Transformer (model.num_mem_tokens > 0; ``tokens.py``)
                and the rows that read the learned ones.

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
(``compressive.py``, Rae et al. 2020) keeps ``cmem_len`` compressed
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
from typing import TYPE_CHECKING, Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_xl.model import axes

if TYPE_CHECKING:  # config.py validates model.memory against VARIANTS (imports this package)
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


def has_tokens(cfg: Any) -> bool:
  """Whether the model ``cfg`` (a ModelConfig) has memory tokens."""
  return getattr(cfg, "num_mem_tokens", 0) > 0
