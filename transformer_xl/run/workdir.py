"""What a run's directory holds, and the one way each file is read and written.

A workdir (a local path or gs://) holds:

* ``config.json``: the full config of the training run (``--mode=eval``
  and ``--mode=score`` use it when --config is omitted);
* ``model_config.json``: the exact architecture (``ModelConfig`` with
  n_token) and the corpus's unit and name, so that a checkpoint can be used
  without the data;
* ``checkpoints/``: orbax checkpoints (``checkpointing.py``), each with the
  same information as model_config.json in its record
  (``checkpoint_meta``);
* ``checkpoints_rejected/``: checkpoints found damaged when a run resumed,
  or saved after the last good one when a run diverged (each with its
  reason.txt);
* ``checkpoints_verified.json``: the newest checkpoint known good
  (``retention.Verification``);
* ``train.lock`` and ``train.lock.json``: held by the training running
  in it, if any, and its holder's record (``run/lock.py``,
  ``lock.training_lock``);
* ``eval_results.json``: the last ``--mode=eval`` results;
* ``metrics.jsonl``, ``tensorboard/``: training metrics (``metrics.py``).

config.json and model_config.json are written only once a run has
restored its checkpoint or initialised a fresh state (a run that stops
before, e.g. because its model differs from the checkpoint's, leaves the
workdir as it was).  Only process 0 writes these files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from etils import epath

from transformer_xl import default_config, errors
from transformer_xl.model import config as model_config_lib
from transformer_xl.model import memory, models, tuning
from transformer_xl.run import metrics
from transformer_xl.util import files

WorkdirError = errors.WorkdirError  # re-exported (transformer_xl.errors)


def _atomic_write(path: epath.Path, text: str) -> None:
  """Writes ``text`` to ``path`` atomically (``files.write_text_atomic``): a
  killed run never leaves a half-written file, two writers never share a
  temporary file."""
  files.write_text_atomic(path, text)


def require_dir(workdir: str) -> epath.Path:
  """``workdir`` as a path, which must not be a file.

  Raises:
    WorkdirError: it is an existing file.
  """
  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise WorkdirError(
        f"--workdir={workdir} is a file, not a directory: pass a directory "
        "(it is created if it does not exist)."
    )
  return path


def check_writable(workdir: str) -> None:
  """Makes sure ``workdir`` is (or can be made) a directory this process can write.

  Creates it if needed, then writes and deletes a small probe file (every
  process: each writes its own checkpoint shards).

  Raises:
    WorkdirError: a file, a read-only file system, no permission.
  """
  path = require_dir(workdir)
  probe = path / f".txl_write_test.{jax.process_index()}.{os.getpid()}"
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe.write_text("")
    probe.unlink()
  except OSError as err:
    reason = err.strerror or str(err)
    raise WorkdirError(
        f"--workdir={workdir} cannot be written ({reason}): pass a directory "
        "on a writable file system that you have permission to write to."
    ) from err


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes ``<workdir>/config.json`` (process 0): the config, without the
  memory variants' sections that hold their defaults (``memory.without_defaults``;
  ``load_config`` fills them in again)."""
  if jax.process_index() == 0:
    saved = json.loads(config.to_json_best_effort())
    saved["model"] = memory.without_defaults(saved["model"])
    saved["eval"] = memory.without_defaults(saved["eval"], eval_fields=True)
    _atomic_write(epath.Path(workdir) / "config.json", json.dumps(saved, indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a training run saved in ``<workdir>/config.json``.

  Raises:
    FileNotFoundError: no config.json (pass --config instead).
    WorkdirError: the workdir is a file, or config.json is damaged or has
      keys this version does not know (written by a newer version).
  """
  path = require_dir(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(
        f"{path} does not exist: pass --config=configs/<name>.py, or use the "
        "--workdir of a training run (it saves its config there)."
    )
  config = default_config.get_config()
  try:
    raw = json.loads(path.read_text())
    missing = [k for k in ("model", "data") if not isinstance(raw, dict) or k not in raw]
    if missing:  # every training writes them: the file lost them, no default stands in
      raise ValueError(f"it has no {' and no '.join(repr(k) for k in missing)} section")
    saved = default_config.without_legacy_keys(raw)
    known = config.to_dict()
    unknown = model_config_lib.unknown_keys(saved, known)
    config.update(model_config_lib.known_only(saved, known))
  except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
    raise WorkdirError(
        f"{path} is damaged ({err}): pass --config=configs/<name>.py with the "
        "run's settings instead."
    ) from None
  if unknown:  # valid but for keys this version does not know
    raise WorkdirError(model_config_lib.newer_version_message(path, unknown))
  return config


def save_model_config(workdir: str, model_cfg: models.ModelConfig, unit: str, dataset: str) -> None:
  """Writes ``<workdir>/model_config.json``: the architecture (with n_token;
  the memory variants' sections that are not their defaults), the corpus
  unit ("byte", "char", "word" or "subword") and the dataset name (process
  0)."""
  if jax.process_index() == 0:
    model = memory.without_defaults(model_cfg.to_dict())
    _atomic_write(
        epath.Path(workdir) / "model_config.json",
        json.dumps({"model": model, "unit": unit, "dataset": dataset}, indent=2),
    )


def load_model_config(workdir: str) -> tuple[models.ModelConfig, str]:
  """(ModelConfig, unit) from ``<workdir>/model_config.json``.

  Raises:
    FileNotFoundError: the workdir has no model_config.json.
    WorkdirError: the workdir is a file, or model_config.json is damaged or
      has model keys this version does not know (written by a newer version).
  """
  path = require_dir(workdir) / "model_config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: train (or convert) into this --workdir first.")
  try:
    saved = json.loads(path.read_text())
    missing = [k for k in ("model", "unit") if not isinstance(saved, dict) or k not in saved]
    if missing:
      raise ValueError(f"it has no {' and no '.join(repr(k) for k in missing)} section")
    unit = saved["unit"]
    return models.ModelConfig.from_dict(saved["model"]), unit
  except model_config_lib.UnknownKeysError as err:
    raise WorkdirError(model_config_lib.newer_version_message(path, err.keys)) from None
  except (ValueError, KeyError, TypeError, RecursionError) as err:  # Recursion: nested too deep
    raise WorkdirError(f"{path} is damaged ({err}).") from None


def checkpoint_meta(
    model_cfg: models.ModelConfig,
    unit: str,
    dataset: str,
    global_batch: int,
    mem_backprop_depth: int | None = None,
) -> dict:
  """What a checkpoint records about the run that made it (JSON-serialisable):
  the model config (with n_token; the memory variants' sections that are
  not their defaults), the corpus's unit and name, the training batch (the
  rows of the saved memory) and, from a training run, its
  ``train.mem_backprop_depth`` (the saved memory is the one before the
  window of that many segments and the newest one)."""
  meta = {
      "model": memory.without_defaults(model_cfg.to_dict()),
      "unit": unit,
      "dataset": dataset,
      "global_batch": int(global_batch),
  }
  if mem_backprop_depth is not None:
    meta["mem_backprop_depth"] = int(mem_backprop_depth)
  return json.loads(json.dumps(meta))


def _same_meaning(model: Mapping[str, Any] | None) -> dict:
  """Model fields with equivalent spellings made equal: d_embed None, 0 and
  d_model all mean "no projection" (models.ModelConfig.embed_dim); the
  memory variants' settings as dotted keys, those of earlier versions'
  flat keys included (``model_config.flat_fields``)."""
  model = model_config_lib.flat_fields(model, complete=True)
  if "d_embed" in model and model["d_embed"] in (None, 0, model.get("d_model")):
    model["d_embed"] = 0
  return model


def run_differences(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
  """How a run's ``checkpoint_meta`` differs from a checkpoint's.

  Compared: every model field but ``tuning.FREE_MODEL_KEYS`` (the same
  parameters and results, computed with another speed/memory trade-off),
  and, where both have them, the dataset (unless one is "converted", the
  converter's name for no particular corpus), ``train.global_batch`` and
  ``train.mem_backprop_depth`` (recorded since 2026-11-28).  Eval settings, the
  number of steps, the learning-rate schedule, the mesh may all differ.

  Returns:
    One line per differing key, e.g. "the workdir was trained with
    model.d_model=128; this run asks for 64"; [] if none.
  """
  lines = []
  saved_model, wanted_model = map(_same_meaning, (saved.get("model"), wanted.get("model")))
  for key in sorted(set(saved_model) | set(wanted_model)):
    if key in tuning.FREE_MODEL_KEYS or key not in saved_model or key not in wanted_model:
      continue
    a, b = saved_model[key], wanted_model[key]
    if (list(a) if isinstance(a, (list, tuple)) else a) != (
        list(b) if isinstance(b, (list, tuple)) else b
    ):
      name = "model.n_token (the vocabulary size)" if key == "n_token" else f"model.{key}"
      lines.append(f"the workdir was trained with {name}={a!r}; this run asks for {b!r}")
  for key, name in (
      ("dataset", "data.dataset"),
      ("global_batch", "train.global_batch"),
      ("mem_backprop_depth", "train.mem_backprop_depth"),
  ):
    if key == "dataset" and "converted" in (saved.get(key), wanted.get(key)):
      continue  # a converted checkpoint of no particular corpus (convert/workdir_io.py)
    if key in saved and key in wanted and saved[key] != wanted[key]:
      why = (
          " (the saved memory is the one before a window of that depth: another depth "
          "would read segments twice or skip them)"
          if key == "mem_backprop_depth"
          else ""
      )
      lines.append(
          f"the workdir was trained with {name}={saved[key]!r}; this run asks for "
          f"{wanted[key]!r}{why}"
      )
  return lines


def check_same_run(
    workdir: str, checkpoint: str, saved: Mapping[str, Any], wanted: Mapping[str, Any]
) -> None:
  """Stops a run whose model (or data, or batch) differs from a checkpoint's.

  Args:
    workdir: the --workdir.
    checkpoint: the checkpoint's path (for the message).
    saved: the checkpoint's ``checkpoint_meta``; {} for a checkpoint
      without one (then ``<workdir>/model_config.json`` is compared, if any).
    wanted: this run's ``checkpoint_meta`` (keys it lacks are not compared).

  Raises:
    default_config.ConfigError: listing every differing key with both values.
  """
  if not saved:
    path = epath.Path(workdir) / "model_config.json"
    try:
      saved = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
      saved = {}
  lines = run_differences(saved, wanted)
  if lines:
    raise default_config.ConfigError(
        f"--workdir={workdir} holds checkpoints of a different model ({checkpoint}):\n  - "
        + "\n  - ".join(lines)
        + f"\nRun with the workdir's settings (they are in {epath.Path(workdir) / 'config.json'}),"
        " or use a new --workdir for the new model. Nothing in the workdir was changed."
    )


EVAL_RESULTS = "eval_results.json"
DYNAMIC_EVAL_RESULTS = "eval_results_dynamic.json"  # dynamic evaluation's, beside the static


def write_eval_results(workdir: str, results: Mapping[str, Any], name: str = EVAL_RESULTS) -> str:
  """Writes ``<workdir>/<name>`` (``EVAL_RESULTS``, or ``DYNAMIC_EVAL_RESULTS``;
  process 0; strict JSON, non-finite values as null listed under
  "nonfinite") and returns its path."""
  path = epath.Path(workdir) / name
  if jax.process_index() == 0:
    _atomic_write(path, metrics.dumps(results, indent=2, sort_keys=True))
  return str(path)
