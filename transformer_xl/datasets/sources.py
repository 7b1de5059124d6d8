"""Finding, fetching and checking the source files of a corpus.

A corpus is distributed as one canonical archive (``enwik8.zip``,
``simple-examples.tgz``, ...) holding one or more files.  :func:`locate` finds
those files, in this order:

1. the extracted files in the manual dir (``<manual_dir>/<file>`` or
   ``<manual_dir>/<path inside the archive>``);
2. the canonical archive in the manual dir, then in the download dir (a
   previous download);
3. if ``download`` is true, the canonical URL, fetched into the download dir.
   The request must answer within :data:`DOWNLOAD_TIMEOUT_S` seconds, so an
   unreachable host costs a few seconds, not a hang.

Local copies come first so that a machine without network never waits on it
when the data is already there.  If all fail, :class:`DataError` names the
missing files, the manual dir, the canonical URL and the expected checksums;
this happens before any tokenisation.  With ``verify_checksums`` every file
found is checked against its published size and checksums (of the extracted
file, so a file is checked the same way whether it came extracted or inside
the archive).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import threading
import urllib.request
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping, Sequence, TextIO

from transformer_xl.datasets import DataError

# Seconds the canonical host has to answer (name lookup and connection
# included) and the longest pause allowed between two reads of a download.
DOWNLOAD_TIMEOUT_S = 5.0
_READ_BLOCK = 1 << 20


@dataclasses.dataclass(frozen=True)
class SourceFile:
  """One file of a corpus as distributed, with its published properties.

  Attributes:
    name: file name once extracted, e.g. "ptb.train.txt".
    member: path of the file inside the canonical archive, e.g.
      "simple-examples/data/ptb.train.txt" (no leading "./").
    size: size in bytes, or None if not published.
    md5: hex md5 of the extracted file, or None if not published.
    sha256: hex sha256 of the extracted file, or None if not published.
  """

  name: str
  member: str
  size: int | None = None
  md5: str | None = None
  sha256: str | None = None

  def expected(self) -> str:
    """The published properties as text, e.g. "md5 f26c...; 5,101,618 bytes"."""
    parts = []
    if self.md5:
      parts.append(f"md5 {self.md5}")
    if self.sha256:
      parts.append(f"sha256 {self.sha256}")
    if self.size is not None:
      parts.append(f"{self.size:,} bytes")
    return "; ".join(parts) if parts else "no published checksum"


@dataclasses.dataclass(frozen=True)
class SourceSpec:
  """Where a corpus comes from.

  Attributes:
    corpus: corpus name as given to ``load_corpus`` (e.g. "ptb").
    archive: file name of the canonical archive, e.g. "simple-examples.tgz".
    url: canonical URL of the archive.
    files: the files of the archive that the corpus is built from.
    note: extra text for error messages, e.g. how a corpus without published
      checksums is verified instead.
  """

  corpus: str
  archive: str
  url: str
  files: tuple[SourceFile, ...]
  note: str = ""


@dataclasses.dataclass(frozen=True)
class Source:
  """A located source file: a plain file, or a member of an archive.

  Attributes:
    file: the :class:`SourceFile` this is a copy of.
    path: the file on disk, or the archive holding it.
    member: name of the member inside ``path`` as stored in the archive, or
      None for a plain file.
  """

  file: SourceFile
  path: Path
  member: str | None = None

  def __str__(self) -> str:
    return f"{self.path}:{self.member}" if self.member else str(self.path)

  @contextlib.contextmanager
  def open(self) -> Iterator[BinaryIO]:
    """The file's bytes as a binary stream (read-only).

    Raises:
      DataError: the archive cannot be read.
    """
    if self.member is None:
      with open(self.path, "rb") as f:
        yield f
      return
    try:
      if _is_zip(self.path):
        with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as f:
          yield f
      else:
        with tarfile.open(self.path, "r:*") as tf:
          f = tf.extractfile(self.member)
          if f is None:
            raise DataError(
                f"{self.member} in {self.path} is not a regular file")
          with f:
            yield f
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
      if isinstance(e, DataError):
        raise
      raise DataError(f"Cannot read {self}: {e}") from e

  @contextlib.contextmanager
  def open_text(self) -> Iterator[TextIO]:
    """The file as UTF-8 text with universal newlines (as ``open(path)``).

    Lines are split exactly as the reference implementation's
    ``for line in open(path, "r", encoding="utf-8")`` splits them.
    """
    with self.open() as f:
      text = io.TextIOWrapper(f, encoding="utf-8")
      try:
        yield text
      finally:
        text.detach()

  def read_bytes(self) -> bytes:
    """The whole file as bytes."""
    with self.open() as f:
      return f.read()


def _is_zip(path: Path) -> bool:
  return zipfile.is_zipfile(path)


def _normalise(member: str) -> str:
  while member.startswith("./"):
    member = member[2:]
  return member


def _archive_members(archive: Path) -> list[str]:
  """Names of the regular files in a zip or tar archive, as stored."""
  try:
    if _is_zip(archive):
      with zipfile.ZipFile(archive) as zf:
        return [i.filename for i in zf.infolist() if not i.is_dir()]
    with tarfile.open(archive, "r:*") as tf:
      return [m.name for m in tf.getmembers() if m.isfile()]
  except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
    raise DataError(
        f"Cannot read the archive {archive}: {e}. Remove it, or replace it "
        "with an intact copy."
    ) from e


def _find_member(members: Sequence[str], file: SourceFile) -> str | None:
  """The stored name of ``file`` in an archive listing, or None.

  The canonical path (``file.member``, ignoring a leading "./") wins; else the
  one member whose base name is ``file.name``.
  """
  exact = [m for m in members if _normalise(m) == file.member]
  if exact:
    return exact[0]
  by_name = [m for m in members if m.rsplit("/", 1)[-1] == file.name]
  return by_name[0] if len(by_name) == 1 else None


def _from_archive(spec: SourceSpec, archive: Path) -> dict[str, Source]:
  members = _archive_members(archive)
  found, missing = {}, []
  for file in spec.files:
    member = _find_member(members, file)
    if member is None:
      missing.append(file.member)
    else:
      found[file.name] = Source(file, archive, member)
  if missing:
    raise DataError(
        f"The archive {archive} does not contain {', '.join(missing)}; it is "
        f"not the canonical {spec.archive} ({spec.url}). Replace it with the "
        "canonical archive."
    )
  return found


def _download(url: str, dest: Path, timeout_s: float) -> str | None:
  """Fetches ``url`` into ``dest``; returns None on success, else the reason.

  The request runs in a daemon thread that must answer within ``timeout_s``
  (this bounds the name lookup too, which socket timeouts do not); reads then
  time out after ``timeout_s`` of silence.  A partial file never remains.
  """
  answer: dict[str, object] = {}

  def request():
    try:
      answer["response"] = urllib.request.urlopen(url, timeout=timeout_s)
    except Exception as e:  # pylint: disable=broad-except
      answer["error"] = e

  thread = threading.Thread(target=request, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    return f"no answer within {timeout_s:g} s"
  if "error" in answer:
    return str(answer["error"])
  partial = dest.with_name(dest.name + ".part")
  try:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with answer["response"] as response, open(partial, "wb") as out:
      shutil.copyfileobj(response, out, _READ_BLOCK)
    os.replace(partial, dest)
  except Exception as e:  # pylint: disable=broad-except
    partial.unlink(missing_ok=True)
    return f"download interrupted: {e}"
  return None


def _missing_message(
    spec: SourceSpec, manual_dir: Path, missing: Sequence[str],
    download_note: str,
) -> str:
  width = max(len(f.name) for f in spec.files)
  listing = "\n".join(
      f"      {f.name:<{width}}  ({f.expected()})" for f in spec.files
  )
  lines = [
      f"Cannot build corpus {spec.corpus!r}: source file(s) "
      f"{', '.join(missing)} not found.",
      f"Put one of the following into the manual dir {manual_dir} :",
      f"  * the canonical archive {spec.archive}, from {spec.url}",
      "  * or the extracted files:",
      listing,
      download_note,
  ]
  if spec.note:
    lines.append(spec.note)
  return "\n".join(lines)


def locate(
    spec: SourceSpec,
    *,
    manual_dir: Path,
    download_dir: Path,
    download: bool,
    timeout_s: float | None = None,
) -> dict[str, Source]:
  """Finds every file of ``spec``; see the module docstring for the order.

  Args:
    spec: the corpus's source files.
    manual_dir: directory the user puts the archive or extracted files in.
    download_dir: where a download of the archive is kept
      (``<data_dir>/downloads``).
    download: whether to try ``spec.url`` when no local copy exists.
    timeout_s: seconds the host has to answer (default
      :data:`DOWNLOAD_TIMEOUT_S`); see :func:`_download`.

  Returns:
    ``SourceFile.name`` -> :class:`Source`, one per file of ``spec``.

  Raises:
    DataError: a file is missing (message: the missing names, ``manual_dir``,
      ``spec.url`` and the expected checksums), or a local archive is
      unreadable or lacks a file.  Raised within ``timeout_s`` (plus the
      time to list a local archive).
  """
  if timeout_s is None:
    timeout_s = DOWNLOAD_TIMEOUT_S
  manual_dir = Path(manual_dir)
  found: dict[str, Source] = {}
  for file in spec.files:
    for candidate in (manual_dir / file.member, manual_dir / file.name):
      if candidate.is_file():
        found[file.name] = Source(file, candidate)
        break
  if len(found) == len(spec.files):
    return found

  for archive in (manual_dir / spec.archive, Path(download_dir) / spec.archive):
    if archive.is_file():
      return _from_archive(spec, archive)

  missing = [f.name for f in spec.files if f.name not in found]
  if download:
    dest = Path(download_dir) / spec.archive
    reason = _download(spec.url, dest, timeout_s)
    if reason is None:
      return _from_archive(spec, dest)
    download_note = f"Downloading {spec.url} failed: {reason}"
  else:
    download_note = f"Download of {spec.url} not tried (download=False)."
  raise DataError(_missing_message(spec, manual_dir, missing, download_note))


def verify(source: Source) -> None:
  """Checks a located file against its published size and checksums.

  Streams the file once (for enwik8's 100 MB, about a second).  A file with
  no published property passes.

  Raises:
    DataError: the size, md5 or sha256 differs; the message names the file,
      the expected and the actual value.
  """
  file = source.file
  if file.size is None and file.md5 is None and file.sha256 is None:
    return
  md5, sha256, size = hashlib.md5(), hashlib.sha256(), 0
  with source.open() as f:
    while block := f.read(_READ_BLOCK):
      size += len(block)
      if file.md5:
        md5.update(block)
      if file.sha256:
        sha256.update(block)
  actual = {"size": size, "md5": md5.hexdigest(), "sha256": sha256.hexdigest()}
  for key, expected in (("size", file.size), ("md5", file.md5),
                        ("sha256", file.sha256)):
    if expected is not None and actual[key] != expected:
      raise DataError(
          f"Checksum mismatch for {file.name} ({source}): expected {key} "
          f"{expected}, got {actual[key]} (expected: {file.expected()}). "
          "Replace it with the canonical file, or pass "
          "verify_checksums=False to use a modified copy on purpose."
      )


def verify_all(sources: Mapping[str, Source]) -> None:
  """:func:`verify` for each source; raises DataError on the first mismatch."""
  for source in sources.values():
    verify(source)
