"""Orbax checkpoints of the whole training state, verified when restored.

A checkpoint (one orbax Composite step directory ``<workdir>/checkpoints/<step>``)
holds three items:

* ``state``: the TrainState (parameters, optimizer state, step and the
  training memory, all global jax.Arrays, so multi-process saving works);
* ``iterator``: the input iterator's position (JSON), so that a resumed run
  continues exactly where it stopped;
* ``integrity`` (JSON): a fingerprint of every array of ``state`` and the
  ``meta`` the caller passes (the model config the checkpoint was made
  with, ``workdir.py``).

Fingerprints are computed on the devices (``fingerprints.fingerprint``: a uint32
hash of each array's bits, summed over the elements; no array is copied to
the host), when saving and again after restoring: a checkpoint whose files
changed, were truncated or lost a file, or that holds a non-finite value,
is reported by path and reason and the previous checkpoint is used
(``restore_latest``); a reader beside a running training skips a
checkpoint that the training's rotation removed while it was read.

A non-finite state is never saved (``save``), and a checkpoint counts
as good only once a step computed from it was finite
(``Verification``, recorded in ``<workdir>/checkpoints_verified.json``):
when a run diverges, the checkpoints after the newest good one are set
aside (``set_aside``, to ``checkpoints_rejected/`` with their reason),
and rotation (``prune``, ``checkpoint.max_to_keep``) never deletes the
newest good one.  Partial writes (``*.orbax-checkpoint-tmp*``) left by an
interrupted run are removed at the start of training
(``remove_partial_writes``); a failed write removes its own
(``save``).

Failures are raised; what is skipped or moved is reported through
``report.log`` (absl logging); orbax logs its own (the command
line keeps them quiet unless ``--debug``: ``process_settings.configure_logging``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer_xl import errors
from transformer_xl.run import distributed
from transformer_xl.run.fingerprints import fingerprint
from transformer_xl.util import files, report

RECORD_FORMAT = 1
_RELISTS = 5  # listings of a directory that a running training changes
_TMP_MARK = ".orbax-checkpoint-tmp"


CheckpointError = errors.CheckpointError  # re-exported (transformer_xl.errors)


def checkpoint_dir(workdir: str) -> epath.Path:
  """``<workdir>/checkpoints`` (absolute for a local path; gs:// as given)."""
  directory = epath.Path(workdir) / "checkpoints"
  return directory if "://" in str(workdir) else directory.absolute()


def make_manager(workdir: str, create: bool = True) -> ocp.CheckpointManager:
  """CheckpointManager of ``<workdir>/checkpoints``.

  Orbax keeps every checkpoint: rotation is ``prune``'s, which never
  deletes the newest verified checkpoint (``Verification``) and
  deletes by renaming first, so that a reader beside a running training
  sees a checkpoint whole or not at all.  Orbax's own
  ``preservation_policy`` and deleter do not give that: the policy is
  fixed when the manager is made (the newest verified step moves as the
  run goes) and the deleter unlinks a checkpoint's files in place; its
  ``cleanup_tmp_directories`` removes partial writes silently, where
  ``remove_partial_writes`` names each one.

  Args:
    workdir: the run's directory (local or gs://).
    create: create the directory (training); readers pass False.
  """
  # Synchronous: save() waits for the write anyway (so a crash right after
  # cannot leave a half-written latest checkpoint), and errors then surface
  # in the calling thread.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=None, create=create, enable_async_checkpointing=False
  )
  return _listing(
      lambda: ocp.CheckpointManager(
          checkpoint_dir(workdir), options=options, item_names=("state", "iterator", "integrity")
      )
  )


_LISTING_TRIES = 20  # of listing a checkpoint directory while a training rotates it


def _listing(list_steps: Callable[[], Any]) -> Any:
  """``list_steps()`` (a manager's creation or ``reload``), again if a step vanished.

  Orbax lists the step directories, then reads each one's metadata; one that
  a training's rotation (``prune``) removes in between raises
  FileNotFoundError (or NotADirectoryError), which says nothing about the
  rest: list again (up to ``_LISTING_TRIES`` times, 50 ms apart).
  """
  for attempt in range(_LISTING_TRIES):
    try:
      return list_steps()
    except (FileNotFoundError, NotADirectoryError):
      if attempt == _LISTING_TRIES - 1:
        raise
      time.sleep(0.05)


