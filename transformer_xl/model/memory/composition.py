"""The memory of one model: its variants on, their hooks in order, and its
state made and placed.

``plan(cfg)`` is what ``models.py`` uses: the variant ``model.memory``
chooses and the add-ons its settings enable (``settings.active``), and the
hooks of them all, called in order (``Plan``; inside a layer,
``LayerHooks``).  ``init_memory`` makes an empty ``Memory`` of a model and
``shardings`` places one on a mesh, both from the variants' declarations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_xl.model.memory import state as state_lib
from transformer_xl.model.memory.settings import active, has_settings
from transformer_xl.model.memory.state import Memory
from transformer_xl.model.memory.variant import MemoryVariant

if TYPE_CHECKING:
  from transformer_xl.model.config import ModelConfig

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Plan:
  """The memory of one model: ``model.memory``'s variant (``primary``) and
  the add-ons its settings enable, whose hooks it calls in that order
  (``extend``, ``mask``, the layer hooks) and, for ``finish``, in reverse.

  Attributes:
    cfg: the ModelConfig.
    variants: the variants on, ``model.memory``'s first.
  """

  cfg: Any
  variants: tuple[type[MemoryVariant], ...]

  @property
  def primary(self) -> type[MemoryVariant]:
    """``model.memory``'s variant: it fills the XL slots."""
    return self.variants[0]

  @property
  def decode_cache(self) -> bool:
    """Whether generation's decoding cache can carry this memory."""
    return all(v.DECODE_CACHE for v in self.variants)

  @property
  def whole_segments(self) -> bool:
    """Whether this memory runs on whole segments only (``WHOLE_SEGMENTS``)."""
    return any(v.WHOLE_SEGMENTS for v in self.variants)

  def names(self) -> str:
    """The variants on, for messages: "'xl' with 'tokens'"."""
    first, *rest = [repr(v.name) for v in self.variants]
    return first + (f" with {', '.join(rest)}" if rest else "")

  @property
  def one_block(self) -> bool:
    """Whether the attention must see all its queries at once."""
    return any(v.ONE_BLOCK for v in self.variants)

  def refusal(self, documents: bool = False, decode: bool = False) -> str | None:
    """Why this memory cannot run with documents masked apart inside a
    segment (``documents``) or with the decoding cache (``decode``); None
    if it can."""
    for v in self.variants:
      if documents and not v.DOCUMENTS:
        return f"the {v.name!r} memory goes with one stream: no documents inside a segment"
      if decode and not v.DECODE_CACHE:
        return (
            f"the {v.name!r} memory has no decoding cache (the cache is rolled as a FIFO of "
            "the layer inputs); score the sequence with hidden() instead"
        )
    return None

  def slots(self, mem_len: int) -> int:
    """Memory slots per layer for a memory length ``mem_len``."""
    return self.primary.slots(mem_len, self.cfg)

  def init_state(self, batch_size: int) -> dict[str, Array]:
    """Every variant's arrays of an empty memory."""
    out: dict[str, Array] = {}
    for v in self.variants:
      out.update(v.init_state(self.cfg, batch_size))
    return out

  def param_groups(self) -> tuple[tuple[str, ...], ...]:
    """The variants' parameter groups clipped apart (``param_groups``)."""
    return tuple(g for v in self.variants for g in v.param_groups(self.cfg))

  def model_params(self, module: nn.Module) -> dict[str, Any]:
    """{variant name: its model-level parameters} (``model_params``)."""
    out = {}
    for v in self.variants:
      params = v.model_params(module, self.cfg)
      if params is not None:
        out[v.name] = params
    return out

  def extend(self, params: Mapping[str, Any], memory: Memory, emb_BxTxD: Array) -> Array:
    """Before the layers: the positions they run on (each variant's ``extend``)."""
    for v in self.variants:
      emb_BxTxD = v.extend(self.cfg, params.get(v.name), memory, emb_BxTxD)
    return emb_BxTxD

  def mask(self, mask_Bx1xExK: Array) -> Array:
    """The dense mask after each variant's ``mask``."""
    for v in self.variants:
      mask_Bx1xExK = v.mask(self.cfg, mask_Bx1xExK)
    return mask_Bx1xExK

  def layer_state(self, memory: Memory) -> dict[str, Array]:
    """The per-layer arrays of ``memory``'s variant state (leading layers
    axis: the scan over layers hands each layer its slice)."""
    return {n: x for n, x in memory.variant_state.items() if state_lib.leaf(n).per_layer}

  def carried_state(self, memory: Memory, doc_pos_BxT: Array | None = None) -> dict[str, Array]:
    """The carried arrays of ``memory``'s variant state (``Leaf.carried``:
    the scan over layers hands them to each layer in turn, whole), with
    the documents' offsets ``doc_pos_BxT`` as ``state.DOC_POS`` where there
    are such arrays and documents (the model drops it after the layers)."""
    out = {n: x for n, x in memory.variant_state.items() if state_lib.leaf(n).carried}
    if out and doc_pos_BxT is not None:
      out[state_lib.DOC_POS] = doc_pos_BxT.astype(jnp.int32)
    return out

  def layer_hooks(
      self,
      layer: nn.Module,
      state: dict[str, Array],
      key_count_B: Array,
      layer_index: Array | None = None,
  ):
    """The variants' hooks inside one layer call (``LayerHooks``); ``state``:
    the layer's slice of the per-layer arrays and the carried ones;
    ``layer_index``: int32 scalar, the layer's index (for carried state)."""
    return LayerHooks(self, layer, dict(state), key_count_B, layer_index)

  def layer_update(
      self, module: nn.Module, mem_BxMxD: Array, h_BxTxD: Array, key_count_B: Array
  ) -> Array:
    """The layer's next slots (``model.memory``'s ``layer_update``)."""
    return self.primary.layer_update(module, self.cfg, mem_BxMxD, h_BxTxD, key_count_B)

  def advance(
      self,
      memory: Memory,
      new_mems_LxBxMxD: Array,
      tgt_len: int,
      new_layer_state: Mapping[str, Array],
  ) -> Memory:
    """The next Memory: ``model.memory``'s ``advance``, with the layers' new
    per-layer and carried state."""
    new_memory = self.primary.advance(self.cfg, memory, new_mems_LxBxMxD, tgt_len)
    return new_memory.with_state(**new_layer_state) if new_layer_state else new_memory

  def finish(self, h_BxExD: Array, memory: Memory, seg_len: int) -> tuple[Array, Memory]:
    """After the layers: each variant's ``finish``, in reverse order."""
    for v in reversed(self.variants):
      h_BxExD, memory = v.finish(self.cfg, h_BxExD, memory, seg_len)
    return h_BxExD, memory


