"""The run directory as one object: what a training restores from and saves to.

``RunDir`` is the training loop's only door to its workdir (the files are
listed in ``workdir.py``): it holds the lock (``lock.training_lock``) and
the orbax manager, and its two verbs are the ones the loop calls:

* ``restore(abstract_state)``: the newest usable checkpoint of the same run
  (``checkpointing.restore_latest``: damaged ones skipped,
  ``workdir.check_same_run``: a different model, corpus or batch stops the
  run before anything is compiled), or None; the workdir is not changed yet.
* ``start(restored)``: the run takes the workdir over: checkpoints found
  damaged are set aside, partial writes of an interrupted run removed,
  the verification record opened (``retention.Verification``), and
  ``config.json`` / ``model_config.json`` written.
* ``save(step, state, iterator_state)``: a verified-good write, the
  verification record, and rotation that never deletes the newest good
  checkpoint (``retention.prune``).

Readers (evaluation, scoring, generation, the Python API, the analyses)
use ``restore_params``: the parameters alone (their shapes and shardings
from ``param_shapes.py``), with no optimizer built and no optimizer state
or memory read, and no lock; nothing of ``training/`` (nor optax) is
imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath
from jax.sharding import Mesh

from transformer_xl import sharding
from transformer_xl.model import models
from transformer_xl.run import checkpointing, lock, param_shapes, retention
from transformer_xl.run import workdir as wd
from transformer_xl.util import report


class RunDir:
  """A training's workdir: its lock, checkpoints and run files.

  Use as a context manager (``with RunDir(...) as run_dir:``): entering
  takes the workdir's training lock (re-entrant: the command line takes it
  earlier, before loading the data) and opens the checkpoint manager;
  leaving closes the manager and releases the lock, whatever happened.

  Args:
    workdir: the run's directory (local or gs://).
    meta: this run's ``workdir.checkpoint_meta`` (compared with each
      checkpoint's before it is restored, and saved with each new one).
    max_to_keep: ``checkpoint.max_to_keep``.

  Raises (on entering):
    WorkdirError: another training holds the workdir.
  """

  def __init__(self, workdir: str, meta: Mapping[str, Any], max_to_keep: int):
    self.workdir = str(workdir)
    self.meta = dict(meta)
    self.max_to_keep = max_to_keep
    self.manager = None
    self.verification: retention.Verification | None = None
    self._stack = contextlib.ExitStack()

  def __enter__(self) -> RunDir:
    with contextlib.ExitStack() as stack:
      stack.enter_context(lock.training_lock(self.workdir))
      self.manager = checkpointing.make_manager(self.workdir)
      self._stack = stack.pop_all()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    try:
      if exc_type is None:
        self.manager.close()
      else:  # the error that stops the run is the one to report, not a second one here
        with contextlib.suppress(Exception):
          self.manager.close()
    finally:
      self._stack.close()

  def restore(self, abstract_state: Any) -> checkpointing.Restored | None:
    """The newest usable checkpoint of this run, restored into
    ``abstract_state`` (a pytree of jax.ShapeDtypeStruct with shardings),
    or None when there is none.  Changes nothing in the workdir.

    Raises:
      ConfigError: the checkpoints are of another model, corpus or batch.
      CheckpointError: checkpoints exist but none is usable.
    """
    return checkpointing.restore_latest(
        self.manager,
        abstract_state,
        check_meta=lambda path, saved: wd.check_same_run(self.workdir, path, saved, self.meta),
    )

  def start(
      self,
      restored: checkpointing.Restored | None,
      config: ml_collections.ConfigDict,
      model_cfg: models.ModelConfig,
  ) -> None:
    """Takes the workdir over for a run that starts from ``restored`` (None:
    from scratch): sets aside the checkpoints ``restore`` found damaged,
    opens the verification record, removes partial writes, and writes
    config.json and model_config.json (``meta``'s unit and dataset)."""
    if restored is not None:
      retention.set_aside(self.manager, self.workdir, restored.rejected)
      report.log(f"Resumed from {restored.path} at step {restored.step}.")
    self.verification = retention.Verification(
        self.workdir, self.manager, None if restored is None else restored.step
    )
    for path in retention.remove_partial_writes(self.workdir):
      report.log(f"Removed {path}, a checkpoint write that an interrupted run left unfinished.")
    wd.save_config(self.workdir, config)
    wd.save_model_config(self.workdir, model_cfg, self.meta["unit"], self.meta["dataset"])

  def save(self, step: int, state: Any, iterator_state: dict) -> None:
    """Writes checkpoint ``step`` (``checkpointing.save``: never a non-finite
    state), records the newest good checkpoint and rotates.

    Raises:
      CheckpointError: a non-finite state, or a write that failed (full
        disk, read-only); the previous checkpoints are intact.
    """
    checkpointing.save(self.manager, step, state, iterator_state, meta=self.meta)
    self.verification.write()
    retention.prune(self.manager, self.max_to_keep, keep=self.verification.newest())

  def set_aside_unverified(self, reason: str) -> list[str]:
    """Sets aside every checkpoint newer than the newest good one (a run that
    diverged), each with ``reason``; returns where they went ("deleted"
    where the file system cannot move them)."""
    return self.verification.reject_unverified(self.workdir, reason)

  @property
  def rejected_dir(self) -> epath.Path:
    """Where set-aside checkpoints go."""
    return epath.Path(self.workdir) / "checkpoints_rejected"


def restore_params(workdir: str, model_cfg: models.ModelConfig, mesh: Mesh) -> tuple[int, Any]:
  """(step, parameters) of the newest usable checkpoint in ``workdir``, on ``mesh``.

  Only the step and the parameters are read (no optimizer is built, the
  optimizer state and the training memory stay on disk) and verified
  against their fingerprints; damaged checkpoints are reported and
  skipped (``checkpointing.restore_latest``).  Nothing in the workdir is
  changed, and a training may run in it meanwhile (no lock is taken; a
  checkpoint its rotation removes while it is read is skipped).

  Raises:
    FileNotFoundError: no checkpoint.
    WorkdirError: the workdir is a file.
    ConfigError: ``model_cfg`` differs from the checkpoint's model.
    CheckpointError: checkpoints exist but none is usable.
  """
  wd.require_dir(workdir)
  directory = checkpointing.checkpoint_dir(workdir)
  if not directory.exists():
    raise FileNotFoundError(
        f"No checkpoint in {directory}: train first with the same --workdir (--mode=train)."
    )
  params, _ = param_shapes.abstract_params(models.TransformerXL(model_cfg), mesh)
  step = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(mesh))
  wanted = {"model": wd.checkpoint_meta(model_cfg, "", "", 0)["model"]}
  manager = checkpointing.make_manager(workdir, create=False)
  try:
    restored = checkpointing.restore_latest(
        manager,
        {"step": step, "params": params},
        check_meta=lambda path, meta: wd.check_same_run(workdir, path, meta, wanted),
        partial=True,
    )
  finally:
    manager.close()
  if restored is None:
    raise FileNotFoundError(
        f"No checkpoint in {manager.directory}: train first with the same --workdir (--mode=train)."
    )
  if restored.rejected:
    report.log(f"Using {restored.path} (step {restored.step}), the newest usable checkpoint.")
  return restored.step, restored.state["params"]
