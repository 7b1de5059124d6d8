"""The memory-variant interface: what a memory is allowed to own and do.

A memory variant is a subclass of ``MemoryVariant`` registered with
``register``.  It owns, in its own module:

* its **settings**: a frozen dataclass (``Settings``), the model config's
  section ``model.<name>`` (``--config.model.<name>.<field>``), validated by
  the variant (``settings_problems``, ``config_problems``), with the fields
  that evaluation may override (``EVAL_OVERRIDES``: ``eval.<name>.<field>``)
  and the flat keys of earlier versions it reads (``LEGACY_KEYS``);
* its **state**: arrays in ``Memory.variant_state`` it declares by name
  (``STATE``: a ``state.Leaf`` each, which says the rows axis, so reset,
  row gathering, accumulation chunks and shardings need no code of its),
  made by ``init_state`` and reset by ``reset``;
* its **hooks** into the model, in the order a segment meets them
  (``models.TransformerXL``):

    model_params   the model's parameters it owns (in the model's scope);
    extend         before the layers: positions added to the segment
                   (``extra_positions`` of them; the memory tokens);
    mask           the attention mask of those positions;
    before_layer   in each layer, before the attention, with the layer's
                   slice of its per-layer state (``Leaf.per_layer``);
    position_scores  in the attention (attn_type 0): the position terms;
    combine        in the attention, after the softmax-weighted values,
                   before the output projection: extra keys and values read
                   with their own mask and position treatment, combined by
                   e.g. a learned gate (a kNN or associative memory); it may
                   update its per-layer state (e.g. write the segment);
    layer_update   after the attention: the layer's next XL slots (the
                   variant chosen by ``model.memory`` only: ``slots`` of them);
    after_layer    after the layer, with the layer's output;
    advance        the next ``Memory``'s counts (``model.memory``'s variant);
    finish         after the layers: the segment's hidden states back out;

* what the rest of the package asks of it: whether a decoding cache can
  carry it (``DECODE_CACHE``), documents masked apart inside a segment
  (``DOCUMENTS``), queries in blocks (``ONE_BLOCK``), a gradient carried
  between segments (``GRADIENT_THROUGH_SEGMENTS``, for
  ``train.mem_backprop_depth``), its parameter groups clipped apart
  (``param_groups``), its evaluation settings (``eval_settings``,
  ``eval_problems``, ``describe_eval``), and what it needs of the run
  (``run_problems``).

One variant is chosen by ``model.memory`` (the way the XL slots are filled:
"xl", "compressive", ...); add-ons (``ADDON``, e.g. the memory tokens) are
on when their settings say so (``enabled``), beside any of them.  ``Plan``
is the model's memory: the chosen variant and the enabled add-ons, whose
hooks it calls in that order.  Nothing outside ``model/memory/`` names a
variant.

Source: the interface follows meliad's memory backends (an abstract base
class chosen per configured layer, queried during attention) and levanter's
per-model config classes, with the state explicit as in nanodo and MaxText.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import flax.linen as nn
import jax

from transformer_xl.model.memory import state as state_lib
from transformer_xl.model.memory.state import Leaf, Memory, layer_update

if TYPE_CHECKING:  # config.py validates model.memory against VARIANTS (imports this package)
  from transformer_xl.model.config import ModelConfig

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class NoSettings:
  """The settings of a variant that has none (no ``model.<name>`` section)."""


class MemoryVariant:
  """The interface of a memory variant; its defaults are the XL memory's.

  Subclass it, set ``name`` (and what differs), and ``register`` it.  Every
  hook is a classmethod: a variant holds no state of its own outside the
  ``Memory`` and the model's parameters.  ``cfg`` is the ``ModelConfig``;
  ``cls.settings(cfg)`` is the variant's settings.
  """

  name: ClassVar[str] = ""
  # An add-on, on when ``enabled`` says so, beside model.memory's variant.
  ADDON: ClassVar[bool] = False
  Settings: ClassVar[type] = NoSettings
  # Fields of Settings that evaluation may override (eval.<name>.<field>).
  EVAL_OVERRIDES: ClassVar[tuple[str, ...]] = ()
  # The overrides (of EVAL_OVERRIDES) under which its own memory is off: the
  # trained model without it, which ``--mode=eval`` scores too (as
  # ``without_<name>``); empty: no such comparison.
  EVAL_WITHOUT: ClassVar[Mapping[str, Any]] = types.MappingProxyType({})
  # Flat model keys of earlier versions that are fields of Settings
  # (model.<key> -> model.<name>.<key>), and flat eval keys with the value
  # that meant "the model's" (eval.<key> -> eval.<name>.<key>, that value
  # -> None).
  LEGACY_KEYS: ClassVar[tuple[str, ...]] = ()
  LEGACY_EVAL_KEYS: ClassVar[Mapping[str, Any]] = types.MappingProxyType({})
  # The arrays of Memory.variant_state it owns, by name.
  STATE: ClassVar[Mapping[str, Leaf]] = types.MappingProxyType({})
  # Generation's decoding cache rolls each layer's projected keys and values
  # as a FIFO beside the memory (``attention_ops.CachedKV``): only right for a
  # memory that is a FIFO of the layer's inputs, with nothing written per pass.
  DECODE_CACHE: ClassVar[bool] = True
  # Documents masked apart inside a segment (doc_pos_BxT; front padding).
  DOCUMENTS: ClassVar[bool] = True
  # It runs on whole segments only (what a segment writes depends on where
  # segments start): generation runs the open segment again for each token
  # instead of one-token passes, and prompts start a segment (no padding).
  WHOLE_SEGMENTS: ClassVar[bool] = False
  # The attention may split the queries into blocks (attention_ops.attend).
  ONE_BLOCK: ClassVar[bool] = False
  # Its state keeps the gradient between segments (train.mem_backprop_depth),
  # and how to turn it on, for the message that refuses a depth without it.
  GRADIENT_THROUGH_SEGMENTS: ClassVar[bool] = False
  ENABLE_HINT: ClassVar[str] = ""

  # ---- settings ----------------------------------------------------------------

  @classmethod
  def settings(cls, cfg: ModelConfig) -> Any:
    """The variant's settings in ``cfg`` (its defaults if it has none there)."""
    return dict(cfg.memory_settings).get(cls.name) or cls.Settings()

  @classmethod
  def enabled(cls, settings: Any) -> bool:
    """An add-on: whether ``settings`` turn it on."""
    del settings
    return True

  @classmethod
  def settings_problems(cls, section: Mapping[str, Any]) -> list[str]:
    """Problems of the values of ``model.<name>`` (``section``, with the
    defaults filled in) alone: one message per problem naming
    ``model.<name>.<key>`` and the fix ([] if none)."""
    del section
    return []

  @classmethod
  def config_problems(cls, fields: Mapping[str, Any]) -> list[str]:
    """When the variant is on: what it needs of the other model fields
    (``fields``: the model section, each variant's section a dict)."""
    del fields
    return []

  @classmethod
  def run_problems(cls, fields: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """When the variant is on: what it needs of the run (``config``: the
    whole run config as nested dicts; ``fields``: its model section)."""
    del fields, config
    return []

  @classmethod
  def extra_positions(cls, settings: Any) -> int:
    """Positions the variant adds to each segment the layers run on."""
    del settings
    return 0

  @classmethod
  def param_groups(cls, cfg: ModelConfig) -> tuple[tuple[str, ...], ...]:
    """Groups of parameter names the optimiser clips apart from the rest
    (each by its own global norm), e.g. a network trained by an auxiliary
    loss alone; () for none."""
    del cfg
    return ()

  # ---- evaluation ----------------------------------------------------------------

  @classmethod
  def eval_settings(cls, settings: Any, overrides: Mapping[str, Any], sliding: bool) -> Any:
    """The settings evaluation uses: ``overrides`` (the ``eval.<name>``
    fields that are set) applied; ``sliding``: the sliding-window
    evaluation (each window from an empty memory)."""
    del sliding
    return dataclasses.replace(settings, **overrides) if overrides else settings

  @classmethod
  def eval_problems(cls, fields: Mapping[str, Any], eval_fields: Mapping[str, Any]) -> list[str]:
    """When the variant is on: what it needs of the evaluation settings
    (``eval_fields``: the eval section, its own overrides as
    ``eval_fields[name]``)."""
    del fields, eval_fields
    return []

  @classmethod
  def describe_eval(cls, settings: Any) -> dict[str, Any]:
    """What evaluation results record of the variant's settings ({} for
    nothing): the overridable fields."""
    return {k: getattr(settings, k) for k in cls.EVAL_OVERRIDES}

  # ---- state ----------------------------------------------------------------------

  @classmethod
  def slots(cls, mem_len: int, cfg: ModelConfig) -> int:
    """``model.memory``'s variant: memory slots per layer for a memory length
    ``mem_len`` (M)."""
    del cfg
    return mem_len

  @classmethod
  def init_state(cls, cfg: ModelConfig, batch_size: int) -> dict[str, Array]:
    """The variant's arrays of an empty memory, one per name of ``STATE``."""
    del cfg, batch_size
    return {}

  @classmethod
  def reset(cls, state: dict[str, Array], reset_B: Array) -> dict[str, Array]:
    """The variant's arrays (``state``) with the rows where ``reset_B`` (bool
    [B]) is True starting afresh (a new stream; a document start)."""
    del reset_B
    return state

  # ---- model hooks ------------------------------------------------------------------

  @classmethod
  def model_params(cls, module: nn.Module, cfg: ModelConfig) -> Any:
    """Parameters the variant owns at the model level, created in
    ``module``'s scope (``TransformerXL.setup``); None for none."""
    del module, cfg
    return None

  @classmethod
  def extend(cls, cfg: ModelConfig, params: Any, memory: Memory, emb_BxTxD: Array) -> Array:
    """Before the layers: the positions the layers run on, [B, T + extra,
    d_model] (``params``: ``model_params``'s)."""
    del cfg, params, memory
    return emb_BxTxD

  @classmethod
  def mask(cls, cfg: ModelConfig, mask_Bx1xExK: Array) -> Array:
    """The dense bool attention mask [B, 1, E, K] of the positions the layers
    run on, after ``extend``."""
    del cfg
    return mask_Bx1xExK

  @classmethod
  def before_layer(
      cls, layer: nn.Module, cfg: ModelConfig, h_BxExD: Array, state: dict, key_count_B: Array
  ) -> tuple[Array, dict]:
    """In each layer, before it: (the layer's input, the layer's slice of the
    variant's per-layer state); parameters in ``layer``'s scope."""
    del layer, cfg, key_count_B
    return h_BxExD, state

  @classmethod
  def position_scores(
      cls, cfg: ModelConfig, raw_HxBxExK: Array, bd_HxBxExK: Array, key_count_B: Array
  ) -> Array:
    """In attn_type 0's score: the (b)+(d) position terms after the shift
    (``bd``), given those before it (``raw``), float32 [H, B, E, K]."""
    del cfg, raw_HxBxExK, key_count_B
    return bd_HxBxExK

  @classmethod
  def combine(
      cls,
      attn: nn.Module,
      cfg: ModelConfig,
      q_BxExHxDh: Array,
      k_BxKxHxDh: Array,
      v_BxKxHxDh: Array,
      vec_BxExHxDh: Array,
      state: dict,
      key_count_B: Array,
  ) -> tuple[Array, dict]:
    """In the attention, before its output projection: (the attention
    vectors, the layer's state) given the queries, the keys and values of
    [memory; segment] (K = slots + E) and the local attention's vectors;
    parameters in ``attn``'s scope (e.g. a gate per head)."""
    del attn, cfg, q_BxExHxDh, k_BxKxHxDh, v_BxKxHxDh, key_count_B
    return vec_BxExHxDh, state

  @classmethod
  def layer_update(
      cls, module: nn.Module, cfg: ModelConfig, mem_BxMxD: Array, h_BxTxD: Array, key_count_B: Array
  ) -> Array:
    """``model.memory``'s variant: a layer's next slots (gradient stopped),
    called inside the layer (``DecoderLayer``, after its attention, whose
    parameters are then in ``module.variables``) so that a variant may
    create parameters and ``module.sow("losses", name, scalar)`` an
    auxiliary loss there.

    Args:
      module: the calling layer (a compact flax module).
      cfg: the ModelConfig.
      mem_BxMxD: the layer's memory as read (``layer_read``, after the
        attention variant's ``layer_inputs``), [B, slots, d_model].
      h_BxTxD: the layer's inputs for the positions it ran on [B, T, d_model].
      key_count_B: int32 [B], the key layout's count before the segment
        (``Memory.key_count_B``: the valid slots, minus the front padding).

    Returns:
      new_mem_BxMxD, [B, slots, d_model], the inputs' dtype.
    """
    del module, cfg, key_count_B
    return layer_update(mem_BxMxD, h_BxTxD)

  @classmethod
  def after_layer(
      cls, layer: nn.Module, cfg: ModelConfig, out_BxExD: Array, state: dict, key_count_B: Array
  ) -> tuple[Array, dict]:
    """In each layer, after it: (the layer's output, the layer's state)."""
    del layer, cfg, key_count_B
    return out_BxExD, state

  @classmethod
  def advance(
      cls, cfg: ModelConfig, memory: Memory, new_mems_LxBxMxD: Array, tgt_len: int
  ) -> Memory:
    """``model.memory``'s variant: the next ``Memory`` from the layers' new
    slots (stacked, [n_layer, B, slots, d_model]) after ``tgt_len``
    positions: ``Memory.advance``, whose count is ``advance_mlen``'s."""
    del cfg
    return memory.advance(new_mems_LxBxMxD, tgt_len)

  @classmethod
  def finish(
      cls, cfg: ModelConfig, h_BxExD: Array, memory: Memory, seg_len: int
  ) -> tuple[Array, Memory]:
    """After the layers (and the model's last dropout): (the segment's
    hidden states [B, seg_len, d_model], the next Memory)."""
    del cfg, seg_len
    return h_BxExD, memory

  @classmethod
  def example(cls) -> dict[str, Any]:
    """Model fields that turn the variant on in a small model (layers of
    width 16, segments of 4, ``mem_len`` 4), for the conformance tests
    (tests/test_memory_conformance.py)."""
    return {"memory": cls.name}


VARIANTS: dict[str, type[MemoryVariant]] = {}


def register(cls: type[MemoryVariant]) -> type[MemoryVariant]:
  """Adds a memory variant under ``cls.name`` (a class decorator), with its
  state leaves (``cls.STATE``).

  Raises:
    ValueError: no name, another variant has that name or one of its state
      names, or its ``Settings`` is not a frozen dataclass.
  """
  if not cls.name:
    raise ValueError(f"{cls.__name__} has no name.")
  if VARIANTS.get(cls.name, cls) is not cls:
    raise ValueError(f"a memory variant named {cls.name!r} exists: {VARIANTS[cls.name]}.")
  params = getattr(cls.Settings, "__dataclass_params__", None)
  if params is None or not params.frozen:
    raise ValueError(f"{cls.__name__}.Settings must be a frozen dataclass.")
  for name in cls.STATE:
    owner = state_lib.STATE_OWNERS.get(name, cls)
    if name in state_lib.SHARED_LEAVES or getattr(owner, "name", None) != cls.name:
      raise ValueError(f"{cls.__name__}: the memory already has an array named {name!r}.")
  for name, leaf in cls.STATE.items():  # all checked: now registered together
    state_lib.STATE_LEAVES[name] = leaf
    state_lib.STATE_OWNERS[name] = cls
  VARIANTS[cls.name] = cls
  return cls


@register
class XLMemory(MemoryVariant):
  """The XL memory (Dai et al. 2019, Sec. 3.2): each layer keeps its last
  ``mem_len`` inputs (``model.memory="xl"``, the default): the interface's
  defaults."""

  name = "xl"