class LayerHooks:
  """The variants' hooks inside one call of one layer (``Plan.layer_hooks``),
  with the layer's slice of their per-layer state and their carried state,
  which the hooks update in place: ``state`` after the layer is its next
  one.  A variant with carried leaves also finds the layer's index in its
  state (``state.LAYER_INDEX``; not written back), and, with documents
  masked apart, their offsets (``state.DOC_POS``).  Built and used within
  one trace of the layer (``models.DecoderLayer``); the attention calls
  ``position_scores`` and ``combine``."""

  def __init__(
      self,
      plan: Plan,
      layer: nn.Module,
      state: dict[str, Array],
      key_count_B: Array,
      layer_index: Array | None = None,
  ):
    self.plan, self.layer, self.state, self.key_count_B = plan, layer, state, key_count_B
    self.layer_index = layer_index

  def _own(self, v: type[MemoryVariant]) -> dict[str, Array]:
    own = {n: x for n, x in self.state.items() if n in v.STATE}
    if any(leaf.carried for leaf in v.STATE.values()):
      if self.layer_index is not None:
        own[state_lib.LAYER_INDEX] = self.layer_index
      if state_lib.DOC_POS in self.state:
        own[state_lib.DOC_POS] = self.state[state_lib.DOC_POS]
    return own

  def _keep(self, own: dict[str, Array]) -> None:
    """Writes a hook's returned state back (without the layer index and the
    documents' offsets)."""
    self.state.update({n: x for n, x in own.items() if n not in state_lib.RESERVED})

  def before_layer(self, h_BxExD: Array) -> Array:
    """Each variant's ``before_layer``."""
    for v in self.plan.variants:
      h_BxExD, own = v.before_layer(
          self.layer, self.plan.cfg, h_BxExD, self._own(v), self.key_count_B
      )
      self._keep(own)
    return h_BxExD

  def position_scores(self, raw_HxBxExK: Array, bd_HxBxExK: Array) -> Array:
    """Each variant's ``position_scores``."""
    for v in self.plan.variants:
      bd_HxBxExK = v.position_scores(self.plan.cfg, raw_HxBxExK, bd_HxBxExK, self.key_count_B)
    return bd_HxBxExK

  def combine(
      self,
      attn: nn.Module,
      q_BxExHxDh: Array,
      k_BxKxHxDh: Array,
      v_BxKxHxDh: Array,
      vec_BxExHxDh: Array,
  ) -> Array:
    """Each variant's ``combine``."""
    for v in self.plan.variants:
      vec_BxExHxDh, own = v.combine(
          attn,
          self.plan.cfg,
          q_BxExHxDh,
          k_BxKxHxDh,
          v_BxKxHxDh,
          vec_BxExHxDh,
          self._own(v),
          self.key_count_B,
      )
      self._keep(own)
    return vec_BxExHxDh

  def after_layer(self, out_BxExD: Array) -> Array:
    """Each variant's ``after_layer``."""
    for v in self.plan.variants:
      out_BxExD, own = v.after_layer(
          self.layer, self.plan.cfg, out_BxExD, self._own(v), self.key_count_B
      )
      self._keep(own)
    return out_BxExD


