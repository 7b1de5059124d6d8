"""A workdir back out: its latest checkpoint as a reference state dict
(``python -m transformer_xl.convert --to=pytorch|safetensors``)."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError, one_line
from transformer_xl.convert.hparams import hparams_from_model_config
from transformer_xl.convert.pytorch import (
    save_state_dict,
    state_dict_format,
    state_dict_from_params,
)
from transformer_xl.convert.workdir_io import (
    check_creatable,
    check_safetensors_name,
    one_device_mesh,
)
from transformer_xl.util import files
from transformer_xl.util.report import log


def _exists(flag: str, path: str, what: str = "") -> str:
  """The message refusing to replace the existing output ``path`` of ``flag``."""
  return (
      f"{flag}={path} already exists{' ' + what if what else ''}; pass --overwrite to "
      "replace it, or choose another path."
  )


def _json_or_none(path: str) -> Any:
  """The parsed JSON file at ``path``; None if it cannot be read or parsed."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError, RecursionError):
    return None


def export_pytorch(
    workdir: str,
    checkpoint: str,
    hparams_path: str | None = None,
    layout: str = "reference",
    cluster_order: str = "auto",
    to: str = "pytorch",
    overwrite: bool = False,
) -> dict:
  """``--to=pytorch|safetensors``: the latest checkpoint of a workdir as a reference state dict.

  Args:
    workdir: a training (or converted) workdir with config.json,
      model_config.json and checkpoints.
    checkpoint: output file, in its extension's format
      (``save_state_dict``): ``.npz``, ``.safetensors`` (metadata
      ``{"format": "pt"}``, float32 tensors) or else a torch file.
    hparams_path: output JSON of the constructor arguments
      (``hparams_from_model_config``); default ``<checkpoint without
      extension>.hparams.json``.
    layout: see ``state_dict_from_params``.
    cluster_order: see ``state_dict_from_params``.
    to: "pytorch" (any of the formats) or "safetensors" (``checkpoint``
      must end in ``.safetensors``).
    overwrite: replace an existing ``checkpoint``, or an existing
      ``hparams_path`` that holds other hparams (one with the same hparams
      is rewritten: several exports of one model share it).  Otherwise
      refused before the checkpoint is restored.  Both are written under
      a temporary name and renamed, so an interrupted export leaves a file
      that was there as it was.

  Returns:
    {"step", "tensors", "hparams_path"}.

  Raises:
    ConvertError: missing or damaged workdir files or checkpoint; output
      paths that cannot be written or (without ``overwrite``) already
      exist, a ``checkpoint`` that does not end in
      ``.safetensors`` with to="safetensors", or a torch (safetensors)
      output without torch (safetensors) installed (all checked before
      the restore).
  """
  import jax

  from transformer_xl import default_config
  from transformer_xl.run import checkpointing, run_dir
  from transformer_xl.run import workdir as wd

  if to not in ("pytorch", "safetensors"):
    raise ConvertError(f"--to={to!r}: use pytorch or safetensors.")
  if to == "safetensors":
    check_safetensors_name("--to", checkpoint)
  fmt = state_dict_format(checkpoint)
  if fmt == "torch" and importlib.util.find_spec("torch") is None:
    raise ConvertError(
        f"writing the torch file {checkpoint} needs torch; use a .npz or .safetensors path."
    )
  if fmt == "safetensors" and importlib.util.find_spec("safetensors") is None:
    raise ConvertError(
        f"writing the safetensors file {checkpoint} needs the safetensors "
        "package (pip install safetensors); or use a .npz path."
    )
  hparams_path = hparams_path or os.path.splitext(checkpoint)[0] + ".hparams.json"
  for flag, path in (("--checkpoint", checkpoint), ("--hparams", hparams_path)):
    if os.path.isdir(path):
      raise ConvertError(f"{flag}={path} is a directory; pass the path of the file to write.")
    if flag == "--checkpoint" and os.path.lexists(path) and not overwrite:
      raise ConvertError(_exists(flag, path))
    check_creatable(path, flag, file=True)
  if not os.path.isdir(workdir) and "://" not in workdir:
    raise ConvertError(
        f"--workdir={workdir} is not a directory; pass the workdir of a "
        "training run or of a conversion."
    )
  errors = (FileNotFoundError, wd.WorkdirError, checkpointing.CheckpointError)
  try:
    wd.load_config(workdir)  # a damaged config.json stops the export too
    cfg, _ = wd.load_model_config(workdir)
  except errors as err:
    raise ConvertError(one_line(err)) from None
  hparams = hparams_from_model_config(cfg)
  if not overwrite and os.path.lexists(hparams_path) and _json_or_none(hparams_path) != hparams:
    raise ConvertError(_exists("--hparams", hparams_path, "with other hparams"))
  try:
    step, params = run_dir.restore_params(workdir, cfg, one_device_mesh())
  except (*errors, default_config.ConfigError) as err:
    raise ConvertError(one_line(err)) from None
  params = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params)
  state = state_dict_from_params(params, cfg, layout, cluster_order)
  save_state_dict(state, checkpoint)
  files.write_text_atomic(hparams_path, json.dumps(hparams, indent=2))
  log(
      f"Wrote {len(state)} tensors of step {step} to {checkpoint} ({layout} names) and the "
      f"hparams to {hparams_path}."
  )
  return {"step": int(step), "tensors": len(state), "hparams_path": hparams_path}
