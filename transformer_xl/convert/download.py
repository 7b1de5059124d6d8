"""The released models' checksums, recorded at their first download.

The release publishes none, so ``Records`` keeps the SHA-256 and size of
each file at its first download (``checksums.json``), against which every
later use is checked (``matches``).  Used by
``transformer_xl.convert.pretrained``; the download itself (resumed,
retried) is ``transformer_xl.data.download.fetch``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.data.download import sha256_of
from transformer_xl.util import files

CHECKSUMS_FILE = "checksums.json"


class Records:
  """``downloads/<name>/checksums.json``: file -> {"sha256", "size", "url", "recorded"}.

  Args:
    directory: ``downloads/<name>``.
    deferred: new records are kept in memory until ``commit`` (the
      conversion of a release commits them once its files have passed every
      check: a file that fails one is never recorded as the release's).
  """

  def __init__(self, directory: Path, deferred: bool = False):
    self.path = directory / CHECKSUMS_FILE
    self.deferred = deferred
    self.files: dict[str, dict] = {}
    if self.path.exists():
      try:
        self.files = dict(json.loads(self.path.read_text())["files"])
      except (ValueError, KeyError, TypeError) as err:
        raise ConvertError(
            f"{self.path} is damaged ({describe(err)}); delete it to record "
            "the release's checksums again at the next download."
        ) from None

  def get(self, rel: str) -> dict | None:
    return self.files.get(rel)

  def put(self, rel: str, sha: str, size: int, url: str) -> None:
    self.files[rel] = {
        "sha256": sha,
        "size": size,
        "url": url,
        "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if not self.deferred:
      self._write()

  def commit(self) -> None:
    """Writes the records kept by a ``deferred`` instance."""
    self._write()

  def drop(self, rel: str) -> None:
    if self.files.pop(rel, None) is not None:
      self._write()

  def _write(self) -> None:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text_atomic(self.path, json.dumps({"files": self.files}, indent=2, sort_keys=True))


def matches(path: Path, record: dict | None) -> tuple[bool, str, int]:
  """(file equals its record, its sha256, its size); no record: (True, ...)."""
  size = path.stat().st_size
  if record is not None and size != record["size"]:
    return False, "", size
  sha = sha256_of(path)
  return record is None or sha == record["sha256"], sha, size
