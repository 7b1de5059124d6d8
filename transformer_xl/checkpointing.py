"""Orbax checkpoints of the whole training state, verified when restored.

A checkpoint (one orbax Composite step directory ``<workdir>/checkpoints/<step>``)
holds three items:

  state      the TrainState (parameters, optimizer state, step and the
             training memory, all global jax.Arrays, so multi-process saving
             works);
  iterator   the input iterator's position (JSON), so that a resumed run
             continues exactly where it stopped;
  integrity  (JSON) a fingerprint of every array of ``state`` and the
             ``meta`` the caller passes (the model config the checkpoint was
             made with, workdir.py).

Fingerprints are computed on the devices (:func:`fingerprint`: a uint32
hash of each array's bits, summed over the elements; no array is copied to
the host), when saving and again after restoring: a checkpoint whose files
changed, were truncated or lost a file, or that holds a non-finite value,
is reported by path and reason and the previous checkpoint is used
(:func:`restore_latest`).  A non-finite state is never saved (:func:`save`),
so ``max_to_keep`` rotation can only delete a good checkpoint in favour of
another good one.  Partial writes (``*.orbax-checkpoint-tmp*``) left by an
interrupted run are removed at the start of training
(:func:`remove_partial_writes`).

Failures are raised, never logged here; orbax logs its own (the command
line keeps them quiet unless ``--debug``: ``process_settings.configure_logging``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import os
import shutil
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec

from transformer_xl import distributed

RECORD_FORMAT = 1
_TMP_MARK = ".orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used or written; the message names the
  path, the reason and what to do."""


def checkpoint_dir(workdir: str) -> epath.Path:
  """``<workdir>/checkpoints`` (absolute for a local path; gs:// as given)."""
  directory = epath.Path(workdir) / "checkpoints"
  return directory if "://" in str(workdir) else directory.absolute()


def make_manager(workdir: str, max_to_keep: int) -> ocp.CheckpointManager:
  """CheckpointManager in ``<workdir>/checkpoints`` keeping ``max_to_keep``.

  Raises:
    ValueError: max_to_keep < 1.
  """
  if max_to_keep < 1:
    raise ValueError(f"checkpoint.max_to_keep={max_to_keep} must be >= 1.")
  # Synchronous: save() waits for the write anyway (so a crash right after
  # cannot leave a half-written latest checkpoint), and errors then surface
  # in the calling thread.
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=("state", "iterator", "integrity"))


