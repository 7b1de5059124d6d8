"""Which checkpoints stay: rotation, setting aside, partial writes, the verified record.

A checkpoint (``checkpointing.save``) counts as good only once a step
computed from it was finite (``Verification``, recorded in
``<workdir>/checkpoints_verified.json``).  Both ways a checkpoint leaves
the directory go by it:

* rotation (``prune``, ``checkpoint.max_to_keep``) deletes the oldest
  checkpoints but never the newest good one, renaming each to a
  partial-write name first, so that a reader beside a running training
  sees a checkpoint whole or not at all;
* when a run diverges, the checkpoints after the newest good one are set
  aside (``Verification.reject_unverified``, ``set_aside``: to
  ``checkpoints_rejected/`` with their reason), as are the damaged ones
  that ``checkpointing.restore_latest`` skipped.

Partial writes (``*.orbax-checkpoint-tmp*``) left by an interrupted run are
removed at the start of training (``remove_partial_writes``).  Process 0
deletes and moves; every process waits for it and reloads the manager's
list of steps.  What is deleted or moved is reported through
``report.log``.
"""

from __future__ import annotations

import json

import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer_xl.run import distributed
from transformer_xl.run.checkpointing import PARTIAL_MARK, checkpoint_dir, partial_writes, step_path
from transformer_xl.util import files, report


def remove_partial_writes(workdir: str) -> list[str]:
  """Deletes the partial checkpoint writes an interrupted run left behind.

  Process 0 deletes, every process waits for it (call on all processes).
  Call only where no other run is writing checkpoints into ``workdir``
  (training; not evaluation, which may run beside a training run).

  Returns:
    The deleted paths (the same list on every process).
  """
  found = [str(p) for p in partial_writes(checkpoint_dir(workdir))]
  if found and jax.process_index() == 0:
    for path in found:
      epath.Path(path).rmtree(missing_ok=True)
  distributed.barrier("remove_partial_writes")
  return found


def set_aside(
    manager: ocp.CheckpointManager,
    workdir: str,
    rejected: list[tuple[str, str]],
) -> list[str]:
  """Moves checkpoints out of the manager's directory, each with its reason.

  They go to ``<workdir>/checkpoints_rejected/<step>`` (deleted instead
  where the file system cannot rename a directory, e.g. gs://), with the
  reason in ``reason.txt`` beside their files, so that the run can write
  new checkpoints with their step numbers and a user can still inspect (or
  move back) what was set aside.  Process 0 moves; every process then
  reloads the manager's list of steps.

  Args:
    rejected: [(checkpoint path, reason)].

  Returns:
    Where each one went (its new path, or "deleted").
  """
  if not rejected:
    return []
  went = []
  if jax.process_index() == 0:
    target_dir = epath.Path(workdir) / "checkpoints_rejected"
    for path, reason in rejected:
      path = epath.Path(path)
      target = target_dir / path.name
      n = 1
      while target.exists():
        target, n = target_dir / f"{path.name}.{n}", n + 1
      try:
        target_dir.mkdir(parents=True, exist_ok=True)
        path.rename(target)
        (target / "reason.txt").write_text(reason + "\n")
        went.append(str(target))
        report.log(
            f"Moved the checkpoint {path} to {target} ({reason}; delete it when you no longer "
            "need it)."
        )
      except OSError as err:
        path.rmtree(missing_ok=True)
        went.append("deleted")
        report.log(f"Deleted the checkpoint {path} ({reason}; it could not be moved: {err}).")
  distributed.barrier("set_aside")
  manager.reload()
  return went


