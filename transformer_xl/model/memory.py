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
                static, empty slots are masked).

Key layout: a layer attends over K = M + T keys, its M memory slots then the
T positions of the segment; the valid slots are the last ``mlen_B[b]`` of
the M, so key k of row b is visible when ``k >= M - mlen_B[b]``
(``attention_ops.attention_mask``).  A negative count -p marks the
segment's first p positions as padding (``Memory.with_front_padding``).

Life of a segment:

  reset    ``Memory.reset``: rows flagged ``reset_B`` get ``mlen_B = 0``
           (a new stream; the stale states stay, masked).
  read     ``TransformerXL.hidden_from_embeddings`` hands layer l the slice
           ``mems_LxBxMxD[l]`` (scanned input) and builds the mask from
           ``mlen_B``; ``layer_read`` stops the gradient into it.
  update   ``layer_update``: the layer's new memory is the last M of
           [memory; segment inputs] before the ext_len tail (the
           reference's ``end - M .. end`` window, ``end = M + T - ext_len``).
  advance  ``Memory.advance``: the stacked new memories with
           ``advance_mlen``'s count, ``min(M, mlen_B + T - ext_len)``.

Row-wise work (gradient-accumulation chunks, gathering generation rows,
shardings over the batch mesh axes) uses ``Memory.map_rows`` and
``Memory.shardings``, which read the row axes.  The pytree (two fields,
these names) is what checkpoints hold: adding a field breaks them.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_xl.model import axes

if TYPE_CHECKING:  # config.py validates model.memory against VARIANTS (imports this module)
  import flax.linen as nn

  from transformer_xl.model.config import ModelConfig

Array = jax.Array


@flax.struct.dataclass
class Memory:
  """Per-layer recurrence memory (Dai et al. 2019, Sec. 3.2).

  Attributes:
    mems_LxBxMxD: cached inputs of each layer, [n_layer, B, mem_len,
      d_model], compute dtype, right-aligned.
    mlen_B: int32 [B], how many of the last slots hold states.  A negative
      value -p says that the segment's first p positions are padding,
      masked as keys like empty slots (the sliding-window evaluator, with
      mem_len 0; generation's prompts padded in front); after the pass
      ``advance_mlen`` leaves -p + T, so padding longer than a segment
      carries over.
  """

  mems_LxBxMxD: Array
  mlen_B: Array

  # field -> (rows axis, number of axes); class-level, not pytree fields.
  ROW_AXES: ClassVar[Mapping[str, int]] = types.MappingProxyType({"mems_LxBxMxD": 1, "mlen_B": 0})
  NDIMS: ClassVar[Mapping[str, int]] = types.MappingProxyType({"mems_LxBxMxD": 4, "mlen_B": 1})

  @property
  def mem_len(self) -> int:
    """M, the memory slots per layer (static)."""
    return self.mems_LxBxMxD.shape[2]

  def map_rows(self, fn: Callable[[Any, int], Any]) -> Memory:
    """A Memory of ``fn(field, rows_axis)`` for each field.

    For row-wise work that must treat every field alike: selecting or
    gathering rows (``lambda x, axis: jnp.take(x, idx, axis=axis)``),
    splitting rows into micro-batches and back.  ``rows_axis`` is the
    field's batch axis (``ROW_AXES``): 1 for mems_LxBxMxD, 0 for mlen_B.
    """
    return self.replace(
        **{name: fn(getattr(self, name), axis) for name, axis in self.ROW_AXES.items()}
    )

  @classmethod
  def shardings(cls, mesh: Mesh) -> Memory:
    """NamedShardings of a Memory on ``mesh``: each field's rows split over
    the batch mesh axes (``axes.BATCH_AXES`` present in ``mesh``, as the
    batch's rows), its other axes replicated."""
    rows = tuple(a for a in axes.BATCH_AXES if a in mesh.axis_names)

    def spec(name: str) -> PartitionSpec:
      row_axis, ndim = cls.ROW_AXES[name], cls.NDIMS[name]
      return PartitionSpec(*(rows if i == row_axis else None for i in range(ndim)))

    return cls(**{name: NamedSharding(mesh, spec(name)) for name in cls.ROW_AXES})

  @classmethod
  def replicated_shardings(cls, mesh: Mesh) -> Memory:
    """NamedShardings of a Memory held whole on every device of ``mesh``."""
    return cls(**{name: NamedSharding(mesh, PartitionSpec()) for name in cls.ROW_AXES})

  def reset(self, reset_B: Array) -> Memory:
    """Empties the memory of the rows where ``reset_B`` (bool [B]) is True.

    Only the valid-slot count changes: empty slots are masked, so their
    stale contents never reach an output.
    """
    return self.replace(mlen_B=jnp.where(reset_B, 0, self.mlen_B))

  def with_front_padding(self, pad_B: Array) -> Memory:
    """An empty memory (``init_memory``) whose next segment starts with
    ``pad_B[b]`` (int32 [B], >= 0) padding positions in row b: those are
    masked as keys, like empty slots, so the rest of the segment is read as
    if it stood alone.  Encoded as the valid-slot count ``-pad_B``."""
    return self.replace(mlen_B=-jnp.asarray(pad_B))

  def advance(self, new_mems_LxBxMxD: Array, tgt_len: int, ext_len: int) -> Memory:
    """The memory after a segment of ``tgt_len`` inputs.

    Args:
      new_mems_LxBxMxD: the layers' new memories (``layer_update``, stacked
        over layers), [n_layer, B, M, d_model].
      tgt_len: T, the segment length.
      ext_len: the trailing positions not cached (the reference's ext_len).
    """
    return Memory(
        mems_LxBxMxD=new_mems_LxBxMxD,
        mlen_B=advance_mlen(self.mlen_B, self.mem_len, tgt_len, ext_len),
    )


def init_memory(config: ModelConfig, batch_size: int, mem_len: int | None = None) -> Memory:
  """Empty memory: zeros with no valid slot (the reference's empty start).

  Args:
    config: model config (n_layer, d_model, dtype).
    batch_size: B.
    mem_len: the memory length (``mem_len``); defaults to config.mem_len.
      The slots per layer are the variant's ``slots(mem_len)`` (mem_len for
      the XL memory).

  Returns:
    A Memory of zeros [n_layer, B, M, d_model] in the compute dtype and an
    int32 [B] count of 0.
  """
  m = variant(config).slots(config.mem_len if mem_len is None else mem_len)
  return Memory(
      mems_LxBxMxD=jnp.zeros((config.n_layer, batch_size, m, config.d_model), config.compute_dtype),
      mlen_B=jnp.zeros((batch_size,), jnp.int32),
  )


def reset_memory(memory: Memory, reset_B: Array) -> Memory:
  """``memory.reset(reset_B)``: rows where ``reset_B`` (bool [B]) is True
  start empty."""
  return memory.reset(reset_B)


def advance_mlen(mlen_B: Array, mem_len: int, tgt_len: int, ext_len: int) -> Array:
  """Valid slots after caching a segment: ``min(M, mlen + T - ext_len)``, int32 [B]."""
  return jnp.minimum(mem_len, mlen_B + tgt_len - ext_len).astype(jnp.int32)


def layer_read(mem_BxMxD: Array) -> Array:
  """A layer's memory as it enters the layer: ``SG(m)`` of Sec. 3.2, no
  gradient ever flows into a previous segment.  [B, M, d_model], dtype
  kept."""
  return jax.lax.stop_gradient(mem_BxMxD)


def layer_update(mem_BxMxD: Array, h_BxTxD: Array, ext_len: int) -> Array:
  """A layer's next memory: the last M of [memory; segment] before the
  ext_len tail.

  The reference's ``cat[end - M:end]`` with ``end = M + T - ext_len``
  (``_update_mems``), so with ext_len 0 the memory is a FIFO of the layer's
  last M inputs.  Its gradient is stopped.

  Args:
    mem_BxMxD: the layer's memory as read (``layer_read``, after the
      variant's ``layer_inputs``), [B, M, d_model].
    h_BxTxD: the layer's inputs for the segment, [B, T, d_model], the
      memory's dtype.
    ext_len: trailing positions of the segment not cached (< T).

  Returns:
    new_mem_BxMxD, [B, M, d_model], the inputs' dtype.
  """
  mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]
  cat_BxKxD = jnp.concatenate([mem_BxMxD, h_BxTxD], axis=1)  # h~ = [SG(m) o h]
  end = mem_len + tgt_len - ext_len
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
  def slots(mem_len: int) -> int:
    """Memory slots per layer for a memory length ``mem_len`` (M)."""
    return mem_len

  @staticmethod
  def config_problems(fields: Mapping[str, Any]) -> list[str]:
    """What the variant needs of the other model fields: one message per
    problem, naming ``model.<key>`` and the fix ([] if none)."""
    del fields
    return []

  @staticmethod
  def layer_update(module: nn.Module, cfg: ModelConfig, mem_BxMxD: Array, h_BxTxD: Array) -> Array:
    """A layer's next memory (gradient stopped), called inside the layer
    (``DecoderLayer``) so that a variant may create parameters and
    ``module.sow("losses", name, scalar)`` an auxiliary loss there.

    Args:
      module: the calling layer (a compact flax module).
      cfg: the ModelConfig.
      mem_BxMxD: the layer's memory as read (``layer_read``, after the
        attention variant's ``layer_inputs``), [B, slots, d_model].
      h_BxTxD: the layer's inputs for the segment, [B, T, d_model].

    Returns:
      new_mem_BxMxD, [B, slots, d_model], the inputs' dtype.
    """
    del module
    return layer_update(mem_BxMxD, h_BxTxD, cfg.ext_len)


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


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Problems of ``model.memory`` and of what its variant needs; [] if none."""
  name = fields.get("memory", "xl")
  if name not in VARIANTS:
    return [f"model.memory={name!r}: use one of {tuple(sorted(VARIANTS))}."]
  return VARIANTS[name].config_problems(fields)
