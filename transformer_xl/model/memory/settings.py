"""The memory variants' settings in the model config, and their checks.

Each registered variant with settings (``MemoryVariant.Settings``) has a
section of the model config, ``model.<name>`` (e.g.
``model.compressive.cmem_len``), and its overridable fields a section of
the eval config, ``eval.<name>`` (unset: the model's).  ``ModelConfig``
holds them as ``memory_settings`` (``normalise_settings``); the run config
(``default_config``) builds its sections from ``default_sections`` and
``eval_override_sections``.  Files of earlier versions, whose keys were
flat (``model.cmem_len``, ``eval.cmem_len``), are read through
``upgrade_fields`` and ``upgrade_eval``.

The checks, each returning one message per problem that names the key and
the fix: ``config_problems`` (the model section), ``eval_problems`` (the
eval section), ``run_problems`` (the whole run config).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections

from transformer_xl.model.memory.variant import VARIANTS, MemoryVariant


def has_settings(cls: type[MemoryVariant]) -> bool:
  """Whether ``cls`` has settings (a ``model.<name>`` section)."""
  return bool(dataclasses.fields(cls.Settings))


def tuple_settings() -> dict[str, type]:
  """{"model.<name>.<key>": element type} of every registered variant's
  tuple settings (its ``Settings`` fields annotated ``tuple[T, ...]``, e.g.
  ``model.knn.layers``: int), for the run config's element checks."""
  out: dict[str, type] = {}
  for name, cls in sorted(VARIANTS.items()):
    if not has_settings(cls):
      continue
    hints = typing.get_type_hints(cls.Settings)
    for field in dataclasses.fields(cls.Settings):
      hint = hints[field.name]
      if typing.get_origin(hint) is tuple and typing.get_args(hint):
        out[f"model.{name}.{field.name}"] = typing.get_args(hint)[0]
  return out


def default_sections() -> dict[str, dict[str, Any]]:
  """{variant name: its settings' defaults} for every registered variant
  with settings: the ``model.<name>`` sections of the run config."""
  return {
      name: dataclasses.asdict(cls.Settings())
      for name, cls in sorted(VARIANTS.items())
      if has_settings(cls)
  }


def sections(raw: Any) -> dict[str, dict[str, Any]]:
  """Settings as given (a mapping, or ``ModelConfig.memory_settings``'s
  pairs; each value a mapping or a settings instance) as {name: {field:
  value}}, the defaults filled in for every registered variant with
  settings."""
  given = dict(raw.items() if isinstance(raw, Mapping) else raw or ())
  out = default_sections()
  for name, value in given.items():
    if dataclasses.is_dataclass(value):
      value = dataclasses.asdict(value)
    if isinstance(value, Mapping):  # a file's lists as the settings' tuples
      value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
      out[name] = {**out.get(name, {}), **value}
    else:
      out[name] = value
  return out


def normalise_settings(raw: Any) -> tuple[tuple[str, Any], ...]:
  """``ModelConfig.memory_settings``'s form of ``raw`` (as ``sections``): a
  sorted tuple of (variant name, its frozen settings), hashable, holding
  only the settings that are not a variant's defaults, so that two equal
  models are equal whatever else is registered (a variant's settings are
  its defaults where it has none there: ``MemoryVariant.settings``)."""
  out = []
  for name, values in sorted(sections(raw).items()):
    settings = VARIANTS[name].Settings(**values)
    if settings != VARIANTS[name].Settings():
      out.append((name, settings))
  return tuple(out)


def without_defaults(fields: Mapping[str, Any], eval_fields: bool = False) -> dict[str, Any]:
  """``fields`` (a model section, or with ``eval_fields`` an eval section)
  without the variants' sections that hold only their defaults (an eval
  section: only unset overrides), as files are written: a workdir's files
  name the settings that matter, and read the same wherever other variants
  are registered."""
  out = dict(fields)
  for name, cls in VARIANTS.items():
    section = out.get(name)
    if not isinstance(section, Mapping):
      continue
    if eval_fields:
      unset = all(v is None for v in section.values())
    else:
      unset = sections({name: section})[name] == dataclasses.asdict(cls.Settings())
    if unset:
      del out[name]
  return out