def plan(cfg: Any) -> Plan:
  """The memory of the model ``cfg`` (a validated ModelConfig)."""
  return Plan(cfg, active({"memory": cfg.memory, **dict(cfg.memory_settings)}))


def init_memory(cfg: ModelConfig, batch_size: int, mem_len: int | None = None) -> Memory:
  """Empty memory: zeros with no valid slot (the reference's empty start).

  Args:
    cfg: model config (n_layer, d_model, dtype, the memory's settings).
    batch_size: B.
    mem_len: the memory length; defaults to cfg.mem_len.  The slots per
      layer are the variant's (``MemoryVariant.slots``: mem_len for the XL
      memory).

  Returns:
    A Memory of zeros [n_layer, B, slots, d_model] in the compute dtype, an
    int32 [B] count of 0, and each variant's empty state
    (``MemoryVariant.init_state``).
  """
  p = plan(cfg)
  m = p.slots(cfg.mem_len if mem_len is None else mem_len)
  return Memory(
      mems_LxBxMxD=jnp.zeros((cfg.n_layer, batch_size, m, cfg.d_model), cfg.compute_dtype),
      mlen_B=jnp.zeros((batch_size,), jnp.int32),
      variant_state=p.init_state(batch_size),
  )


def abstract_memory(cfg: ModelConfig, batch_size: int = 1) -> Memory:
  """``init_memory``'s shapes and dtypes (``jax.ShapeDtypeStruct`` leaves),
  nothing allocated."""
  return jax.eval_shape(lambda: init_memory(cfg, batch_size))


def shardings(cfg: ModelConfig, mesh: Mesh) -> Memory:
  """NamedShardings of the model ``cfg``'s memory on ``mesh`` (a Memory of
  them): each array laid out as declared (``state.Leaf``: the rows over the
  batch mesh axes).  Without front padding (``pad_B``), as the memory the
  model carries between steps."""
  return abstract_memory(cfg).shardings(mesh)


def replicated_shardings(cfg: ModelConfig, mesh: Mesh) -> Memory:
  """NamedShardings of the model ``cfg``'s memory held whole on every device."""
  return abstract_memory(cfg).replicated(mesh)


def eval_settings(cfg: ModelConfig, eval_fields: Mapping[str, Any], sliding: bool = False) -> dict:
  """The memory settings evaluation uses (for ``ModelConfig.memory_settings``):
  each variant on applies its ``eval.<name>`` overrides that are set
  (``eval_fields``: the eval section) and what a sliding window needs
  (``MemoryVariant.eval_settings``); the others' are kept."""
  out = dict(cfg.memory_settings)
  for v in plan(cfg).variants:
    if not has_settings(v):
      continue
    given = eval_fields.get(v.name) or {}
    overrides = {k: x for k, x in given.items() if k in v.EVAL_OVERRIDES and x is not None}
    out[v.name] = v.eval_settings(v.settings(cfg), overrides, sliding)
  return out


def eval_without(cfg: ModelConfig, eval_fields: Mapping[str, Any]) -> dict[str, dict]:
  """The evaluations without a variant's own memory that ``--mode=eval``
  adds: {variant name: its ``EVAL_WITHOUT`` overrides} for each variant on
  that has them, unless the evaluation (``eval_fields``: the eval section)
  already runs without it."""
  settings = eval_settings(cfg, eval_fields)
  out = {}
  for v in plan(cfg).variants:
    if v.EVAL_WITHOUT and any(getattr(settings[v.name], k) != x for k, x in v.EVAL_WITHOUT.items()):
      out[v.name] = dict(v.EVAL_WITHOUT)
  return out


def describe_eval(cfg: ModelConfig) -> dict[str, Any]:
  """What evaluation results record of the memory's settings: {variant name:
  its ``describe_eval``} for each variant on that records something."""
  out = {}
  for v in plan(cfg).variants:
    described = v.describe_eval(v.settings(cfg))
    if described:
      out[v.name] = described
  return out