# --------------------------------------------------------------------------- #
# Fingerprints, computed on the devices.


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 that mixes every bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _leaf_fingerprint(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(uint32 fingerprint, bool all-finite) of one array of any shape.

  Every element's bit pattern is mixed with its flat index and the results
  are summed modulo 2**32, so a changed element (one flipped bit included)
  changes the sum except with probability 2**-32, and so do two changed
  elements (unlike a plain sum or xor of the bits).  Element-wise work and
  one reduction: no reshape, so a sharded array stays where it is.
  """
  if x.dtype == jnp.bool_:
    bits = x.astype(jnp.uint32)
  elif x.dtype.itemsize == 8:
    pair = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    bits = pair[..., 0] ^ _fmix32(pair[..., 1] + jnp.uint32(0x27D4EB2F))
  else:
    utype = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, utype).astype(jnp.uint32)
  index = jnp.zeros(x.shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(x.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, dim) * jnp.uint32(
        stride % 2**32)
    stride *= x.shape[dim]
  mixed = _fmix32(bits ^ _fmix32(index + jnp.uint32(0x9E3779B9)))
  total = jnp.sum(mixed, dtype=jnp.uint32)
  finite = (jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact)
            else jnp.ones((), jnp.bool_))
  return total, finite


@functools.lru_cache(maxsize=None)
def _fingerprint_fn(out_sharding):
  def fn(leaves):
    pairs = [_leaf_fingerprint(x) for x in leaves]
    return (jnp.stack([p[0] for p in pairs]) if pairs else jnp.zeros((0,), jnp.uint32),
            jnp.stack([p[1] for p in pairs]) if pairs else jnp.zeros((0,), jnp.bool_))
  return jax.jit(fn, out_shardings=out_sharding)


def fingerprint(tree: Any) -> tuple[dict[str, int], dict[str, bool]]:
  """Fingerprints and finiteness of every array of a pytree, computed on device.

  Args:
    tree: a pytree of jax.Arrays (global arrays of one mesh, or arrays on
      one device) or numpy arrays.

  Returns:
    ({leaf path: uint32 fingerprint as int}, {leaf path: all elements finite}),
    the paths as ``jax.tree_util.keystr`` writes them (e.g.
    ``.params['word_emb']['emb_layers_0']``).  The same on every process
    (the results are replicated).
  """
  paths_leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [jax.tree_util.keystr(p) for p, _ in paths_leaves]
  leaves = [x for _, x in paths_leaves]
  mesh = next((x.sharding.mesh for x in leaves
               if isinstance(getattr(x, "sharding", None), NamedSharding)), None)
  out = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None
  fps, finite = _fingerprint_fn(out)(leaves)
  fps, finite = np.asarray(fps), np.asarray(finite)
  return ({p: int(v) for p, v in zip(paths, fps)},
          {p: bool(v) for p, v in zip(paths, finite)})


def _shape_dtype(tree: Any) -> dict[str, list]:
  return {jax.tree_util.keystr(p): [list(x.shape), str(x.dtype)]
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _nbytes(tree: Any) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


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


def _free_bytes(path: epath.Path) -> Optional[int]:
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


def _checkpoint_bytes(manager: ocp.CheckpointManager, previous: Optional[int],
                      state: Any) -> int:
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


def _write_error_kind(err: BaseException) -> Optional[str]:
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


def save(manager: ocp.CheckpointManager, step: int, state: Any, iterator_state: dict,
         meta: Optional[Mapping[str, Any]] = None, force: bool = False) -> bool:
  """Saves ``state`` (a pytree of global arrays), the iterator position and
  an integrity record (fingerprints of every array, and ``meta``).

  Waits until the write is complete, so a crash right after cannot leave a
  half-written latest checkpoint behind.  A failed write is removed again,
  so the previous checkpoint stays the latest.

  Args:
    manager: from :func:`make_manager`.
    step: the step number (the directory name).
    state: pytree of arrays (the TrainState).
    iterator_state: JSON-serialisable dict.
    meta: JSON-serialisable dict stored in the record (e.g. the model
      config; :func:`read_record` returns it).
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
    raise CheckpointError(f"Refusing to save step {step}: non-finite values in {_short(bad)}. "
                          f"The checkpoints in {manager.directory} are unchanged.")
  shapes = _shape_dtype(state)
  record = {"format": RECORD_FORMAT, "step": int(step),
            "leaves": {p: {"fingerprint": fps[p], "shape": shapes[p][0], "dtype": shapes[p][1]}
                       for p in fps},
            "meta": dict(meta or {})}
  previous = manager.latest_step()
  try:
    saved = manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(_without_empty(state)),
                                iterator=ocp.args.JsonSave(iterator_state),
                                integrity=ocp.args.JsonSave(record)),
        force=force)
    manager.wait_until_finished()
  except Exception as err:  # pylint: disable=broad-except
    kind = _write_error_kind(err)
    if kind is None:
      raise
    leftovers = [p for p in partial_writes(manager.directory)
                 if p.name.startswith(f"{step}.")]
    if jax.process_index() == 0:
      for path in leftovers:
        path.rmtree(missing_ok=True)
    need = _checkpoint_bytes(manager, previous, state)
    free = _free_bytes(manager.directory)
    space = (f" A checkpoint needs about {need / 2**20:,.1f} MiB"
             + (f"; {free / 2**20:,.1f} MiB are free there." if free is not None else "."))
    fix = ("free some space" if "space" in kind else
           "make the directory writable (or copy the workdir to a writable place)")
    intact = (f" The previous checkpoint {_step_path(manager, previous)} is intact: {fix} and "
              "run the same command again to resume from it." if previous is not None else
              f" There is no previous checkpoint: {fix} and start again.")
    raise CheckpointError(f"Could not write checkpoint {_step_path(manager, step)}: {kind}."
                          + (space if "space" in kind else "") + intact) from err
  return saved


# --------------------------------------------------------------------------- #
# Restoring, with verification and fallback.


@dataclasses.dataclass
class Restored:
  """What :func:`restore_latest` found.

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


def read_record(manager: ocp.CheckpointManager, step: int) -> Optional[dict]:
  """The integrity record saved with checkpoint ``step``.

  Returns:
    The record dict, or None when the checkpoint has no ``integrity`` item
    (written before records existed).

  Raises:
    CheckpointError: the record exists but cannot be read or parsed.
  """
  path = _step_path(manager, step) / "integrity"
  if not path.exists():
    return None
  try:
    record = json.loads((path / "metadata").read_text())
  except (OSError, ValueError) as err:
    raise CheckpointError(f"its integrity record cannot be read ({err})") from None
  if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
    raise CheckpointError("its integrity record is damaged or of an unknown format")
  return record


def _verify(state: Any, record: Optional[dict]) -> Optional[str]:
  """Why a restored state is not usable (fingerprint or finiteness), or None."""
  fps, finite = fingerprint(state)
  bad = [p for p, ok in finite.items() if not ok]
  if bad:
    return f"non-finite values in {_short(bad)}"
  if record is None:
    return None
  want = record.get("leaves", {})
  missing = sorted(set(want) ^ set(fps))
  if missing:
    return f"its arrays differ from its record ({_short(missing)})"
  changed = [p for p in fps if fps[p] != want[p]["fingerprint"]]
  if changed:
    return (f"fingerprint mismatch in {_short(changed)}: its files changed after they were "
            "written (disk or copy corruption)")
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
  return treedef.unflatten([
      r if a.size else jax.device_put(np.zeros(a.shape, a.dtype), a.sharding)
      for r, a in zip(got, leaves)])


def restore(manager: ocp.CheckpointManager, step: int,
            abstract_state: Any | Callable[[dict], Any],
            check_meta: Optional[Callable[[str, dict], None]] = None) -> Restored:
  """Restores checkpoint ``step`` and verifies it (fingerprints, finiteness).

  Args:
    manager: as :func:`restore_latest`.
    step: the checkpoint's step.
    abstract_state: as :func:`restore_latest`.
    check_meta: as :func:`restore_latest`.

  Returns:
    A :class:`Restored` (``rejected`` empty).

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
  try:
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_without_empty(abstract)),
                                      iterator=ocp.args.JsonRestore()))
  except Exception as err:  # pylint: disable=broad-except
    # Whatever orbax or tensorstore raise for a damaged checkpoint.
    raise CheckpointError(f"it cannot be read: {_first_line(err)}") from None
  state = _with_empty(restored["state"], abstract)
  reason = _verify(state, record)
  if reason is not None:
    raise CheckpointError(reason)
  return Restored(step=step, state=state,
                  iterator_state=dict(restored["iterator"] or {}), meta=meta, path=path,
                  rejected=[], verified=record is not None)