def section_problems(fields: Mapping[str, Any]) -> list[str]:
  """Problems of the ``model.<name>`` sections of ``fields`` (the model
  section): not a mapping, unknown keys, and each variant's
  ``settings_problems``."""
  problems = []
  for name, cls in sorted(VARIANTS.items()):
    if not has_settings(cls) or name not in fields:
      continue
    section = fields[name]
    if dataclasses.is_dataclass(section):
      section = dataclasses.asdict(section)
    if not isinstance(section, Mapping):
      problems.append(f"model.{name}={section!r} must be a section of settings (a mapping).")
      continue
    known = {f.name for f in dataclasses.fields(cls.Settings)}
    unknown = sorted(set(section) - known)
    if unknown:
      problems.append(
          f"model.{name} has no setting {', '.join(unknown)}: its settings are "
          f"{', '.join(sorted(known))}."
      )
    problems += cls.settings_problems({**dataclasses.asdict(cls.Settings()), **section})
  return problems


def _known_memory(fields: Mapping[str, Any]) -> bool:
  """``model.memory`` names a registered variant that is not an add-on."""
  cls = VARIANTS.get(fields.get("memory", "xl"))
  return cls is not None and not cls.ADDON


def active(fields: Mapping[str, Any]) -> tuple[type[MemoryVariant], ...]:
  """The variants on in the model section ``fields`` (a validated one):
  model.memory's, then the enabled add-ons, by name."""
  all_sections = sections({k: v for k, v in fields.items() if k in VARIANTS})
  primary = VARIANTS[fields.get("memory", "xl")]
  addons = [
      cls
      for name, cls in sorted(VARIANTS.items())
      if cls.ADDON and cls.enabled(cls.Settings(**all_sections.get(name, {})))
  ]
  return (primary, *addons)


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Every memory problem of the model section ``fields`` (each variant's
  section a mapping): ``model.memory`` names a registered variant that is
  not an add-on, the sections' values (``section_problems``), a section of
  a variant ``model.memory`` does not choose left at its defaults, and
  what the variants on need of the other fields (``config_problems``);
  [] if none."""
  name = fields.get("memory", "xl")
  problems = section_problems(fields)
  choices = tuple(sorted(n for n, c in VARIANTS.items() if not c.ADDON))
  if name not in choices:
    return problems + [f"model.memory={name!r}: use one of {choices}."]
  if problems:
    return problems
  full = {**fields, **sections({k: v for k, v in fields.items() if k in VARIANTS})}
  for other, cls in sorted(VARIANTS.items()):
    if cls.ADDON or other == name or not has_settings(cls):
      continue
    changed = {k: v for k, v in full[other].items() if v != getattr(cls.Settings(), k)}
    if changed:
      key, value = next(iter(changed.items()))
      problems.append(
          f"model.{other}.{key}={value!r} is a setting of model.memory={other!r} (the model "
          f"has {name!r}): set model.memory={other!r}, or leave model.{other} at its defaults."
      )
  for cls in active(full):
    problems += cls.config_problems(full)
  return problems


def extra_positions(fields: Mapping[str, Any]) -> int:
  """Positions the variants on in ``fields`` add to each segment (the
  layers run on tgt_len + this many)."""
  full = sections({k: v for k, v in fields.items() if k in VARIANTS})
  return sum(cls.extra_positions(cls.Settings(**full.get(cls.name, {}))) for cls in active(fields))


def upgrade_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
  """Saved model fields with the flat keys of earlier versions
  (``LEGACY_KEYS``: e.g. ``cmem_len``, ``num_mem_tokens``) moved into their
  variant's section; a key already in its section there wins."""
  out = dict(fields)
  for name, cls in VARIANTS.items():
    moved = {key: out.pop(key) for key in cls.LEGACY_KEYS if key in out}
    if moved:
      section = out.get(name)
      out[name] = {**moved, **(dict(section) if isinstance(section, Mapping) else {})}
  return out


def upgrade_eval(eval_fields: Mapping[str, Any]) -> dict[str, Any]:
  """A saved eval section with the flat keys of earlier versions
  (``LEGACY_EVAL_KEYS``, e.g. ``cmem_len``) moved into ``eval.<name>``,
  their "the model's" value (e.g. -1) as None."""
  out = dict(eval_fields)
  for name, cls in VARIANTS.items():
    moved = {}
    for key, unset in cls.LEGACY_EVAL_KEYS.items():
      if key in out:
        value = out.pop(key)
        moved[key] = None if value == unset else value
    if moved:
      section = out.get(name)
      out[name] = {**moved, **(dict(section) if isinstance(section, Mapping) else {})}
  return out


