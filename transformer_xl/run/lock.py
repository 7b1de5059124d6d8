"""One training at a time per workdir: ``training_lock``.

Two trainings in one workdir would interleave their metrics and overwrite
each other's checkpoints and config.json, so a training holds
``<workdir>/train.lock`` while it runs.  Two files:

* ``train.lock``: the lock itself, an exclusive ``flock`` taken through
  ``filelock.FileLock``.  The kernel releases it when its holder ends,
  however it ends (kill -9 included).  The file stays after a release
  (filelock keeps it, so that every taker locks the same inode); its
  contents mean nothing.
* ``train.lock.json``: the holder's record, ``{"host", "pid", "started"}``,
  written (through a rename) once the lock is held and removed before it
  is released.  A second training reads it to name the holder.  A record
  found by the one that just took the lock was left by a holder that ended
  without releasing it (kill -9, a crash, a lost machine): it is replaced,
  with a note naming that holder (``report.log``).

Readers (eval, score, generate, the Python API) take no lock: they can run
beside a training.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
from collections.abc import Iterator

import filelock
import jax

from transformer_xl import errors
from transformer_xl.run import distributed
from transformer_xl.util import files, report

LOCK_FILE = "train.lock"
RECORD_SUFFIX = ".json"  # the holder's record: train.lock.json
# lock path -> [the FileLock (process 0; None on the others), depth]: the locks this process holds
_HELD: dict[str, list] = {}


def _holder(record: str) -> str:
  """The holder named by a record's text, for a message."""
  try:
    h = json.loads(record)
    return f"pid {h['pid']} on host {h['host']}, started {h['started']}"
  except (ValueError, KeyError, TypeError):
    return "a process that left no details"


def _read(path: str) -> str:
  """The text of ``path``; "" if there is none."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read(4096)
  except OSError:
    return ""


def _write_record(path: str) -> None:
  """Writes this process's record to ``path`` through a temporary file and a
  rename, so that a reader never sees half of it."""
  started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
  record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": started})
  files.write_text_atomic(path, record + "\n")


def _acquire(path: str) -> tuple[filelock.BaseFileLock | None, str]:
  """(the held lock, the record a previous holder left, "" if none) or
  (None, the holder's record) when another process holds ``path``."""
  record_path = path + RECORD_SUFFIX
  # No soft fallback: a lock file that outlives a killed holder would have to be removed by hand.
  lock = filelock.FileLock(path, timeout=0, thread_local=False, fallback_to_soft=False)
  try:
    lock.acquire()
  except filelock.Timeout:
    return None, _read(record_path)
  try:
    previous = _read(record_path)
    _write_record(record_path)
  except BaseException:
    lock.release()
    raise
  return lock, previous


def _release(lock: filelock.BaseFileLock) -> None:
  """Removes the record, then releases the lock (in this order: a record
  beside a free lock means a holder that did not release it)."""
  try:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(lock.lock_file + RECORD_SUFFIX)
  finally:
    lock.release()


@contextlib.contextmanager
def training_lock(workdir: str) -> Iterator[None]:
  """Holds ``<workdir>/train.lock``, so that one training at a time writes a workdir.

  The lock is exclusive, taken at once or not at all (no waiting), and
  released by the kernel when its holder ends however it ends (kill -9
  included).  ``<workdir>/train.lock.json`` records the holder's host, PID
  and start time for the message of a refused training.  A lock left by a
  holder that is gone is taken over, with a note (``report.log``) naming it.
  Re-entrant within a process (the command line takes it before loading
  data, ``train.train_and_evaluate`` again).  With several processes,
  process 0 holds it and all agree (``distributed.any_process``): all go
  on or all raise.  On a non-local workdir (gs://) there is no lock: run
  one training per workdir yourself.

  Args:
    workdir: the --workdir (created if it does not exist).

  Raises:
    WorkdirError: another training holds the lock (the message names it).
    OSError: the lock file cannot be created or locked (e.g. a file system
      without ``flock``).
  """
  if "://" in str(workdir):
    yield
    return
  path = os.path.realpath(os.path.join(str(workdir), LOCK_FILE))
  if path in _HELD:
    _HELD[path][1] += 1
    try:
      yield
    finally:
      _HELD[path][1] -= 1
    return
  lock, record = None, ""
  if jax.process_index() == 0:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock, record = _acquire(path)
  if distributed.any_process(jax.process_index() == 0 and lock is None):
    where = _holder(record) if jax.process_index() == 0 else "see process 0's message"
    raise errors.WorkdirError(
        f"--workdir={workdir} is in use by another training ({where}; lock {path}): two "
        "trainings in one workdir would mix their checkpoints and metrics. Wait for it to "
        "end or stop it (SIGTERM or Ctrl-C: it saves a checkpoint first), or use another "
        "--workdir. Evaluating, scoring and generating need no lock and can run beside it."
    )
  _HELD[path] = [lock, 1]  # on every process, so that the nested calls agree
  if lock is not None and record.strip():
    report.log(
        f"Took over {path} from a training that ended without releasing it ({_holder(record)})."
    )
  try:
    yield
  finally:
    del _HELD[path]
    if lock is not None:
      _release(lock)
