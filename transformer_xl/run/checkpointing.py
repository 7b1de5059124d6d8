"""Orbax checkpoints of the whole training state: saved, restored and verified.

A checkpoint (one orbax Composite step directory ``<workdir>/checkpoints/<step>``)
holds three items:

* ``state``: the TrainState (parameters, optimizer state, step and the
  training memory, all global jax.Arrays, so multi-process saving works);
* ``iterator``: the input iterator's position (JSON), so that a resumed run
  continues exactly where it stopped;
* ``integrity`` (JSON): a fingerprint of every array of ``state`` and the
  ``meta`` the caller passes (the model config the checkpoint was made
  with, ``workdir.py``): ``integrity.py``.

A non-finite state is never saved (``save``); a failed write removes its
own partial write, so the previous checkpoint stays the latest.  The
fingerprints are checked again after restoring: a checkpoint whose files
changed, were truncated or lost a file, or that holds a non-finite value,
is reported by path and reason and the previous checkpoint is used
(``restore_latest``); a reader beside a running training skips a
checkpoint that the training's rotation removed while it was read.

Which checkpoints stay (rotation that never deletes the newest good one,
the damaged and the unverified ones set aside, partial writes of an
interrupted run removed, and ``checkpoints_verified.json``, the record of
the good ones) is ``retention.py``'s.

Failures are raised; what is skipped is reported through
``report.log`` (absl logging); orbax logs its own (the command
line keeps them quiet unless ``--debug``: ``process_settings.configure_logging``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer_xl import errors
from transformer_xl.run import distributed, integrity
from transformer_xl.util import report

_RELISTS = 5  # listings of a directory that a running training changes
PARTIAL_MARK = ".orbax-checkpoint-tmp"  # in the name of an unfinished write (orbax's)


CheckpointError = errors.CheckpointError  # re-exported (transformer_xl.errors)


def checkpoint_dir(workdir: str) -> epath.Path:
  """``<workdir>/checkpoints`` (absolute for a local path; gs:// as given)."""
  directory = epath.Path(workdir) / "checkpoints"
  return directory if "://" in str(workdir) else directory.absolute()


def make_manager(workdir: str, create: bool = True) -> ocp.CheckpointManager:
  """CheckpointManager of ``<workdir>/checkpoints``.

  Orbax keeps every checkpoint: rotation is ``retention.prune``'s, which never
  deletes the newest verified checkpoint (``retention.Verification``) and
  deletes by renaming first, so that a reader beside a running training
  sees a checkpoint whole or not at all.  Orbax's own
  ``preservation_policy`` and deleter do not give that: the policy is
  fixed when the manager is made (the newest verified step moves as the
  run goes) and the deleter unlinks a checkpoint's files in place; its
  ``cleanup_tmp_directories`` removes partial writes silently, where
  ``retention.remove_partial_writes`` names each one.

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
  a training's rotation (``retention.prune``) removes in between raises
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


def _nbytes(tree: Any) -> int:
  return sum(
      int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
  )


# --------------------------------------------------------------------------- #
# Saving.


def step_path(manager: ocp.CheckpointManager, step: int) -> epath.Path:
  """The directory of checkpoint ``step``: ``<workdir>/checkpoints/<step>``."""
  return manager.directory / str(step)


def partial_writes(directory: epath.Path) -> list[epath.Path]:
  """The unfinished orbax writes (``*.orbax-checkpoint-tmp*``) in ``directory``."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir() if PARTIAL_MARK in p.name)


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
    for root, _, files in os.walk(str(step_path(manager, previous))):
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
      config; ``integrity.read_record`` returns it).
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
  try:
    record = integrity.make_record(state, step, meta)
  except CheckpointError as err:
    raise CheckpointError(
        f"Refusing to save step {step}: {err}. "
        f"The checkpoints in {manager.directory} are unchanged."
    ) from None
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
        f" The previous checkpoint {step_path(manager, previous)} is intact: {fix} and "
        "run the same command again to resume from it."
        if previous is not None
        else f" There is no previous checkpoint: {fix} and start again."
    )
    raise CheckpointError(
        f"Could not write checkpoint {step_path(manager, step)}: {kind}."
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
  path = str(step_path(manager, step))
  record = integrity.read_record(step_path(manager, step))
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
  reason = integrity.verify(state, record, partial)
  if reason is not None:
    raise CheckpointError(reason)
  saved = state.get("step") if isinstance(state, dict) else getattr(state, "step", None)
  if saved is not None and int(jax.device_get(saved)) != step:
    raise CheckpointError(
        f"its folder names step {step} but its state is step {int(jax.device_get(saved))} "
        "(a renamed or copied folder)"
    )
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
  training's rotation removed it while it was read, ``retention.prune``) is
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
      path = str(step_path(manager, step))
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
