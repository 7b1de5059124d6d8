"""Atomic file writes: the one way the package replaces a small file.

Every JSON record, config and result file the package rewrites in place
(``config.json``, ``model_config.json``, ``eval_results.json``,
``checkpoints_verified.json``, ``metrics.jsonl`` when cleaned, the lock's
holder record, a text corpus's ``tokenizer.json``, the release
``checksums.json``, a converted vocabulary, ``--out`` files) goes through
``write_text_atomic``: the text is written to a temporary file with a name
of its own (process, thread and a random part) in the same directory and
renamed over the target, so that a reader sees the old file or the new
one, never half of one, and two writers of the same file (two evaluations
of one workdir) never take each other's temporary file.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

from etils import epath


def temporary_name(path: epath.PathLike) -> epath.Path:
  """A temporary path beside ``path``, unique to this call:
  ``.<name>.<pid>.<thread>.<random>.tmp``."""
  path = epath.Path(path)
  return path.parent / (
      f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:12]}.tmp"
  )


def write_bytes_atomic(path: epath.PathLike, data: bytes) -> None:
  """``write_text_atomic`` for bytes (e.g. a .npy file)."""
  path = epath.Path(path)
  tmp = temporary_name(path)
  try:
    tmp.write_bytes(data)
    tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink()
    raise


def write_text_atomic(path: epath.PathLike, text: str, encoding: str = "utf-8") -> None:
  """Replaces ``path`` with ``text`` atomically (local file systems; on gs://
  the rename is a copy, still never a half-written target).

  Args:
    path: the file to write (its directory must exist).
    text: the whole new content.
    encoding: of ``text``.

  Raises:
    OSError: the directory cannot be written (the target is unchanged, and
      the temporary file removed).
  """
  path = epath.Path(path)
  tmp = temporary_name(path)
  try:
    tmp.write_text(text, encoding=encoding)
    tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink()
    raise