def restore_latest(manager: ocp.CheckpointManager,
                   abstract_state: Any | Callable[[dict], Any],
                   check_meta: Optional[Callable[[str, dict], None]] = None,
                   log: Callable[[str], None] = print) -> Optional[Restored]:
  """Restores the newest usable checkpoint, or returns None when there is none.

  Checkpoints are tried from the newest: each one's integrity record is
  read, ``check_meta`` may reject the whole run (e.g. a different model),
  then the state is restored and its fingerprints and finiteness verified.
  A checkpoint that fails (unreadable, truncated, a missing file, a changed
  fingerprint, a non-finite value) is reported through ``log`` with its
  path and the reason, and the previous one is tried.  With several
  processes every decision is agreed on (a checkpoint that fails on any
  process fails on all).

  Args:
    manager: from :func:`make_manager`.
    abstract_state: pytree of jax.ShapeDtypeStruct with shardings, the
      layout to restore into (so arrays land directly on their devices); or
      a function meta -> that pytree (meta = the checkpoint's ``meta``, {}
      if none).
    check_meta: called with (checkpoint path, meta) before a checkpoint is
      restored ({} for a checkpoint without a record); raises to stop (its
      exception propagates, nothing is restored).
    log: where the reports of unusable checkpoints go.

  Returns:
    A :class:`Restored`, or None when the directory holds no checkpoint.

  Raises:
    CheckpointError: there are checkpoints but none is usable; the message
      lists each with its reason.
    Exception: whatever ``check_meta`` raises.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  rejected = []
  for step in steps:
    path = str(_step_path(manager, step))
    reason, restored = None, None
    try:
      restored = restore(manager, step, abstract_state, check_meta)
    except CheckpointError as err:
      reason = str(err)
    if distributed.any_process(reason is not None):
      reason = reason or "it failed to restore on another process"
      rejected.append((path, reason))
      log(f"Checkpoint {path} is not usable: {reason}."
          + (" Trying the previous one." if step != steps[-1] else ""))
      continue
    if not restored.verified:
      log(f"Checkpoint {path} has no integrity record (written by an older version): "
          "checked for finite values only.")
    restored.rejected = rejected
    return restored
  if rejected:
    raise CheckpointError(
        f"No usable checkpoint in {manager.directory}: "
        + "; ".join(f"{p}: {r}" for p, r in rejected)
        + ". Copy back a good one if you have it, or move the directory away "
          "(e.g. mv checkpoints checkpoints.bad) to train from scratch.")
  return None


def set_aside(manager: ocp.CheckpointManager, workdir: str, paths: list[str],
              log: Callable[[str], None] = print) -> None:
  """Moves unusable checkpoints out of the manager's directory.

  They go to ``<workdir>/checkpoints_rejected/<step>`` (deleted instead
  where the file system cannot rename a directory, e.g. gs://), so that
  the run can write new checkpoints with their step numbers.  Process 0
  moves; every process then reloads the manager's list of steps.
  """
  if not paths:
    return
  if jax.process_index() == 0:
    target_dir = epath.Path(workdir) / "checkpoints_rejected"
    for path in map(epath.Path, paths):
      target = target_dir / path.name
      n = 1
      while target.exists():
        target, n = target_dir / f"{path.name}.{n}", n + 1
      try:
        target_dir.mkdir(parents=True, exist_ok=True)
        path.rename(target)
        log(f"Moved the unusable checkpoint {path} to {target} (delete it when you no "
            "longer need it).")
      except OSError as err:
        path.rmtree(missing_ok=True)
        log(f"Deleted the unusable checkpoint {path} (it could not be moved: {err}).")
  distributed.barrier("set_aside")
  manager.reload()
