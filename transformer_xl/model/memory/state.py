"""The memory's state: the ``Memory`` pytree, its reset and update, and the
key layout (Dai et al. 2019, Sec. 3.2).

The memory is explicit state, never a mutable collection: a ``Memory`` goes
into every call of the model and the next ``Memory`` comes out.  This module
knows the fields every memory shares (the XL cache and its counts); each
memory variant (``variant.py``) declares and owns the rest.

State, per batch row b:

  mems_LxBxMxD   the *inputs* of each of the L layers at the last M slots,
                 compute dtype, right-aligned (M = mem_len for the XL
                 memory; a variant may use more, ``MemoryVariant.slots``);
  mlen_B         int32, how many of those M slots hold states (0: an empty
                 memory, the reference's start with no memory; shapes stay
                 static, empty slots are masked);
  pad_B          int32 or unset: positions at the front of the next segment
                 that are padding (evaluation and generation only);
  variant_state  the variants' own arrays by name (e.g. the memory tokens'
                 ``mem_tokens_BxNxD``), each declared by its variant with a
                 ``Leaf`` (which axis holds the rows; whether a leading axis
                 holds the layers, handed to each layer by the scan).

Key layout: a layer attends over K = M + T keys, its M memory slots then the
T positions of the segment; the valid slots are the last ``mlen_B[b]`` of
the M, so key k of row b is visible when ``k >= M - mlen_B[b]``
(``attention_ops.attention_mask``).  Front padding (``pad_B``, set by
``Memory.with_front_padding``) masks the segment's first positions the
same way: the layout's count is ``Memory.key_count_B`` = mlen_B - pad_B.

Life of a segment (the variants' hooks in brackets, ``variant.py``):

  reset    ``Memory.reset``: rows flagged ``reset_B`` get ``mlen_B = 0``
           (a new stream; the stale states stay, masked) [``reset``].
  read     the model hands layer l the slice ``mems_LxBxMxD[l]`` (scanned
           input) and builds the mask from ``Memory.key_count_B``;
           ``layer_read`` stops the gradient into it.
  update   ``layer_update``: the layer's new memory is the last M of
           [memory; segment inputs] (the reference's ``end - M .. end``
           window, ``end = M + T``) [``layer_update``].
  advance  ``Memory.advance``: the stacked new memories with
           ``advance_mlen``'s count, ``min(M, mlen_B + T)`` [``advance``].

Row-wise work (gradient-accumulation chunks, gathering generation rows)
uses ``Memory.map_rows``, and shardings ``Memory.shardings``: both read
each leaf's declared row axis, so they work on any variant's state without
naming it.  The pytree's leaves are named by their field or state name
(``mems_LxBxMxD``, ``mlen_B``, ``pad_B`` when set, then each state leaf):
these names are what checkpoints hold.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_xl.model import axes

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Leaf:
  """How an array of the memory is laid out: its logical axis names.

  Attributes:
    axes: one name per dimension: ``"batch"`` (the rows; exactly once),
      ``"layers"`` (the layers; first, when present: the model's scan
      hands layer l its slice), a name of ``axes.LOGICAL_AXIS_RULES``
      (e.g. ``"heads"``: split over the ``model`` mesh axis where it
      divides), or None (replicated).
    carried: handed whole to every layer, in order, through the scan over
      layers (its carry), each layer's hooks reading and replacing it, with
      the layer's index (``LAYER_INDEX`` in the hooks' state): state that
      only some layers hold (e.g. a store at one layer of twelve), without
      a copy per layer.  Not with a ``"layers"`` axis.
  """

  axes: tuple[str | None, ...]
  carried: bool = False

  def __post_init__(self):
    if self.axes.count("batch") != 1 or "layers" in self.axes[1:]:
      raise ValueError(
          f"Leaf axes {self.axes}: 'batch' exactly once, 'layers' only as the first axis."
      )
    if self.carried and self.per_layer:
      raise ValueError(f"Leaf axes {self.axes}: a carried leaf has no 'layers' axis.")

  @property
  def row_axis(self) -> int:
    """The axis that holds the batch rows."""
    return self.axes.index("batch")

  @property
  def per_layer(self) -> bool:
    """A leading layers axis: the scan over layers hands each layer its slice."""
    return self.axes[0] == "layers"

  def spec(self, mesh: Mesh, shape: tuple[int, ...]) -> PartitionSpec:
    """The PartitionSpec on ``mesh``: the rows over the batch mesh axes
    present (``axes.BATCH_AXES``), other named axes by
    ``axes.LOGICAL_AXIS_RULES`` where the mesh has that axis and its size
    divides the dimension, the rest replicated."""
    rules = dict(axes.LOGICAL_AXIS_RULES)
    out: list[Any] = []
    for dim, name in zip(shape, self.axes):
      if name == "batch":
        out.append(tuple(a for a in axes.BATCH_AXES if a in mesh.axis_names))
        continue
      target = rules.get(name) if name else None
      ok = isinstance(target, str) and target in mesh.shape and dim % mesh.shape[target] == 0
      out.append(target if ok else None)
    return PartitionSpec(*out)


# The name under which a variant with carried leaves (``Leaf.carried``) finds the
# index of the layer its hooks run in (an int32 scalar, traced) in their state.
LAYER_INDEX = "layer_index"
# ... and, where documents are masked apart inside the segment, each query's
# offset from its document's first input (int32 [B, T], as the attention mask's
# ``doc_pos_BxT``): the document started in this segment where it is <= the
# query's position.
DOC_POS = "doc_pos_BxT"
RESERVED = (LAYER_INDEX, DOC_POS)  # in the hooks' state, never written back

# The fields every memory has (pad_B only when set).
SHARED_LEAVES: Mapping[str, Leaf] = types.MappingProxyType(
    {
        "mems_LxBxMxD": Leaf(("layers", "batch", None, None)),
        "mlen_B": Leaf(("batch",)),
        "pad_B": Leaf(("batch",)),
    }
)
# The variants' state leaves: name -> Leaf, and name -> the variant that
# owns it (resets it), both filled by ``variant.register`` from each
# variant's ``STATE`` (a name belongs to one variant).
STATE_LEAVES: dict[str, Leaf] = {}
STATE_OWNERS: dict[str, Any] = {}


def leaf(name: str) -> Leaf:
  """The declared layout of the memory array called ``name``.

  Raises:
    KeyError: no field and no registered variant's state has that name.
  """
  return SHARED_LEAVES[name] if name in SHARED_LEAVES else STATE_LEAVES[name]


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-layer recurrence memory (Dai et al. 2019, Sec. 3.2).

  A pytree whose leaves are its arrays, named as above: ``pad_B`` is a leaf
  only when set and ``variant_state`` holds only what the model's variants
  declare, so the memory of an XL model (and its checkpoints) has exactly
  the two fields it has always had.

  Attributes:
    mems_LxBxMxD: cached inputs of each layer, [n_layer, B, slots,
      d_model], compute dtype, right-aligned.
    mlen_B: int32 [B], in [0, slots]: how many of the last slots hold states.
    pad_B: int32 [B] >= 0, or None (no padding): how many positions at the
      front of the next segment are padding, masked as keys like empty
      slots, so that the rest of the row is read as if it stood alone (the
      sliding-window evaluator with mem_len 0; generation's prompts of
      different lengths).  Padding longer than a segment carries over to
      the next one (``advance``).
    variant_state: the memory variants' arrays by name ({} for the XL
      memory), each laid out as its ``Leaf`` says (``STATE_LEAVES``); read
      and written by the variant that declared it.
  """

  mems_LxBxMxD: Array
  mlen_B: Array
  pad_B: Array | None = None
  variant_state: Mapping[str, Array] = dataclasses.field(default_factory=dict)

  # Pytree children by name, for ``_present`` (set by ``_unflatten``).
  _FIELDS: ClassVar[tuple[str, ...]] = ("mems_LxBxMxD", "mlen_B", "pad_B")

  def replace(self, **changes: Any) -> Memory:
    """A copy with ``changes`` (field name -> value)."""
    return dataclasses.replace(self, **changes)

  def with_state(self, **arrays: Array) -> Memory:
    """A copy whose ``variant_state`` has ``arrays`` (name -> array) set."""
    return self.replace(variant_state={**self.variant_state, **arrays})

  def _present(self) -> tuple[str, ...]:
    """The field names that are leaves (pad_B only when set).  A Memory that
    jax rebuilt from a pytree structure keeps that structure's names
    whatever its children, which jax may replace by None (e.g. for jit's
    default output layouts)."""
    names = self.__dict__.get("_names")
    if names is not None:
      return names[0]
    return ("mems_LxBxMxD", "mlen_B") + (() if self.pad_B is None else ("pad_B",))

  def leaves(self) -> dict[str, Any]:
    """Every leaf by name: the fields that are set, then ``variant_state``."""
    return {**{n: getattr(self, n) for n in self._present()}, **self.variant_state}

  @property
  def mem_len(self) -> int:
    """The memory slots per layer (static): mem_len for the XL memory."""
    return self.mems_LxBxMxD.shape[2]

  def key_count_B(self) -> Array:
    """The key layout's count per row, int32 [B]: key k (of K = M + T) is
    visible when ``k >= M - count`` (``attention_ops.attention_mask``, the
    Pallas kernel): the valid slots, minus the front padding (a negative
    count masks the segment's first positions)."""
    return self.mlen_B if self.pad_B is None else self.mlen_B - self.pad_B

  def map_rows(self, fn: Callable[[Any, int], Any]) -> Memory:
    """A Memory of ``fn(leaf, rows_axis)`` for each leaf.

    For row-wise work that must treat every array alike, whatever the
    variants: selecting or gathering rows (``lambda x, axis: jnp.take(x,
    idx, axis=axis)``), splitting rows into micro-batches and back.
    ``rows_axis`` is the leaf's batch axis (``leaf(name).row_axis``).
    """
    out = {name: fn(x, leaf(name).row_axis) for name, x in self.leaves().items()}
    return self.replace(
        **{n: out.pop(n) for n in self._present()},
        variant_state={n: out[n] for n in self.variant_state},
    )

  def shardings(self, mesh: Mesh) -> Memory:
    """NamedShardings of this memory's leaves on ``mesh`` (a Memory of them,
    the same pytree structure; this memory may be abstract, e.g. from
    ``jax.eval_shape``): each leaf laid out as its ``Leaf`` declares."""

    def sharding(x: Any, name: str) -> NamedSharding:
      return NamedSharding(mesh, leaf(name).spec(mesh, tuple(np.shape(x))))

    return self._map_named(sharding)

  def replicated(self, mesh: Mesh) -> Memory:
    """NamedShardings of this memory's leaves held whole on every device."""
    return self._map_named(lambda x, name: NamedSharding(mesh, PartitionSpec()))

  def _map_named(self, fn: Callable[[Any, str], Any]) -> Memory:
    """A Memory of ``fn(leaf, name)`` for each leaf."""
    out = {name: fn(x, name) for name, x in self.leaves().items()}
    return self.replace(
        **{n: out.pop(n) for n in self._present()},
        variant_state={n: out[n] for n in self.variant_state},
    )

  def reset(self, reset_B: Array) -> Memory:
    """Empties the memory of the rows where ``reset_B`` (bool [B]) is True
    (and drops their padding); each variant resets its own state
    (``MemoryVariant.reset``).

    Only the counts change: empty slots are masked, so their stale
    contents never reach an output.
    """
    out = self.replace(mlen_B=jnp.where(reset_B, 0, self.mlen_B))
    if self.pad_B is not None:
      out = out.replace(pad_B=jnp.where(reset_B, 0, self.pad_B))
    state = dict(self.variant_state)
    for owner in dict.fromkeys(STATE_OWNERS[n] for n in state):  # each owner once, in order
      state.update(
          owner.reset({n: x for n, x in state.items() if STATE_OWNERS[n] is owner}, reset_B)
      )
    return out.replace(variant_state=state)

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
      tgt_len: T, the positions the layers ran on.
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
  fields = memory._present()
  state = tuple(memory.variant_state)
  children = [(jax.tree_util.GetAttrKey(n), getattr(memory, n)) for n in fields]
  children += [(jax.tree_util.GetAttrKey(n), memory.variant_state[n]) for n in state]
  return children, (fields, state)


def _flatten(memory: Memory):
  children, names = _flatten_with_keys(memory)
  return [c for _, c in children], names


def _unflatten(names: tuple[tuple[str, ...], tuple[str, ...]], children) -> Memory:
  fields, state = names
  children = list(children)
  memory = Memory(
      **dict(zip(fields, children[: len(fields)])),
      variant_state=dict(zip(state, children[len(fields) :])),
  )
  object.__setattr__(memory, "_names", names)  # not a field: ``replace`` recomputes it
  return memory


jax.tree_util.register_pytree_with_keys(Memory, _flatten_with_keys, _unflatten, _flatten)


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
      attention variant's ``layer_inputs``), [B, M, d_model].
    h_BxTxD: the layer's inputs for the segment, [B, T, d_model], the
      memory's dtype.

  Returns:
    new_mem_BxMxD, [B, M, d_model], the inputs' dtype.
  """
  mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]
  cat_BxKxD = jnp.concatenate([mem_BxMxD, h_BxTxD], axis=1)  # h~ = [SG(m) o h]
  end = mem_len + tgt_len
  return jax.lax.stop_gradient(cat_BxKxD[:, end - mem_len : end])
