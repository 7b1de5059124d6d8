"""A training run that starts from another workdir's parameters
(``train.init_from``): fine-tuning, e.g. giving a trained model a kNN
memory (Wu et al. 2022, "Memorizing Transformers", Sec. 4.4: a pretrained
model learns to use a memory in a short fine-tuning).

When the run's own workdir has no checkpoint yet, the parameters of the
newest usable checkpoint of ``train.init_from`` (ours, or a converted
release) replace the fresh ones of the same name; the parameters the
source lacks (e.g. the kNN memory's gate and scale) keep their
initialisation, and the optimizer starts afresh at step 0.  The models
must agree on every field that gives the parameters their meaning; the
memory and the way the model is run may differ (``FREE``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from transformer_xl import default_config
from transformer_xl.model import memory, models
from transformer_xl.model.config import flat_fields
from transformer_xl.run import run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import train_state
from transformer_xl.util import report

# Model fields that may differ from the source's: the memory (and its
# variants' sections), the segments, dropout and how the model is computed.
FREE = (
    "memory",
    "tgt_len",
    "mem_len",
    "ext_len",
    "clamp_len",
    "same_length",
    "dropout",
    "dropatt",
    "dtype",
    "remat",
    "attn_block",
    "scan_unroll",
    "attention_impl",
)


def model_problems(source: models.ModelConfig, cfg: models.ModelConfig) -> list[str]:
  """The fields of ``cfg`` (this run) that must equal ``source``'s (the
  ``train.init_from`` workdir's) and do not; one message each."""
  a, b = flat_fields(source.to_dict(), complete=True), flat_fields(cfg.to_dict(), complete=True)
  a["d_embed"], b["d_embed"] = source.embed_dim, cfg.embed_dim  # 0, None and d_model alike
  free = lambda key: key in FREE or key.partition(".")[0] in memory.VARIANTS
  return [
      f"model.{key}={b.get(key)!r} differs from the train.init_from model's {a.get(key)!r} "
      "(only the memory, the segments, dropout and how the model is computed may differ)."
      for key in sorted(set(a) | set(b))
      if not free(key) and a.get(key) != b.get(key)
  ]


def _name(path: Any) -> str:
  """A parameter's name, e.g. ``layers/attn/knn_gate_bias``."""
  return "/".join(str(getattr(k, "key", k)) for k in path)


def _by_path(tree: Any) -> dict[str, Any]:
  return {_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_source(source: str, workdir: str) -> None:
  """``train.init_from`` names another run than this one's ``workdir``.

  Raises:
    default_config.ConfigError: ``source`` is ``workdir`` itself (the same
      path, however written).
  """
  if source and os.path.realpath(os.path.expanduser(source)) == os.path.realpath(
      os.path.expanduser(workdir)
  ):
    raise default_config.ConfigError(
        f"train.init_from={source} is this run's own --workdir: init_from starts a new run "
        "from another run's parameters; give that run's directory (a run resumes from its "
        "own checkpoints without it: drop train.init_from)."
    )


def initial_state(
    config: Any, model: models.TransformerXL, tx: Any, mesh: Mesh, shardings: Any, unit: str
) -> train_state.TrainState:
  """The step-0 state of a new run: fresh parameters, those of
  ``config.train.init_from``'s newest usable checkpoint in their place where
  it has them.

  Raises:
    default_config.ConfigError: the source is not a trained workdir, its
      model differs in a field that is not free, its corpus's unit differs,
      or it has parameters this model lacks or of another shape.
    checkpointing.CheckpointError: its checkpoints exist but none is usable.
  """
  tcfg = config.train
  source = tcfg.get("init_from", "")
  if not source:
    return train_state.create_train_state(
        model, tx, tcfg.global_batch, mesh, jax.random.PRNGKey(tcfg.seed), shardings
    )
  try:
    source_cfg, source_unit = wd.load_model_config(source)
  except (FileNotFoundError, wd.WorkdirError) as err:
    raise default_config.ConfigError(f"train.init_from={source}: {err}") from None
  problems = model_problems(source_cfg, model.config)
  if source_unit != unit:
    problems.append(
        f"train.init_from={source} was trained on {source_unit} units, this corpus has {unit} "
        "units: use a workdir of the same corpus."
    )
  if problems:
    raise default_config.ConfigError("; ".join(problems))
  try:
    step, loaded = run_dir.restore_params(source, source_cfg, mesh)
  except FileNotFoundError as err:
    raise default_config.ConfigError(f"train.init_from={source}: {err}") from None
  fresh = train_state.create_train_state(
      model, tx, tcfg.global_batch, mesh, jax.random.PRNGKey(tcfg.seed), shardings
  )
  new, old = _by_path(fresh.params), _by_path(loaded)
  extra = sorted(set(old) - set(new))
  bad = [p for p in old if p in new and np.shape(old[p]) != np.shape(new[p])]
  if extra or bad:
    what = f"parameters this model lacks: {', '.join(extra[:4])}" if extra else ""
    what += ("; " if what else "") + (
        f"parameters of another shape: {', '.join(bad[:4])}" if bad else ""
    )
    raise default_config.ConfigError(
        f"train.init_from={source} has {what} (a different model: init_from takes the same "
        "model, or one with parameters added, such as a memory's gate)."
    )
  leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh.params)
  params = jax.tree_util.tree_unflatten(
      treedef,
      [old.get(_name(p), x).astype(x.dtype) for p, x in leaves],
  )
  added = sorted(set(new) - set(old))
  report.log(
      f"Starting from {source} (step {step}): {len(old)} parameter arrays loaded"
      + (f", {len(added)} new: {', '.join(added)}" if added else "")
      + "; the optimizer starts afresh."
  )
  return train_state.create_train_state(
      model, tx, tcfg.global_batch, mesh, state_shardings=shardings, params=params
  )
