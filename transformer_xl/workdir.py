"""What a run's directory holds, and the one way each file is read and written.

A workdir (a local path or gs://) holds:

  config.json         the full config of the training run (``--mode=eval``
                      and ``--mode=score`` use it when --config is omitted);
  model_config.json   the exact architecture (:class:`models.ModelConfig`
                      with n_token) and the corpus's unit and name, so that a
                      checkpoint can be used without the data;
  checkpoints/        orbax checkpoints (checkpointing.py);
  eval_results.json   the last ``--mode=eval`` results;
  metrics.jsonl, tensorboard/   training metrics (metrics.py).

Only process 0 writes.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import jax
import ml_collections
from etils import epath
from jax.sharding import Mesh

from transformer_xl import checkpointing, default_config, models, train_state


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes ``<workdir>/config.json`` (process 0)."""
  if jax.process_index() == 0:
    (epath.Path(workdir) / "config.json").write_text(config.to_json_best_effort(indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a training run saved in ``<workdir>/config.json``.

  Raises:
    FileNotFoundError: no config.json (pass --config instead).
  """
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: pass --config=configs/<name>.py, or use the "
                            "--workdir of a training run (it saves its config there).")
  config = default_config.get_config()
  config.update(json.loads(path.read_text()))
  return config


def save_model_config(workdir: str, model_cfg: models.ModelConfig, unit: str,
                      dataset: str) -> None:
  """Writes ``<workdir>/model_config.json``: the architecture (with n_token),
  the corpus unit ("byte", "char" or "word") and the dataset name (process 0)."""
  if jax.process_index() == 0:
    (epath.Path(workdir) / "model_config.json").write_text(json.dumps(
        {"model": dataclasses.asdict(model_cfg), "unit": unit, "dataset": dataset}, indent=2))


def load_model_config(workdir: str) -> tuple[models.ModelConfig, str]:
  """(ModelConfig, unit) from ``<workdir>/model_config.json``.

  Raises:
    FileNotFoundError: the workdir has no model_config.json.
  """
  path = epath.Path(workdir) / "model_config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: train (or convert) into this --workdir first.")
  saved = json.loads(path.read_text())
  return models.ModelConfig(**saved["model"]), saved["unit"]


def restore_params(config: ml_collections.ConfigDict, workdir: str,
                   model_cfg: models.ModelConfig, mesh: Mesh) -> tuple[int, Any]:
  """(step, parameters) of the latest checkpoint in ``workdir``, on ``mesh``.

  Raises:
    FileNotFoundError: no checkpoint.
  """
  tx = train_state.make_optimizer(config.train)
  abstract_state, _ = train_state.abstract_train_state(
      models.TransformerXL(model_cfg), tx, config.train.global_batch, mesh)
  manager = checkpointing.make_manager(workdir, config.checkpoint.max_to_keep)
  restored = checkpointing.restore_latest(manager, abstract_state)
  manager.close()
  if restored is None:
    raise FileNotFoundError(f"No checkpoint in {manager.directory}: train first with the same "
                            "--workdir (--mode=train).")
  step, state, _ = restored
  return step, state.params


def write_eval_results(workdir: str, results: Mapping[str, Any]) -> str:
  """Writes ``<workdir>/eval_results.json`` (process 0) and returns its path."""
  path = epath.Path(workdir) / "eval_results.json"
  if jax.process_index() == 0:
    path.write_text(json.dumps(results, indent=2, sort_keys=True))
  return str(path)
