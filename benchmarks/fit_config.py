"""Which config ``fit.py`` analyses, on which devices: loading a config file
(``path[:preset]``), ``--config.<key>=<value>`` overrides, the device count
and kind of its slice, the vocabulary size; the result is a ``Job``.

Bad input raises ``FitError``, whose message ``fit.py`` prints as one
``error: ...`` line.  Nothing heavy is imported at import time (the config
files and ``transformer_xl`` are imported when a config is loaded).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import re
from typing import Any

import common

GIB = 2**30  # bytes

# Memory of one JAX device, GiB: a TPU v2/v3 TensorCore, a v4/v5e/v5p/v6e chip (Cloud
# TPU system architecture pages, as transformer_xl/compile/chips.py: v2 8 GiB and v3 16 GiB
# of HBM per core, v4 32, v5e 16, v5p 95 and v6e 32 per chip), an NVIDIA H100 (80 GB of HBM3; a CUDA
# process gets somewhat less, which --margin covers).
DEVICE_MEMORY_GIB = {"v2": 8, "v3": 16, "v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "h100": 80}


class FitError(Exception):
  """Bad input: the message is printed as one ``error: ...`` line."""


def vocab_sizes() -> dict[str, int]:
  """Vocabulary size of each corpus whose size is fixed
  (``transformer_xl.training.lowering.vocab_sizes``)."""
  from transformer_xl.training import lowering

  return lowering.vocab_sizes()


# ---------------------------------------------------------------------------
# Loading (as ml_collections' config_flags does) and overrides.
# ---------------------------------------------------------------------------


def load_config(spec: str):
  """``path[:arg]`` -> the ConfigDict of ``get_config(arg)`` (``get_config()``
  without an arg), as ``--config`` of ``transformer_xl.main`` reads it.

  Raises:
    FitError: no such file, no get_config, an argument the config does not
      take, or the config's own error (e.g. an unknown preset).
  """
  path, _, arg = spec.partition(":")
  full = path if os.path.isabs(path) else os.path.join(common.REPO, path)
  if not os.path.isfile(full):
    raise FitError(f"config file not found: {path} (e.g. --config=configs/enwik8_24l.py:v3-32)")
  module_spec = importlib.util.spec_from_file_location(
      "fit_config_" + re.sub(r"\W", "_", os.path.basename(path)), full
  )
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as err:  # a broken config file: say which
    raise FitError(f"cannot load {path}: {type(err).__name__}: {err}") from None
  if not hasattr(module, "get_config"):
    raise FitError(f"{path} has no get_config()")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except TypeError as err:
    if arg and "argument" in str(err):
      raise FitError(
          f"{path} takes no argument (no slice preset), got {arg!r}: use "
          f"--config={path} with --devices=N --device_kind=KIND (and "
          "--config.mesh.* overrides)"
      ) from None
    raise FitError(f"{spec}: {err}") from None
  except ValueError as err:  # e.g. presets.apply_slice: unknown preset, batch not divisible
    raise FitError(str(err)) from None


def _parse_value(text: str, current: Any, key: str) -> Any:
  """``text`` as the type of the key's current value (bool, int, float,
  tuple, str)."""
  try:
    if isinstance(current, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
    if isinstance(current, (tuple, list)):
      value = ast.literal_eval(text)
      if not isinstance(value, (tuple, list)):
        raise ValueError(text)
      return tuple(value)
  except (ValueError, SyntaxError):
    raise FitError(
        f"--config.{key}={text!r}: expected a value of type {type(current).__name__} "
        f"like the current value {current!r}"
    ) from None
  return text


def apply_overrides(config, overrides: list[tuple[str, str]]) -> None:
  """Sets ``--config.<key>=<value>`` overrides on a locked ConfigDict.

  Raises:
    FitError: an unknown key, or a value of the wrong type.
  """
  for key, text in overrides:
    *parents, last = key.split(".")
    node = config
    try:
      for part in parents:
        node = node[part]
      current = node[last]
    except (KeyError, AttributeError, TypeError):
      raise FitError(
          f"unknown config key --config.{key} (every key is listed in "
          "transformer_xl/default_config.py)"
      ) from None
    try:
      node[last] = _parse_value(text, current, key)
    except (TypeError, ValueError) as err:
      raise FitError(f"--config.{key}={text!r}: {err}") from None


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """Separates ``--config.<key>=<value>`` (or ``--config.<key> <value>``)
  from the other arguments."""
  rest, overrides, i = [], [], 0
  while i < len(argv):
    arg = argv[i]
    m = re.fullmatch(r"--config\.([\w.]+)(?:=(.*))?", arg, re.S)
    if m and m.group(2) is None and i + 1 < len(argv):
      overrides.append((m.group(1), argv[i + 1]))
      i += 2
      continue
    if m and m.group(2) is not None:
      overrides.append((m.group(1), m.group(2)))
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


@dataclasses.dataclass
class Job:
  """One config to analyse: where it comes from and on which devices."""

  spec: str  # path[:preset]
  overrides: list  # [(key, value text)]
  devices: int
  device_kind: str
  device_memory_gib: float
  vocab: int
  search: bool = True
  max_tries: int = 12
  margin: float = 0.1  # FITS below (1 - margin) x device memory

  @property
  def slice_name(self) -> str:
    """The preset (v3-32), else "N x KIND" (4 x h100) or the kind alone."""
    preset = self.spec.partition(":")[2]
    return preset or (
        f"{self.devices} x {self.device_kind}" if self.devices > 1 else self.device_kind
    )


def make_job(
    spec: str,
    overrides: list[tuple[str, str]],
    devices: int | None,
    device_kind: str | None,
    device_memory: float | None,
    vocab: int | None,
    search: bool,
    max_tries: int,
    margin: float = 0.1,
) -> Job:
  """Checks a config on its devices in this process (no compilation) and
  returns its Job.

  Raises:
    FitError: bad config, preset, override, device kind or count, or an
      invalid config for the device count (default_config.validate's message).
  """
  from transformer_xl import default_config, presets

  config = load_config(spec)
  apply_overrides(config, overrides)
  preset = spec.partition(":")[2]
  if preset and preset in presets.SLICE_DEVICES:
    kind = device_kind or preset.split("-")[0]
    n = devices or presets.SLICE_DEVICES[preset]
  else:
    kind, n = device_kind or "h100", devices or 1
  if kind not in DEVICE_MEMORY_GIB and device_memory is None:
    raise FitError(
        f"--device_kind={kind!r}: choose one of {sorted(DEVICE_MEMORY_GIB)} "
        "or give --device_memory=GiB"
    )
  if n < 1:
    raise FitError(f"--devices={n} must be >= 1")
  if not 0 <= margin < 1:
    raise FitError(f"--margin={100 * margin:g} must be in [0, 100) percent")
  try:
    default_config.validate(config, n)
  except default_config.ConfigError as err:
    raise FitError(f"{spec} on {n} device(s): " + str(err).replace("\n", " ")) from None
  sizes = vocab_sizes()
  if vocab is None and config.data.dataset not in sizes:
    raise FitError(
        f"no fixed vocabulary size is known for data.dataset="
        f"{config.data.dataset!r}; pass --vocab=N"
    )
  return Job(
      spec=spec,
      overrides=list(overrides),
      devices=n,
      device_kind=kind,
      device_memory_gib=(device_memory if device_memory is not None else DEVICE_MEMORY_GIB[kind]),
      vocab=vocab or sizes[config.data.dataset],
      search=search,
      max_tries=max_tries,
      margin=margin,
  )
