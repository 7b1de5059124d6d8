"""A release's files: taken from ``--manual_dir`` or the cache, downloaded, checksummed.

``release_files`` gives the directory that holds a release's files, each
taken from ``--manual_dir`` (used in place, never downloaded into) or from
the cache (``$TRANSFORMER_XL_CACHE``, default ``~/.cache/transformer_xl``,
under ``downloads/<name>/``: ``cache_root``), downloading what is missing
(``transformer_xl.data.download.fetch``: a ``<file>.part`` resumed with an
HTTP range request, three tries); a download that fails says how to use
``--manual_dir`` instead.

The release publishes no checksum, so ``Records`` keeps the SHA-256 and
size of each file at its first download (``checksums.json``), against
which every later use is checked (``matches``): a cached file that no
longer matches is fetched again, a file of ``--manual_dir`` that does not
is refused.  Used by ``transformer_xl.convert.pretrained`` (and
``hub.py``, for the Hub's files given by ``--manual_dir``).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.releases import Release
from transformer_xl.data.download import DownloadError, fetch, sha256_of
from transformer_xl.util import files
from transformer_xl.util.report import log

CACHE_ENV = "TRANSFORMER_XL_CACHE"
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


def cache_root(cache_dir: str | None = None) -> Path:
  """``cache_dir``, else ``$TRANSFORMER_XL_CACHE``, else ``~/.cache/transformer_xl``."""
  return Path(
      cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "transformer_xl"
  ).expanduser()


def slug(name: str) -> str:
  """A directory name for a release name (Hub names have a "/")."""
  return name.replace("/", "--")


def release_files(
    rel: Release,
    cache_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    progress: bool = True,
    records: Records | None = None,
) -> Path:
  """The directory that holds ``rel.files``, each verified (see the module docstring).

  Args:
    rel: the release.
    cache_dir: see ``cache_root``; downloads go to ``<cache>/downloads/<name>``.
    manual_dir: a directory with the release's files (used in place, never
      downloaded into); checked against the recorded checksums.
    download: may download missing files (``False``: cached files only).
    progress: show a progress bar per download.
    records: the release's checksum records (default: read from, and new
      ones written at once to, ``<cache>/downloads/<name>/checksums.json``;
      ``convert_release`` passes deferred ones that it commits only once
      the files have passed its checks).

  Returns:
    ``manual_dir`` or the download directory.

  Raises:
    ConvertError: missing files that cannot be downloaded (every one named
      with its URL and recorded checksum), a file of ``manual_dir`` that
      differs from its record, a download that fails.
  """
  downloads = cache_root(cache_dir) / "downloads" / rel.name
  records = Records(downloads) if records is None else records
  base = Path(manual_dir).expanduser() if manual_dir else downloads
  missing = []
  for name in rel.files:
    path, url, record = base / name, f"{rel.url}/{name}", records.get(name)
    if path.exists():
      ok, sha, size = matches(path, record)
      if ok:
        if record is None:
          records.put(name, sha, size, url)
          log(f"  {path}: {size:,} bytes, sha256 {sha} (recorded in {records.path}).")
        continue
      if manual_dir:
        raise ConvertError(
            f"{path} differs from the {name} recorded at its first download "
            f"({describe_record(record)}); replace it with the release's file "
            f"from {url}, or delete {records.path} if the record is wrong."
        )
      log(
          f"  {path} differs from its record ({describe_record(record)}): "
          + ("fetching it again." if download else "removed (downloads are off).")
      )
      path.unlink()
    if manual_dir or not download:
      missing.append((name, url, record))
      continue
    _download_checked(url, path, name, records, progress)
  if missing:
    where = f"--manual_dir={manual_dir}" if manual_dir else f"{downloads} (downloads are off)"
    listed = "; ".join(f"{n} from {u} ({describe_record(r)})" for n, u, r in missing)
    raise ConvertError(
        f"release {rel.name}: {len(missing)} of its files missing in {where}: {listed}. "
        "Put each at that path (relative to the directory), or allow downloads."
    )
  return base


def _download_checked(url: str, path: Path, name: str, records: Records, progress: bool) -> None:
  """Downloads one file; against its record if any (a mismatch: one fresh download more)."""
  record = records.get(name)
  for attempt in range(2):
    log(f"Downloading {url}")
    _fetch(url, path, progress)
    ok, sha, size = matches(path, record)
    if ok:
      if record is None:
        records.put(name, sha, size, url)
        log(
            f"  {name}: {size:,} bytes, sha256 {sha}.  First download: recorded in "
            f"{records.path} and verified on every later use; compare it with a copy you "
            "trust."
        )
      return
    path.unlink()
    if attempt == 0:
      log(
          f"  {name}: {size:,} bytes, sha256 {sha or '(size differs)'} is not the recorded "
          f"{describe_record(record)}: downloading it again."
      )
  raise ConvertError(
      f"{url} does not match its record ({describe_record(record)}) after two "
      f"downloads: the file on the server changed or the network corrupts it; "
      f"delete {records.path} only if you trust the new file."
  )


def _fetch(url: str, path: Path, progress: bool) -> None:
  """``fetch`` (resumed, retried), its failure phrased with the way out (--manual_dir).

  Raises:
    ConvertError: the file is not at ``url`` (HTTP 403, 404, 410), or no
      complete file after the tries; the message names the URL.
  """
  try:
    fetch(url, path, progress=progress)
  except DownloadError as err:
    if err.status in (403, 404, 410):
      raise ConvertError(
          f"{url}: {err.reason}; the release is not at this "
          "address (download its files by hand and pass --manual_dir)."
      ) from None
    tries = f"{err.tries} tr{'y' if err.tries == 1 else 'ies'}"
    raise ConvertError(
        f"cannot download {url} ({err.reason}, {tries}); check the network, run "
        "again to resume, or download it by hand and pass --manual_dir."
    ) from None


def describe_record(record: dict | None) -> str:
  """A file's record for a message: its sha256 and size, or that none is recorded yet."""
  if record is None:
    return "no checksum recorded yet: the release publishes none"
  return f"sha256 {record['sha256']}, {record['size']:,} bytes"


def forget(rel: Release, names, cache_dir: str | None = None) -> None:
  """Deletes downloaded files of ``rel`` (and their records), so the next use fetches them."""
  downloads = cache_root(cache_dir) / "downloads" / rel.name
  records = Records(downloads)
  for name in names:
    (downloads / name).unlink(missing_ok=True)
    records.drop(name)