def reload(manager: ocp.CheckpointManager) -> None:
  """``manager.reload()`` that tolerates a training's rotation (``_listing``)."""
  _listing(manager.reload)


def _shape_dtype(tree: Any) -> dict[str, list]:
  return {
      jax.tree_util.keystr(p): [list(x.shape), str(x.dtype)]
      for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _nbytes(tree: Any) -> int:
  return sum(
      int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
  )


def _short(names: list[str], n: int = 3) -> str:
  more = f" and {len(names) - n} more" if len(names) > n else ""
  return ", ".join(names[:n]) + more


# --------------------------------------------------------------------------- #
# Saving.


def _step_path(manager: ocp.CheckpointManager, step: int) -> epath.Path:
  return manager.directory / str(step)


def partial_writes(directory: epath.Path) -> list[epath.Path]:
  """The unfinished orbax writes (``*.orbax-checkpoint-tmp*``) in ``directory``."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir() if _TMP_MARK in p.name)


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


def _free_bytes(path: epath.Path) -> int | None:
  """Free bytes on the file system of a local ``path`` (None for gs:// or unknown)."""
  if "://" in str(path):
    return None
  path = epath.Path(path)
  while not path.exists() and path != path.parent:
    path = path.parent
  try:
    return shutil.disk_usage(str(path)).free
  except OSError:
    return None


def _checkpoint_bytes(manager: ocp.CheckpointManager, previous: int | None, state: Any) -> int:
  """Bytes a checkpoint takes: the previous one's size on a local disk, else
  twice the state's (orbax keeps a per-process copy of the data beside the
  merged one)."""
  if previous is not None and "://" not in str(manager.directory):
    total = 0
    for root, _, files in os.walk(str(_step_path(manager, previous))):
      for name in files:
        with contextlib.suppress(OSError):
          total += os.path.getsize(os.path.join(root, name))
    if total:
      return total
  return 2 * _nbytes(state)


def _write_error_kind(err: BaseException) -> str | None:
  """A user-fixable write failure (full disk, read-only, no permission), or None."""
  chain, e = [], err
  while e is not None and len(chain) < 10:
    chain.append(e)
    e = e.__cause__ or e.__context__
  for e in chain:
    code = getattr(e, "errno", None)
    text = str(e).lower()
    if code in (errno.ENOSPC, errno.EDQUOT) or "no space left" in text or "quota" in text:
      return "no space left on the device"
    if code == errno.EROFS or "read-only file system" in text:
      return "the file system is read-only"
    if code in (errno.EACCES, errno.EPERM) or "permission denied" in text:
      return "permission denied"
  return None


def _remove_failed_write(
    manager: ocp.CheckpointManager, step: int, settle_s: float = 0.5, limit_s: float = 30.0
) -> None:
  """Removes what a failed write of ``step`` left, once orbax stopped writing.

  When one array's write fails, orbax raises while the writes of the other
  arrays (tensorstore's threads) may still be creating files in the
  partial directory, which would bring it back after a removal.  So: wait
  for the manager's background work, then remove the partial directories
  until none has reappeared for ``settle_s`` seconds (at most ``limit_s``).
  Process 0 removes; every process waits.
  """
  with contextlib.suppress(Exception):
    manager.wait_until_finished()
  if jax.process_index() == 0:
    start = last_seen = time.monotonic()
    while time.monotonic() - last_seen < settle_s and time.monotonic() - start < limit_s:
      leftovers = [p for p in partial_writes(manager.directory) if p.name.startswith(f"{step}.")]
      for path in leftovers:
        with contextlib.suppress(OSError):
          path.rmtree(missing_ok=True)
      if leftovers:
        last_seen = time.monotonic()
      time.sleep(0.05)
  distributed.barrier("remove_failed_write")


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    iterator_state: dict,
    meta: Mapping[str, Any] | None = None,
    force: bool = False,
) -> bool:
  """Saves ``state`` (a pytree of global arrays), the iterator position and
  an integrity record (fingerprints of every array, and ``meta``).

  Waits until the write is complete, so a crash right after cannot leave a
  half-written latest checkpoint behind.  A failed write is removed again,
  so the previous checkpoint stays the latest.

  Args:
    manager: from ``make_manager``.
    step: the step number (the directory name).
    state: pytree of arrays (the TrainState).
    iterator_state: JSON-serialisable dict.
    meta: JSON-serialisable dict stored in the record (e.g. the model
      config; ``read_record`` returns it).
    force: save even if the manager's policy would skip this step.

  Returns:
    Whether a checkpoint was written (the manager skips a step that is not
    newer than the latest one).

  Raises:
    CheckpointError: ``state`` holds a non-finite value (nothing is
      written), or the write failed for a reason the user can fix (a full
      disk, a read-only file system, no permission): the message names the
      path, the space needed and the intact previous checkpoint.
  """
  fps, finite = fingerprint(state)
  bad = [p for p, ok in finite.items() if not ok]
  if bad:
    raise CheckpointError(
        f"Refusing to save step {step}: non-finite values in {_short(bad)}. "
        f"The checkpoints in {manager.directory} are unchanged."
    )
  shapes = _shape_dtype(state)
  record = {
      "format": RECORD_FORMAT,
      "step": int(step),
      "leaves": {
          p: {"fingerprint": fps[p], "shape": shapes[p][0], "dtype": shapes[p][1]} for p in fps
      },
      "meta": dict(meta or {}),
  }
  previous = manager.latest_step()
  try:
    saved = manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(_without_empty(state)),
            iterator=ocp.args.JsonSave(iterator_state),
            integrity=ocp.args.JsonSave(record),
        ),
        force=force,
    )
    manager.wait_until_finished()
  except Exception as err:  # pylint: disable=broad-except
    kind = _write_error_kind(err)
    if kind is None:
      raise
    _remove_failed_write(manager, step)
    need = _checkpoint_bytes(manager, previous, state)
    free = _free_bytes(manager.directory)
    space = f" A checkpoint needs about {need / 2**20:,.1f} MiB" + (
        f"; {free / 2**20:,.1f} MiB are free there." if free is not None else "."
    )
    fix = (
        "free some space"
        if "space" in kind
        else "make the directory writable (or copy the workdir to a writable place)"
    )
    intact = (
        f" The previous checkpoint {_step_path(manager, previous)} is intact: {fix} and "
        "run the same command again to resume from it."
        if previous is not None
        else f" There is no previous checkpoint: {fix} and start again."
    )
    raise CheckpointError(
        f"Could not write checkpoint {_step_path(manager, step)}: {kind}."
        + (space if "space" in kind else "")
        + intact
    ) from err
  return saved


