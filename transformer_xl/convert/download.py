"""Downloads of the released models' files: resumed, retried, checksummed.

``fetch`` downloads a URL through ``<dest>.part``, resuming it with an
HTTP Range request; ``Records`` keeps the SHA-256 and size of each file
at its first download (``checksums.json``), against which every later use is
checked (``matches``).  Used by ``transformer_xl.convert.pretrained``.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from transformer_xl.convert.errors import ConvertError, describe, log

CHECKSUMS_FILE = "checksums.json"
CHUNK = 1 << 20
TRIES = 3


def sha256_of(path: Path) -> str:
  """Hex SHA-256 of a file, read in 1 MiB chunks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return h.hexdigest()


class Records:
  """``downloads/<name>/checksums.json``: file -> {"sha256", "size", "url", "recorded"}."""

  def __init__(self, directory: Path):
    self.path = directory / CHECKSUMS_FILE
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
    self._write()

  def drop(self, rel: str) -> None:
    if self.files.pop(rel, None) is not None:
      self._write()

  def _write(self) -> None:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = self.path.with_name(f".{self.path.name}.tmp")
    tmp.write_text(json.dumps({"files": self.files}, indent=2, sort_keys=True))
    tmp.replace(self.path)


def matches(path: Path, record: dict | None) -> tuple[bool, str, int]:
  """(file equals its record, its sha256, its size); no record: (True, ...)."""
  size = path.stat().st_size
  if record is not None and size != record["size"]:
    return False, "", size
  sha = sha256_of(path)
  return record is None or sha == record["sha256"], sha, size


def fetch(url: str, dest: Path, *, progress: bool = True, tries: int = TRIES) -> None:
  """Downloads ``url`` to ``dest`` through ``<dest>.part``, resuming.

  A ``.part`` left by an interrupted run, or by a try that ended early (a
  dropped connection, fewer bytes than the server's Content-Length), is
  continued with an HTTP ``Range`` request; a server that ignores the range
  (status 200) or refuses it (416) gets a fresh download.  ``dest`` appears
  (atomically renamed) only when complete.

  Raises:
    ConvertError: no complete file after ``tries`` tries, or the server
      says the file does not exist (404); the message names the URL.
  """
  dest.parent.mkdir(parents=True, exist_ok=True)
  part = dest.with_name(dest.name + ".part")
  last = "no try"
  for attempt in range(tries):
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
      with urllib.request.urlopen(request, timeout=60) as resp:
        resumed = have > 0 and resp.status == 206
        if not resumed:
          have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        with (
            open(part, "ab" if resumed else "wb") as f,
            _bar(dest.name, total, have, progress) as bar,
        ):
          while chunk := resp.read(CHUNK):
            f.write(chunk)
            bar.update(len(chunk))
      size = part.stat().st_size
      if total is not None and size < total:
        last = f"the connection ended after {size:,} of {total:,} bytes"
      else:
        part.replace(dest)
        return
    except urllib.error.HTTPError as err:
      if err.code == 416:  # the .part is not a prefix the server recognises: start again
        part.unlink(missing_ok=True)
        last = "the server refused to resume (HTTP 416)"
        continue
      if err.code in (403, 404, 410):
        raise ConvertError(
            f"{url}: HTTP {err.code} {err.reason}; the release is not at this "
            "address (download its files by hand and pass --manual_dir)."
        ) from None
      last = f"HTTP {err.code} {err.reason}"
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
      last = describe(getattr(err, "reason", err))
    if attempt + 1 < tries:
      log(
          f"  {dest.name}: {last}; trying again ({attempt + 2} of {tries}, "
          f"{part.stat().st_size if part.exists() else 0:,} bytes kept)."
      )
      time.sleep(0.5 * (attempt + 1))
  raise ConvertError(
      f"cannot download {url} ({last}, {tries} tries); check the network, run "
      f"again to resume, or download it by hand and pass --manual_dir."
  )


def _bar(name: str, total: int | None, initial: int, enabled: bool):
  import tqdm

  return tqdm.tqdm(
      total=total,
      initial=initial,
      unit="B",
      unit_scale=True,
      unit_divisor=1024,
      desc=name,
      file=sys.stderr,
      disable=not enabled,
      leave=False,
  )
