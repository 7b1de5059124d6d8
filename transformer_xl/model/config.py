"""The model's hyperparameters (``ModelConfig``) and their validation.

The one definition of the model's hyperparameter names and defaults (the
reference implementation's names), with the checks that refuse a model that
cannot work before anything is built: ``config_problems`` (every field) and
``segment_problems`` (a segment layout: training's or evaluation's).  The
run config (``transformer_xl.default_config``) derives its ``model``
section from ``ModelConfig`` and adds the checks of the other sections.
Nothing here depends on the data, training or run code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_xl.model import adaptive, attention, memory, tuning

DTYPES = ("float32", "bfloat16")  # model.dtype
ATTENTION_IMPLS = ("xla", "pallas")  # model.attention_impl
# The finite range of each float field, for the message that refuses a NaN or
# an infinity (the range itself is checked in config_problems).
FLOAT_RANGES = {
    "model.dropout": "in [0, 1)",
    "model.dropatt": "in [0, 1)",
    "model.init_std": "> 0",
    "model.proj_init_std": "> 0",
}
# Fields since removed that files of earlier versions hold (a workdir's
# model_config.json and config.json, a checkpoint's recorded model): the
# one value they could hold there, and why no other is read.
LEGACY_KEYS: dict[str, tuple[Any, str]] = {
    # The reference's extended context: validation and the converter only
    # ever allowed 0.
    "ext_len": (0, "the extended context (the reference's ext_len) is not supported"),
}


def drop_legacy_keys(fields: Mapping[str, Any], section: str = "model") -> dict[str, Any]:
  """Saved model fields without the keys of earlier versions (``LEGACY_KEYS``).

  The one place where files written before a field was removed are read:
  ``ModelConfig.from_dict`` and ``default_config.without_legacy_keys``
  (config.json) go through it.

  Args:
    fields: model fields by name, as saved.
    section: the fields' dotted name, for the message.

  Returns:
    A new dict: ``fields`` less the legacy keys that hold their one value.

  Raises:
    ValueError: a legacy key holds another value (naming
      ``<section>.<key>``).
  """
  kept = dict(fields)
  for key, (only, why) in LEGACY_KEYS.items():
    if key in kept and (value := kept.pop(key)) != only:
      raise ValueError(
          f"{section}.{key}={value!r}: {why}; files of earlier versions are read only "
          f"with {key}={only!r}."
      )
  return kept


def flat_fields(fields: Mapping[str, Any] | None, complete: bool = False) -> dict[str, Any]:
  """Saved model fields (``ModelConfig.to_dict``'s form, or an earlier
  version's: ``memory.upgrade_fields``) with each memory variant's section
  spread into dotted keys (``"<variant>.<field>"``), for comparing two
  models key by key and naming the keys that differ.

  Args:
    fields: the model fields.
    complete: ``fields`` describe a whole model (a file's record, which
      names only the variants' sections that are not their defaults): fill
      in every registered variant's defaults where ``fields`` lack them.
      False: ``fields`` may be some settings only; a key they lack is left
      out.
  """
  out = {}
  upgraded = memory.upgrade_fields(dict(fields or {}))
  if complete:
    given = {k: v for k, v in upgraded.items() if k in memory.default_sections()}
    filled = memory.sections({k: v for k, v in given.items() if isinstance(v, Mapping)})
    upgraded.update(
        {k: v for k, v in filled.items() if k not in given or isinstance(given[k], Mapping)}
    )
  for key, value in upgraded.items():
    if key in memory.default_sections() and isinstance(value, Mapping):
      # a setting's tuple as a file's list (e.g. a list of layers), so both compare equal
      out.update({f"{key}.{k}": list(v) if isinstance(v, tuple) else v for k, v in value.items()})
    else:
      out[key] = value
  return out


class UnknownKeysError(TypeError):
  """Saved fields with keys this version does not know: a file written by a
  newer version (``newer_version_message``), not a damaged one.

  Attributes:
    keys: the unknown keys' dotted names (e.g. ``("model.rope_base",)``).
  """

  def __init__(self, keys: list[str]):
    self.keys = tuple(keys)
    super().__init__(f"unknown key{'s' if len(self.keys) > 1 else ''} {', '.join(self.keys)}")


def unknown_keys(saved: Any, known: Mapping[str, Any], prefix: str = "") -> list[str]:
  """The dotted names of the keys of a saved config that ``known`` lacks.

  Args:
    saved: the saved config, parsed (anything but a mapping has none).
    known: this version's config as nested dicts (``ConfigDict.to_dict()``);
      a key is unknown if ``known`` lacks it.
    prefix: the dotted name of ``saved`` itself ("" at the top).

  Returns:
    Sorted dotted names (``"model.rope_base"``, ``"newsection"``), looking
    into the sections that both hold as mappings.
  """
  if not isinstance(saved, Mapping):
    return []
  found = []
  for key, value in saved.items():
    name = f"{prefix}{key}"
    if key not in known:
      found.append(name)
    elif isinstance(known[key], Mapping):
      found += unknown_keys(value, known[key], name + ".")
  return sorted(found)


def known_only(saved: Any, known: Mapping[str, Any]) -> Any:
  """A copy of the saved config ``saved`` with only the keys ``known`` has
  (``unknown_keys`` names the others), looking into the sections that both
  hold as mappings; anything but a mapping is returned as it is."""
  if not isinstance(saved, Mapping):
    return saved
  return {
      key: known_only(value, known[key]) if isinstance(known[key], Mapping) else value
      for key, value in saved.items()
      if key in known
  }


def newer_version_message(path: Any, keys: list[str] | tuple[str, ...]) -> str:
  """What to say of a saved config (``path``) that is valid but for ``keys``,
  which this version does not know: a newer version wrote it."""
  s = "s" if len(keys) > 1 else ""
  return (
      f"{path} was written by a newer version of transformer_xl (unknown key{s} "
      f"{', '.join(keys)}); upgrade, or remove the key{s}."
  )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model's hyperparameters: the one definition of their names and defaults.

  The run config's ``model`` section (``default_config.get_config().model``) is derived from these fields (all
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
    clamp_len: largest relative distance encoded (0 = no clamp).
    same_length: every query attends to at most mem_len keys.
    pre_lnorm: LayerNorm before each sub-block (default: after, as in the
      paper).
    untie_r: per-layer u, v (``r_w_bias``, ``r_r_bias``) instead of shared.
    tie_weight: output softmax weights shared with the input embedding
      (all cluster tables with the adaptive softmax).
    attn_type: attention variant, the reference's numbering
      (``attention.ATTENTION_TYPES``): 0 = Transformer-XL (Sec. 3.3), 1 =
      Shaw et al. (2018) learned relative, 2 = Vaswani et al. (2017)
      absolute sinusoid, 3 = Al-Rfou et al. (2018) learned absolute per
      layer (needs n_head * d_head == d_model).
    max_klen: rows of the learned position tables of types 1 and 3; 0 =
      the training attention length tgt_len + mem_len (the
      reference's ``max_klen``).  The eval config keeps the training value.
    attn_block: queries per block of the blockwise attention (0 = the full
      [B, H, T, K] computation at once); the result is the same, the
      temporaries O(attn_block x K) (attention_ops.attend).  -1 (the default)
      = chosen per backend and use by ``tuning.attn_block_size``.
    attention_impl: how attn_type 0's attention is computed: "xla" (scores
      and probabilities as [B, H, T, K] tensors, blockwise per
      ``attn_block``) or "pallas" (the fused kernel of
      ``pallas_attention``: no [B, H, T, K] tensor; Mosaic on TPU, Triton
      on GPU, interpret mode elsewhere (exact, slow)).  The same results;
      a free setting (a workdir trained with one evaluates with the
      other).  Training steps with dropatt > 0 use "xla" (logged once).
    scan_unroll: layers per iteration of the ``nn.scan`` loop over layers
      (1 = one layer per iteration; n_layer or more = fully unrolled); the
      parameters and results are the same.  -1 (the default) = chosen per
      backend by ``tuning.scan_unroll_layers``.
    init_std: std of weight, embedding and u/v initialisation (0.02).
    dtype: compute dtype name, one of ``DTYPES``; parameters are
      float32; softmax and loss are float32.
    remat: rematerialisation policy of each layer in the backward pass, a
      key of ``tuning.REMAT_POLICIES``: "none", "full" (recompute the layer),
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
    memory: the memory variant, a key of ``memory.VARIANTS`` that is not an
      add-on: "xl" (the default: each layer caches its last mem_len
      inputs, Sec. 3.2) or another registered variant (``memory.register``;
      the package's are listed in ``transformer_xl.model.memory``).
    memory_settings: the memory variants' settings (``memory.variant``):
      given as {variant name: its settings (a mapping of fields, or its
      ``Settings``)}, e.g. ``{name: {field: value}}`` for the variant of
      ``memory`` or an add-on beside it; held as a sorted tuple of (name,
      settings) for every registered variant with settings
      (``memory.normalise_settings``).  In the run config and saved files
      each is a section of the model's, ``model.<name>`` (``to_dict``,
      ``from_dict``).

  Raises:
    ValueError (on construction): every problem ``config_problems``
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
  clamp_len: int = 0
  same_length: bool = False
  pre_lnorm: bool = False
  untie_r: bool = False
  tie_weight: bool = True
  attn_type: int = 0
  max_klen: int = 0
  attn_block: int = -1
  attention_impl: str = "xla"
  scan_unroll: int = -1
  init_std: float = 0.02
  dtype: str = "float32"
  remat: str = "none"
  d_embed: int | None = 0
  div_val: int = 1
  cutoffs: tuple = ()
  tie_projs: tuple = ()
  proj_init_std: float = 0.01
  memory: str = "xl"
  memory_settings: Any = ()

  def __post_init__(self):
    object.__setattr__(self, "cutoffs", tuple(int(c) for c in (self.cutoffs or ())))
    object.__setattr__(self, "tie_projs", tuple(bool(t) for t in (self.tie_projs or ())))
    raw = self.memory_settings
    names = raw.keys() if isinstance(raw, Mapping) else [n for n, _ in raw or ()]
    unknown = sorted(set(names) - set(memory.default_sections()))
    problems = [
        f"model.{n}: no registered memory variant with settings has that name "
        f"(those are {', '.join(sorted(memory.default_sections()))})."
        for n in unknown
    ] or config_problems(self.to_dict())
    if problems:
      raise ValueError("Invalid model config: " + " ".join(problems))
    object.__setattr__(self, "memory_settings", memory.normalise_settings(self.memory_settings))

  def to_dict(self) -> dict[str, Any]:
    """The fields by name, each memory variant's settings as its section
    (``model.<name>``: a dict of its fields): what the run config's model
    section and saved files hold."""
    fields = {
        f.name: getattr(self, f.name)
        for f in dataclasses.fields(self)
        if f.name != "memory_settings"
    }
    return {**fields, **memory.sections(self.memory_settings)}

  def with_memory(self, name: str, **changes: Any) -> ModelConfig:
    """A copy whose memory variant ``name``'s settings have ``changes``
    (``cfg.with_memory(name, field=value)``).

    Raises:
      ValueError: the new settings' problems.
    """
    settings = memory.sections(self.memory_settings)
    settings[name] = {**settings.get(name, {}), **changes}
    return dataclasses.replace(self, memory_settings=settings)

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """{field: default} for every field but n_token, and each memory
    variant's section of defaults (``default_config``'s model section)."""
    fields = {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.name not in ("n_token", "memory_settings")
    }
    return {**fields, **memory.default_sections()}

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> ModelConfig:
    """A ModelConfig from fields by name (``to_dict``'s form: the memory
    variants' settings as sections), e.g. a workdir's ``model_config.json``
    or a checkpoint's recorded ``model``, which may hold the keys of
    earlier versions: ``drop_legacy_keys`` drops those, and the memory
    variants' flat keys move into their sections (``memory.upgrade_fields``).

    Raises:
      ValueError: a legacy key with a value never supported, or the
        fields' problems (``config_problems``).
      UnknownKeysError: (a TypeError) keys this version does not know,
        beside fields that are otherwise valid (a newer version's file).
      TypeError: a field missing.
    """
    fields = memory.upgrade_fields(drop_legacy_keys(fields))
    names = {f.name for f in dataclasses.fields(cls)} - {"memory_settings"}
    sections = {k: v for k, v in fields.items() if k in memory.default_sections()}
    known = {k: v for k, v in fields.items() if k in names}
    unknown = sorted(k for k in fields if k not in names and k not in sections)
    if unknown:
      cls(**known, memory_settings=sections)  # the other fields' problems first
      raise UnknownKeysError([f"model.{k}" for k in unknown])
    return cls(**known, memory_settings=sections)

  @property
  def pos_table_len(self) -> int:
    """``max_klen`` resolved when it is 0: tgt_len + the memory slots
    (mem_len for the XL memory)."""
    return self.max_klen or self.tgt_len + memory.plan(self).slots(self.mem_len)

  @property
  def embed_dim(self) -> int:
    """``d_embed`` resolved: d_model when d_embed is 0 or None."""
    return self.d_model if not self.d_embed else int(self.d_embed)

  @property
  def compute_dtype(self):
    """``dtype`` as a numpy dtype."""
    return jnp.dtype(self.dtype)


def segment_problems(
    tgt_len: int,
    mem_len: int,
    clamp_len: int,
    same_length: bool,
    section: str = "model",
) -> list[str]:
  """Problems of a segment layout (training ``model.*`` or ``eval.*``).

  Returns:
    One message per problem, naming ``<section>.<key>`` and the fix; [] if
    none.
  """
  problems = []
  if tgt_len < 1 or mem_len < 0 or clamp_len < 0:
    problems.append(
        f"{section}: tgt_len must be >= 1 and mem_len, clamp_len >= 0 (got "
        f"{tgt_len}, {mem_len}, {clamp_len})."
    )
  if same_length and mem_len < 1:
    problems.append(
        f"{section}.same_length=True needs {section}.mem_len >= 1 (with no memory "
        "every key would be masked)."
    )
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
  problems, nonfinite = nonfinite_problems(
      "model",
      f,
      default=lambda name: ModelConfig.defaults().get(name.partition(".")[2]),
      float_ranges=FLOAT_RANGES,
  )
  for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner"):
    if f[key] < 1:
      problems.append(f"model.{key}={f[key]} must be >= 1.")
  if f["d_model"] % 2:
    problems.append(f"model.d_model={f['d_model']} must be even (sinusoid encoding).")
  problems += segment_problems(f["tgt_len"], f["mem_len"], f["clamp_len"], f["same_length"])
  for key in ("dropout", "dropatt"):
    if f"model.{key}" not in nonfinite and not 0.0 <= f[key] < 1.0:
      problems.append(f"model.{key}={f[key]} must be in [0, 1).")
  for key in ("init_std", "proj_init_std"):
    if f"model.{key}" not in nonfinite and not 0.0 < f[key]:
      problems.append(f"model.{key}={f[key]} must be > 0 (the std of a normal initialiser).")
  if f["dtype"] not in DTYPES:
    problems.append(f"model.dtype={f['dtype']!r}: use one of {DTYPES}.")
  if f["remat"] not in tuning.REMAT_POLICIES:
    problems.append(f"model.remat={f['remat']!r}: use one of {tuple(tuning.REMAT_POLICIES)}.")
  problems += attention.config_problems(f)
  problems += [  # a NaN or inf named once (above), not again by a variant's checks
      p for p in memory.config_problems(f) if not any(p.startswith(f"{n}=") for n in nonfinite)
  ]
  if f["attn_block"] < -1:
    problems.append(
        f"model.attn_block={f['attn_block']} must be >= -1 (-1 = chosen per "
        "backend, 0 = no blocks, N = queries per block)."
    )
  if f["attention_impl"] not in ATTENTION_IMPLS:
    problems.append(f"model.attention_impl={f['attention_impl']!r}: use one of {ATTENTION_IMPLS}.")
  elif f["attention_impl"] == "pallas" and f["attn_type"] != 0:
    problems.append(
        f"model.attention_impl='pallas' is the kernel of attn_type 0 "
        f"(Transformer-XL); model.attn_type={f['attn_type']} needs "
        "model.attention_impl='xla'."
    )
  if f["scan_unroll"] < -1 or f["scan_unroll"] == 0:
    problems.append(
        f"model.scan_unroll={f['scan_unroll']} must be -1 (chosen per backend) or "
        ">= 1 (layers per iteration of the loop over layers)."
    )
  if f["max_klen"] < 0:
    problems.append(f"model.max_klen={f['max_klen']} must be >= 0 (0 = tgt_len + mem_len).")
  embed_dim = f["d_model"] if not f["d_embed"] else int(f["d_embed"])
  problems += adaptive.config_problems(
      f.get("n_token"),
      embed_dim,
      f["d_model"],
      tuple(f["cutoffs"] or ()),
      f["div_val"],
      tuple(f["tie_projs"] or ()),
  )
  return problems


def nonfinite_problems(
    section: str,
    values: Mapping[str, Any],
    *,
    default: Callable[[str], Any] = lambda name: None,
    infinity_allowed: Mapping[str, str] | None = None,
    float_ranges: Mapping[str, str] | None = None,
) -> tuple[list[str], set[str]]:
  """The NaN and infinite floats among a config section's values.

  One generic check of every float (and every float inside a tuple or list;
  nested sections are walked): NaN is refused everywhere, +-inf everywhere
  but in ``infinity_allowed``.  The range checks of the run config's ``validate``
  and ``config_problems`` skip the keys refused here, so that each bad
  value is named once.

  Args:
    section: the section's dotted name, e.g. "train" (prefix of the keys;
      "" for a whole config).
    values: key -> value (a ConfigDict section or a dict of ModelConfig fields).
    default: dotted key -> its default (quoted in the message as an example).
    infinity_allowed: dotted key -> what +inf means there (allowed only there).
    float_ranges: dotted key -> its finite range, for the message.

  Returns:
    (problems, names): one message per refused value, naming
    ``<section>.<key>``, the value and the fix; and the refused
    ``<section>.<key>`` names.
  """
  allowed_inf, ranges = infinity_allowed or {}, float_ranges or {}
  problems, names = [], set()
  for key, value in values.items():
    name = f"{section}.{key}" if section else str(key)
    if isinstance(value, (ml_collections.ConfigDict, Mapping)):
      sub_problems, sub_names = nonfinite_problems(
          name, value, default=default, infinity_allowed=allowed_inf, float_ranges=ranges
      )
      problems += sub_problems
      names |= sub_names
      continue
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    bad = [
        float(v)
        for v in items
        if isinstance(v, (float, np.floating))
        and not math.isfinite(v)
        and not (v == math.inf and name in allowed_inf)
    ]
    if not bad:
      continue
    if isinstance(value, (tuple, list)):
      what = f"holds {bad[0]}"
    else:
      what = "is not a number" if math.isnan(bad[0]) else "is infinite"
    allowed, default_value = allowed_inf.get(name), default(name)
    notes = [
        n
        for n in (allowed, f"e.g. {default_value!r}" if isinstance(default_value, float) else "")
        if n
    ]
    fix = (
        "give finite values"
        if isinstance(value, (tuple, list))
        else f"give a {'' if allowed else 'finite '}value"
        + (f" {ranges[name]}" if name in ranges else "")
        + (f" ({'; '.join(notes)})" if notes else "")
    )
    problems.append(f"{name}={value} {what}: {fix}.")
    names.add(name)
  return problems, names