# --------------------------------------------------------------------------- #
# Restoring, with verification and fallback.


@dataclasses.dataclass
class Restored:
  """What ``restore_latest`` found.

  Attributes:
    step: the restored step.
    state: the restored pytree (on the devices of ``abstract_state``).
    iterator_state: the saved iterator position ({} if none).
    meta: the ``meta`` dict saved with the checkpoint ({} for a checkpoint
      without an integrity record).
    path: the checkpoint's directory.
    rejected: [(path, reason)] of newer checkpoints that were not usable.
    verified: whether fingerprints were checked (False for a checkpoint
      without an integrity record: finiteness only).
  """

  step: int
  state: Any
  iterator_state: dict
  meta: dict
  path: str
  rejected: list
  verified: bool = True


def _written_with_record(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether checkpoint ``step`` was written with an integrity record: orbax's
  own step metadata (``_CHECKPOINT_METADATA``) lists the items it saved; a
  checkpoint of a version before records lists no ``integrity``."""
  try:
    saved = json.loads((_step_path(manager, step) / "_CHECKPOINT_METADATA").read_text())
  except (OSError, ValueError):
    return False
  return "integrity" in (saved.get("item_handlers") or {})


def read_record(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The integrity record saved with checkpoint ``step``.

  Returns:
    The record dict, or None for a checkpoint written before records
    existed (orbax's step metadata lists no ``integrity`` item).

  Raises:
    CheckpointError: the record cannot be read or parsed, or it is missing
      although the checkpoint was written with one (deleted or lost: the
      checkpoint cannot be verified, so it is not used).
  """
  path = _step_path(manager, step) / "integrity"
  if not (path / "metadata").exists():
    if _written_with_record(manager, step):
      raise CheckpointError(
          "its integrity record is missing (it was written with one, which "
          "was deleted or lost), so its files cannot be verified"
      )
    return None
  try:
    record = json.loads((path / "metadata").read_text())
  except (OSError, ValueError) as err:
    raise CheckpointError(f"its integrity record cannot be read ({err})") from None
  if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
    raise CheckpointError("its integrity record is damaged or of an unknown format")
  return record


def _as_recorded(path: str, recorded: Mapping[str, Any]) -> str:
  """A leaf path of a partial restore (a dict of the state's fields,
  ``['params']['crit']...``) as the record spells it when the saved state
  was a dataclass (``.params['crit']...``)."""
  if path in recorded:
    return path
  return re.sub(r"^\['([A-Za-z_]\w*)'\]", r".\1", path)


def _verify(state: Any, record: dict | None, partial: bool = False) -> str | None:
  """Why a restored state is not usable (fingerprint or finiteness), or None.

  With ``partial`` the state holds some of the saved fields only: those
  leaves are checked against their fingerprints, the others not read."""
  fps, finite = fingerprint(state)
  bad = [p for p, ok in finite.items() if not ok]
  if bad:
    return f"non-finite values in {_short(bad)}"
  if record is None:
    return None
  want = record.get("leaves", {})
  if partial:
    fps = {_as_recorded(p, want): v for p, v in fps.items()}
    missing = sorted(set(fps) - set(want))
  else:
    missing = sorted(set(want) ^ set(fps))
  if missing:
    return f"its arrays differ from its record ({_short(missing)})"
  changed = [p for p in fps if fps[p] != want[p]["fingerprint"]]
  if changed:
    return (
        f"fingerprint mismatch in {_short(changed)}: its files changed after they were "
        "written (disk or copy corruption)"
    )
  return None


def _first_line(err: BaseException) -> str:
  text = str(err).strip().splitlines()
  line = text[0] if text else ""
  if len(line) > 300:
    line = line[:300] + "..."
  return f"{type(err).__name__}: {line}" if line else type(err).__name__


def _without_empty(tree: Any) -> Any:
  """``tree`` with its zero-size arrays (the memory of a model without
  recurrence, mem_len 0) replaced by None: orbax cannot save them."""
  return jax.tree_util.tree_map(lambda x: None if x.size == 0 else x, tree)


def _with_empty(restored: Any, abstract: Any) -> Any:
  """Puts the zero-size arrays of ``abstract`` back where ``restored`` has None."""
  leaves, treedef = jax.tree_util.tree_flatten(abstract)
  got = jax.tree_util.tree_flatten(restored, is_leaf=lambda x: x is None)[0]
  return treedef.unflatten(
      [
          r if a.size else jax.device_put(np.zeros(a.shape, a.dtype), a.sharding)
          for r, a in zip(got, leaves)
      ]
  )


def restore(
    manager: ocp.CheckpointManager,
    step: int,
    abstract_state: Any | Callable[[dict], Any],
    check_meta: Callable[[str, dict], None] | None = None,
    partial: bool = False,
) -> Restored:
  """Restores checkpoint ``step`` and verifies it (fingerprints, finiteness).

  Args:
    manager: as ``restore_latest``.
    step: the checkpoint's step.
    abstract_state: as ``restore_latest``.
    check_meta: as ``restore_latest``.
    partial: as ``restore_latest``.

  Returns:
    A ``Restored`` (``rejected`` empty).

  Raises:
    CheckpointError: the checkpoint is not usable on this process; the
      message is the reason (unreadable record, a file that cannot be read
      or is missing, a changed fingerprint, a non-finite value).
    Exception: whatever ``check_meta`` raises.
  """
  path = str(_step_path(manager, step))
  record = read_record(manager, step)
  meta = (record or {}).get("meta", {})
  if check_meta is not None:
    check_meta(path, meta)
  abstract = abstract_state(meta) if callable(abstract_state) else abstract_state
  if partial:  # orbax reads only the arrays named in ``abstract``
    state_args = ocp.args.PyTreeRestore(
        item=abstract,
        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=True,
    )
  else:
    state_args = ocp.args.StandardRestore(_without_empty(abstract))
  try:
    restored = manager.restore(
        step, args=ocp.args.Composite(state=state_args, iterator=ocp.args.JsonRestore())
    )
  except Exception as err:  # pylint: disable=broad-except
    # Whatever orbax or tensorstore raise for a damaged checkpoint.
    raise CheckpointError(f"it cannot be read: {_first_line(err)}") from None
  state = restored["state"] if partial else _with_empty(restored["state"], abstract)
  reason = _verify(state, record, partial)
  if reason is not None:
    raise CheckpointError(reason)
  return Restored(
      step=step,
      state=state,
      iterator_state=dict(restored["iterator"] or {}),
      meta=meta,
      path=path,
      rejected=[],
      verified=record is not None,
  )


def restore_latest(
    manager: ocp.CheckpointManager,
    abstract_state: Any | Callable[[dict], Any],
    check_meta: Callable[[str, dict], None] | None = None,
    partial: bool = False,
) -> Restored | None:
  """Restores the newest usable checkpoint, or returns None when there is none.

  Checkpoints are tried from the newest: each one's integrity record is
  read, ``check_meta`` may reject the whole run (e.g. a different model),
  then the state is restored and its fingerprints and finiteness verified.
  A checkpoint that fails (unreadable, truncated, a missing file, a changed
  fingerprint, a non-finite value) is reported (``report.log``) with
  its path and the reason, and the previous one is tried.

  A reader may run beside a training of the same workdir: after a failure
  the directory is listed again, and a checkpoint that is gone (the
  training's rotation removed it while it was read, ``prune``) is
  skipped with a note, not reported as damaged; checkpoints that appeared
  meanwhile are tried too.  With several processes every decision is
  agreed on (a checkpoint that fails on any process fails on all).

  Args:
    manager: from ``make_manager``.
    abstract_state: pytree of jax.ShapeDtypeStruct with shardings, the
      layout to restore into (so arrays land directly on their devices); or
      a function meta -> that pytree (meta = the checkpoint's ``meta``, {}
      if none).
    check_meta: called with (checkpoint path, meta) before a checkpoint is
      restored ({} for a checkpoint without a record); raises to stop (its
      exception propagates, nothing is restored).
    partial: ``abstract_state`` is a dict of some of the saved state's
      top-level fields (e.g. ``{"step": ..., "params": ...}``): only their
      arrays are read (and verified against their fingerprints), the rest
      (the optimizer state, the memory) is not; the restored state is that
      dict.

  Returns:
    A ``Restored``, or None when the directory holds no checkpoint.

  Raises:
    CheckpointError: there are checkpoints but none is usable; the message
      lists each with its reason (and changes nothing).
    Exception: whatever ``check_meta`` raises.
  """
  rejected, tried = [], set()
  for _ in range(_RELISTS):
    steps = [s for s in sorted(manager.all_steps(), reverse=True) if s not in tried]
    if not steps:
      break
    for step in steps:
      tried.add(step)
      path = str(_step_path(manager, step))
      reason, restored = None, None
      try:
        restored = restore(manager, step, abstract_state, check_meta, partial)
      except CheckpointError as err:
        reason = str(err)
      if distributed.any_process(reason is not None):
        reload(manager)
        if distributed.any_process(step not in manager.all_steps()):
          report.log(
              f"Checkpoint {path} was removed while it was read (the rotation of a training "
              "running in this workdir); trying the next one."
          )
          continue
        reason = reason or "it failed to restore on another process"
        rejected.append((path, reason))
        report.log(f"Checkpoint {path} is not usable: {reason}. Trying the previous one.")
        continue
      if not restored.verified:
        report.log(
            f"Checkpoint {path} has no integrity record (written by an older version): "
            "checked for finite values only."
        )
      restored.rejected = rejected
      return restored
    reload(manager)
  if rejected:
    raise CheckpointError(
        f"No usable checkpoint in {manager.directory}: "
        + "; ".join(f"{p}: {r}" for p, r in rejected)
        + ". Nothing was changed. Copy back a good checkpoint if you have one, or train from "
        "scratch with a new --workdir (these checkpoints stay where they are)."
    )
  return None


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
      path = _step_path(manager, step)
      gone = path.parent / f"{path.name}{_TMP_MARK}-deleted"
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
    return f"{_step_path(self._manager, step)} (step {step})"

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
        [(str(_step_path(self._manager, s)), reason) for s in newer],
    )