def renamed(key: str) -> str | None:
  """The name today of a dotted config key of earlier versions that a
  variant's setting replaced (``"model.cmem_len"`` ->
  ``"model.compressive.cmem_len"``); None if ``key`` is none of those."""
  section, _, name = key.partition(".")
  for variant, cls in sorted(VARIANTS.items()):
    if (section == "model" and name in cls.LEGACY_KEYS) or (
        section == "eval" and name in cls.LEGACY_EVAL_KEYS
    ):
      return f"{section}.{variant}.{name}"
  return None


def eval_override_sections() -> dict[str, dict[str, Any]]:
  """The ``eval.<name>`` sections of the run config: each overridable field
  (``EVAL_OVERRIDES``) unset (None: the model's), typed as its default."""
  out = {}
  for name, cls in sorted(VARIANTS.items()):
    if cls.EVAL_OVERRIDES:
      defaults = cls.Settings()
      out[name] = {
          key: ml_collections.FieldReference(None, field_type=type(getattr(defaults, key)))
          for key in cls.EVAL_OVERRIDES
      }
  return out


def eval_problems(fields: Mapping[str, Any], eval_fields: Mapping[str, Any]) -> list[str]:
  """Problems of the memory's evaluation settings: overrides of a variant
  that is not on, and what each variant on needs (``eval_problems``); none
  while ``model.memory`` names no variant (``config_problems`` says so)."""
  if not _known_memory(fields):
    return []
  full = {**fields, **sections({k: v for k, v in fields.items() if k in VARIANTS})}
  on = active(full)
  problems = []
  for name, cls in sorted(VARIANTS.items()):
    overrides = eval_fields.get(name) or {}
    set_keys = {k: v for k, v in overrides.items() if v is not None}
    if set_keys and cls not in on:
      key, value = next(iter(set_keys.items()))
      problems.append(
          f"eval.{name}.{key}={value!r} needs the model's memory {name!r} (it has "
          f"{fields.get('memory', 'xl')!r}); leave it unset."
      )
  for cls in on:
    problems += cls.eval_problems(full, eval_fields)
  return problems


def run_problems(fields: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
  """What the model's memory needs of the run (``config``: the whole run
  config as nested dicts, its model section ``fields``): each variant on's
  ``run_problems``, and a ``train.mem_backprop_depth`` > 0 only with a
  variant that keeps the gradient between segments, or with whole examples
  per step (``train.bptt_bp`` on a synthetic task or BABILong: one update
  per batch of examples for any memory, the gradient of a stop-gradient one
  staying inside its segment); none while ``model.memory`` names no
  variant (``config_problems`` says so)."""
  if not _known_memory(fields):
    return []
  full = {**fields, **sections({k: v for k, v in fields.items() if k in VARIANTS})}
  on = active(full)
  problems = []
  for cls in on:
    problems += cls.run_problems(full, config)
  train = config.get("train") or {}
  depth = train.get("mem_backprop_depth", 0)
  dataset = str((config.get("data") or {}).get("dataset", ""))
  # A step per whole example (every segment's loss, one update) suits every memory: the
  # studies' equal optimizer steps.  Sliding windows only recompute a stop-gradient memory.
  whole_examples = train.get("bptt_bp", False) and dataset.startswith(("synthetic:", "babilong:"))
  if (
      isinstance(depth, int)
      and depth > 0
      and not whole_examples
      and not any(c.GRADIENT_THROUGH_SEGMENTS for c in on)
  ):
    hints = [c.ENABLE_HINT for _, c in sorted(VARIANTS.items()) if c.GRADIENT_THROUGH_SEGMENTS]
    problems.append(
        f"train.mem_backprop_depth={depth} needs a memory that carries the gradient between "
        f"segments ({' or '.join(hints) or 'none is registered'}): the XL memory is "
        "stop-gradient (a task of whole examples may still take one step per example: "
        "train.bptt_bp=True with the depth of its segments)."
    )
  return problems