def prune(manager: ocp.CheckpointManager, max_to_keep: int, keep: int | None = None) -> list[int]:
  """Deletes all but the newest ``max_to_keep`` checkpoints and ``keep``.

  A checkpoint is renamed to a partial-write name first (atomic on a local
  file system), then deleted: a reader listing the directory meanwhile
  never sees half of one, and a run killed in between leaves a partial
  write that the next training removes (``remove_partial_writes``).
  Process 0 deletes; every process reloads the list.

  Args:
    max_to_keep: how many of the newest checkpoints stay (``checkpoint.max_to_keep``).
    keep: a step that stays whatever its age (the newest verified
      checkpoint, ``Verification``), or None.

  Returns:
    The deleted steps.

  Raises:
    ValueError: max_to_keep < 1.
  """
  if max_to_keep < 1:
    raise ValueError(f"checkpoint.max_to_keep={max_to_keep} must be >= 1.")
  steps = sorted(manager.all_steps(), reverse=True)
  doomed = [s for s in steps[max_to_keep:] if s != keep]
  if doomed and jax.process_index() == 0:
    for step in doomed:
      path = step_path(manager, step)
      gone = path.parent / f"{path.name}{PARTIAL_MARK}-deleted"
      path.rename(gone)
      gone.rmtree(missing_ok=True)
  if doomed:
    distributed.barrier("prune")
    manager.reload()
  return doomed


VERIFIED_FILE = "checkpoints_verified.json"


class Verification:
  """Which checkpoints are known good: a checkpoint is good only once a
  step computed from its parameters had a finite loss and gradient norm,
  or a validation of them was finite.

  ``params_good(step)`` records that the parameters after ``step`` were
  used that way; since a skipped non-finite step leaves the parameters as
  they were, every checkpoint at or before the largest such step is good
  (``step``).  The newest good checkpoint is recorded in
  ``<workdir>/checkpoints_verified.json`` (process 0, atomically, when it
  changes), so that a resumed run knows whether the checkpoint it starts
  from is good.  Checkpoints after ``step`` are the ones a divergence
  sets aside (``reject_unverified``); rotation keeps the newest good one
  (``prune``).

  Args:
    workdir: the run's directory.
    manager: its checkpoint manager.
    restored: the step the run resumed from (None: a fresh start, which
      removes an earlier run's record).  It counts as good if the record
      says so; without a record (a workdir of a version before records)
      the checkpoints before it do, as the run that wrote it computed steps
      from them.
  """

  def __init__(self, workdir: str, manager: ocp.CheckpointManager, restored: int | None):
    self._path = epath.Path(workdir) / VERIFIED_FILE
    self._manager = manager
    recorded = None
    try:
      recorded = int(json.loads(self._path.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
      pass
    if restored is None:  # a fresh start: a record left by an earlier run says nothing now
      self.step = -1
    elif recorded is None:
      self.step = restored - 1
    else:
      self.step = min(restored, recorded)
    self._written = recorded
    self.write()  # the record now says what this run counts as good

  def params_good(self, step: int) -> None:
    """The parameters after ``step`` gave a finite loss and gradient (or validation)."""
    self.step = max(self.step, step)

  def newest(self) -> int | None:
    """The newest good checkpoint's step (None: none is known good)."""
    good = [s for s in self._manager.all_steps() if s <= self.step]
    return max(good) if good else None

  def describe(self) -> str:
    """The newest good checkpoint, for a message."""
    step = self.newest()
    if step is None:
      return (
          "none yet (no checkpoint has had a finite step computed from it); the same "
          "command starts from scratch"
      )
    return f"{step_path(self._manager, step)} (step {step})"

  def write(self) -> None:
    """Records the newest good checkpoint if it changed (process 0; no
    record when none is good)."""
    step = self.newest()
    if step == self._written:
      return
    if jax.process_index() == 0:
      if step is None:
        self._path.unlink(missing_ok=True)
      else:
        files.write_text_atomic(self._path, json.dumps({"step": step}) + "\n")
    self._written = step

  def reject_unverified(self, workdir: str, reason: str) -> list[str]:
    """Sets aside (``set_aside``) every checkpoint newer than the newest
    good one, with ``reason``; returns where they went."""
    newer = sorted(s for s in self._manager.all_steps() if s > self.step)
    return set_aside(
        self._manager,
        workdir,
        [(str(step_path(self._manager, s)), reason) for s in newer],
    )
