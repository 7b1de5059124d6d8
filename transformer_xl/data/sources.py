"""Finding, fetching and checking the source files of a corpus.

A corpus is distributed as one canonical archive (``enwik8.zip``,
``simple-examples.tgz``, ...) holding one or more files.  ``locate`` finds
those files, in this order:

1. the extracted files in the manual dir (``<manual_dir>/<file>`` or
   ``<manual_dir>/<path inside the archive>``);
2. the canonical archive in the manual dir, then in the download dir (a
   previous download);
3. if ``download`` is true, the canonical URL, fetched into the download dir
   (``transformer_xl.data.download.fetch``: a cut connection is resumed).
   The request must answer within ``DOWNLOAD_TIMEOUT_S`` seconds, so an
   unreachable host costs a few seconds, not a hang.

Local copies come first so that a machine without network never waits on it
when the data is already there.  If all fail, ``DataError`` names the
missing files, the manual dir, the canonical URL and the expected checksums;
this happens before any tokenisation.  With ``verify_checksums`` every file
found is checked against its published size and checksums (of the extracted
file, so a file is checked the same way whether it came extracted or inside
the archive).

One Billion Word comes as a tarball of 100 shard files without published
checksums: ``locate_sharded`` finds its shards (extracted in the manual
dir, or extracted once from the tarball into ``<data_dir>/downloads/
extracted/lm1b``), and checks the documented structure (every training
shard present) instead of checksums.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from transformer_xl.data.corpus import DataError
from transformer_xl.data.download import TRIES, DownloadError, fetch

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
    file: the ``SourceFile`` this is a copy of.
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
            raise DataError(f"{self.member} in {self.path} is not a regular file")
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

    Raises:
      DataError: the file is not UTF-8 (the message names it, the line and
        the byte), raised where the reading fails.
    """
    with self.open() as f:
      text = io.TextIOWrapper(f, encoding="utf-8")
      try:
        yield text
      except UnicodeDecodeError:
        raise DataError(self._not_utf8()) from None
      finally:
        text.detach()

  def _not_utf8(self) -> str:
    """The message for a file that is not UTF-8: where its first bad byte is."""
    data = self.read_bytes()
    try:
      data.decode("utf-8")
      where = ""
    except UnicodeDecodeError as err:
      line = data.count(b"\n", 0, err.start) + 1
      where = f" (line {line}: byte {data[err.start]:#04x} at offset {err.start:,})"
    return (
        f"{self} is not UTF-8 text{where}. Use the canonical file (with "
        "--config.data.verify_checksums=true its checksum is checked), or convert it to "
        "UTF-8."
    )

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
        f"Cannot read the archive {archive}: {e}. Remove it, or replace it with an intact copy."
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

  ``transformer_xl.data.download.fetch``: the host must answer within
  ``timeout_s`` (the name lookup included; one that does not is not tried
  again), reads time out after ``timeout_s`` of silence, a cut connection
  is resumed (``TRIES`` tries), a progress bar when stderr is a terminal.
  A partial file never remains.
  """
  try:
    fetch(url, dest, tries=TRIES, timeout_s=timeout_s, progress=None, keep_partial=False)
  except DownloadError as err:
    return err.reason + (f" ({err.tries} tries)" if err.tries > 1 else "")
  return None


def _missing_message(
    spec: SourceSpec,
    manual_dir: Path,
    missing: Sequence[str],
    download_note: str,
) -> str:
  width = max(len(f.name) for f in spec.files)
  listing = "\n".join(f"      {f.name:<{width}}  ({f.expected()})" for f in spec.files)
  lines = [
      f"Cannot build corpus {spec.corpus!r}: source file(s) {', '.join(missing)} not found.",
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
      ``DOWNLOAD_TIMEOUT_S``); see ``_download``.

  Returns:
    ``SourceFile.name`` -> ``Source``, one per file of ``spec``.

  Raises:
    DataError: a file is missing (message: the missing names, ``manual_dir``,
      ``spec.url`` and the expected checksums), or a local archive is
      unreadable or lacks a file.  Raised within ``timeout_s`` when the
      host does not answer (about 1.5 s when it refuses the connection:
      ``TRIES`` tries with pauses), plus the time to list a local archive.
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
  for key, expected in (("size", file.size), ("md5", file.md5), ("sha256", file.sha256)):
    if expected is not None and actual[key] != expected:
      raise DataError(
          f"Checksum mismatch for {file.name} ({source}): expected {key} "
          f"{expected}, got {actual[key]} (expected: {file.expected()}). "
          "Replace it with the canonical file, or pass "
          "--config.data.verify_checksums=false (load_corpus(verify_checksums=False)) to use "
          "a modified copy on purpose."
      )


def verify_all(sources: Mapping[str, Source]) -> None:
  """``verify`` for each source; raises DataError on the first mismatch."""
  for source in sources.values():
    verify(source)


# -- corpora distributed as many shards (One Billion Word) --------------------


@dataclasses.dataclass(frozen=True)
class ShardedSourceSpec:
  """A corpus distributed as one archive holding many shard files.

  Attributes:
    corpus: corpus name as given to ``load_corpus`` (e.g. "lm1b").
    archive: file name of the canonical archive (a tar, any compression).
    url: canonical URL of the archive.
    train: the canonical training shards, in stream order (each a
      ``SourceFile`` with its path inside the archive).
    heldout: the held-out shard the evaluation splits are built from.
    extras: optional files that do not come with the archive (e.g. a
      vocabulary file), looked for by name in the manual dir only.
    note: extra text for error messages (how the files are verified).
  """

  corpus: str
  archive: str
  url: str
  train: tuple[SourceFile, ...]
  heldout: SourceFile
  extras: tuple[str, ...] = ()
  note: str = ""

  @property
  def shards(self) -> tuple[SourceFile, ...]:
    """Every shard the corpus can be built from: ``train + (heldout,)``."""
    return self.train + (self.heldout,)


def _sharded_complete(
    spec: ShardedSourceSpec, found: Mapping[str, Source], require_all_train: bool
) -> bool:
  train = [f.name in found for f in spec.train]
  return spec.heldout.name in found and (all(train) if require_all_train else any(train))


def _sharded_missing(
    spec: ShardedSourceSpec, found: Mapping[str, Source], require_all_train: bool
) -> list[str]:
  """Names of the missing shards (only the first missing training shard
  when any training shard suffices)."""
  missing = [f.name for f in spec.train if f.name not in found]
  if not require_all_train and len(missing) < len(spec.train):
    missing = []
  elif not require_all_train:
    missing = missing[:1]
  if spec.heldout.name not in found:
    missing.append(spec.heldout.name)
  return missing


def _summary(names: Sequence[str], limit: int = 4) -> str:
  if len(names) <= limit:
    return ", ".join(names)
  return f"{', '.join(names[:limit])} and {len(names) - limit} more ({len(names)} files)"


def _extract_shards(spec: ShardedSourceSpec, archive: Path, dest: Path) -> dict[str, Source]:
  """Extracts the shards of ``spec`` found in ``archive`` into ``dest``.

  One sequential pass over the (compressed) archive; stops once every shard
  is out.  A shard is recognised by its base name.  ``dest`` is replaced
  as a whole (written as ``dest.part``, then renamed), so it never mixes
  two archives.  Returns shard name -> ``Source`` (plain files).

  Raises:
    DataError: the archive cannot be read.
  """
  wanted = {f.name: f for f in spec.shards}
  partial = dest.with_name(dest.name + ".part")
  shutil.rmtree(partial, ignore_errors=True)
  got: dict[str, Source] = {}
  try:
    with tarfile.open(archive, "r|*") as tf:
      for member in tf:
        file = wanted.get(member.name.rsplit("/", 1)[-1])
        if file is None or not member.isfile() or file.name in got:
          continue
        out = partial / file.member
        out.parent.mkdir(parents=True, exist_ok=True)
        reader = tf.extractfile(member)
        with reader, open(out, "wb") as f:
          shutil.copyfileobj(reader, f, _READ_BLOCK)
        got[file.name] = Source(file, dest / file.member)
        if len(got) == len(wanted):
          break
  except (tarfile.TarError, EOFError, OSError) as e:
    shutil.rmtree(partial, ignore_errors=True)
    if isinstance(e, DataError):
      raise
    raise DataError(
        f"Cannot read the archive {archive}: {e}. Remove it, or replace it "
        f"with an intact copy of {spec.archive} ({spec.url})."
    ) from e
  shutil.rmtree(dest, ignore_errors=True)
  partial.mkdir(parents=True, exist_ok=True)
  os.replace(partial, dest)
  return got


def _sharded_message(
    spec: ShardedSourceSpec,
    manual_dir: Path,
    missing: Sequence[str],
    require_all_train: bool,
    download_note: str,
) -> str:
  first, last = spec.train[0], spec.train[-1]
  need = (
      f"all {len(spec.train)} training shards"
      if require_all_train
      else "at least one training shard"
  )
  lines = [
      f"Cannot build corpus {spec.corpus!r}: source file(s) "
      f"{_summary(list(missing))} not found.",
      f"Put one of the following into the manual dir {manual_dir} :",
      f"  * the canonical archive {spec.archive}, from {spec.url}",
      "  * or the extracted files, as the directory tree of the archive "
      "or directly in the manual dir:",
      f"      {first.member} ... {last.name}  ({len(spec.train)} training "
      f"shards; {need} needed)",
      f"      {spec.heldout.member}  (held-out shard)",
      download_note,
  ]
  if spec.note:
    lines.append(spec.note)
  return "\n".join(lines)


def locate_sharded(
    spec: ShardedSourceSpec,
    *,
    manual_dir: Path,
    download_dir: Path,
    download: bool,
    require_all_train: bool,
    timeout_s: float | None = None,
) -> dict[str, Source]:
  """Finds the shards of a sharded corpus (One Billion Word).

  Search order (local copies first, as ``locate``):

  1. extracted shards in the manual dir, each at ``<manual_dir>/<path in the
     archive>``, ``<manual_dir>/<its directory>/<name>`` or
     ``<manual_dir>/<name>``;
  2. the archive in the manual dir, then in ``download_dir``: its shards are
     extracted once, in one sequential pass, into
     ``<download_dir>/extracted/<corpus>`` (replacing an earlier extraction;
     reading members of a compressed tar in shard order would decompress
     the archive again for every shard);
  3. if ``download``, ``spec.url`` fetched into ``download_dir`` (the host
     must answer within ``timeout_s``), then as 2.

  A location is used when it holds the held-out shard and the training
  shards: all of them if ``require_all_train``, else at least one (then the
  training shards present are used; tests build from a few).

  Args:
    spec: the corpus's shards.
    manual_dir: where the user puts the archive or the extracted files.
    download_dir: ``<data_dir>/downloads``.
    download: whether to try ``spec.url`` when no local copy exists.
    require_all_train: demand every training shard (the documented
      structure; used with ``verify_checksums``).
    timeout_s: seconds the host has to answer (default
      ``DOWNLOAD_TIMEOUT_S``).

  Returns:
    file name -> ``Source`` (plain files): the training shards found,
    in ``spec.train`` order, then the held-out shard, then each file of
    ``spec.extras`` present in the manual dir.

  Raises:
    DataError: shards missing (message: the missing names, ``manual_dir``,
      ``spec.url``, that no checksum is published and which structure is
      checked instead), or an archive that is unreadable or lacks shards.
      Raised within ``timeout_s`` when nothing is present locally and the
      host does not answer (as ``locate``).
  """
  if timeout_s is None:
    timeout_s = DOWNLOAD_TIMEOUT_S
  manual_dir, download_dir = Path(manual_dir), Path(download_dir)

  def with_extras(found: Mapping[str, Source]) -> dict[str, Source]:
    out = {f.name: found[f.name] for f in spec.shards if f.name in found}
    for name in spec.extras:
      path = manual_dir / name
      if path.is_file():
        out[name] = Source(SourceFile(name=name, member=name), path)
    return out

  found: dict[str, Source] = {}
  for file in spec.shards:
    folder = file.member.rsplit("/", 2)[-2] if "/" in file.member else ""
    for candidate in (
        manual_dir / file.member,
        manual_dir / folder / file.name,
        manual_dir / file.name,
    ):
      if candidate.is_file():
        found[file.name] = Source(file, candidate)
        break
  if _sharded_complete(spec, found, require_all_train):
    return with_extras(found)

  def from_archive(archive: Path) -> dict[str, Source]:
    got = _extract_shards(spec, archive, download_dir / "extracted" / spec.corpus)
    if not _sharded_complete(spec, got, require_all_train):
      missing = _sharded_missing(spec, got, require_all_train)
      raise DataError(
          f"The archive {archive} does not contain {_summary(missing)}; it is "
          f"not the canonical {spec.archive} ({spec.url}). Replace it with the "
          "canonical archive"
          + (
              ", or pass --config.data.verify_checksums=false to build from the training "
              "shards it holds."
              if require_all_train and spec.heldout.name in got and len(got) > 1
              else "."
          )
      )
    return with_extras(got)

  for archive in (manual_dir / spec.archive, download_dir / spec.archive):
    if archive.is_file():
      return from_archive(archive)

  missing = _sharded_missing(spec, found, require_all_train)
  if download:
    dest = download_dir / spec.archive
    reason = _download(spec.url, dest, timeout_s)
    if reason is None:
      return from_archive(dest)
    download_note = f"Downloading {spec.url} failed: {reason}"
  else:
    download_note = f"Download of {spec.url} not tried (download=False)."
  raise DataError(_sharded_message(spec, manual_dir, missing, require_all_train, download_note))
