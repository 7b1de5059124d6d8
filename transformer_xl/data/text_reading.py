"""Finding and reading one's own text files (``data.dataset="text"``).

The files of each split are given as comma-separated glob patterns
(``data.train_files``, ``data.valid_files``, ``data.test_files``; plain or
gzip, told apart by their first bytes); a split's stream is its files in
the order of the patterns, each pattern's matches sorted (a file matched
twice is read once; ``**`` follows no directory link: ``expand_pattern``;
a file in two splits is refused unless ``data.allow_split_overlap``:
``resolve_files``), each read line by line with universal newlines (a byte
order mark opening a file dropped: ``document_lines``, which also says where
each document starts).  Files that are not UTF-8 text are refused, up front
on their first 8 KiB and then at the line that breaks.  ``fingerprint``
names the prepared dataset of a set of files and settings.

The corpus built from these lines: ``text_builder.py``.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from transformer_xl.data.corpus import DataError
from transformer_xl.data.text_settings import (
    PRETRAINED,
    SPLITS,
    STORAGE_FORMAT,
    TextSettings,
    fingerprint_settings,
)

_SNIFF_BYTES = 8192  # read from every file up front: binary files are refused before any work
_BLOCK = 1 << 20


def _sniff(path: Path) -> str | None:
  """Why ``path`` is not UTF-8 text (a NUL byte, or bytes that are not UTF-8 in
  its first 8 KiB, decompressed for gzip), else None."""
  try:
    with _open_binary(path) as f:
      head = f.read(_SNIFF_BYTES)
  except (OSError, EOFError, zlib.error) as err:
    return f"it cannot be read ({err})"
  nul = head.find(b"\0")
  if nul >= 0:
    return f"a NUL byte at offset {nul:,}: a binary file?"
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as err:
    if err.start < len(head) - 3:  # not just a character cut at the end of the sniffed bytes
      return (
          f"byte {head[err.start]:#04x} at offset {err.start:,}: another encoding such as "
          "Latin-1 (convert it, e.g. iconv -f latin1 -t utf-8), or a binary file"
      )
  return None


def _dirs_below(base: str) -> Iterator[str]:
  """``base`` and every directory below it that ``**`` matches: names not
  starting with ``.`` (as ``glob``), reached without following a directory
  link (a link is not descended into, nor matched).  ``base`` itself may be
  a link; "" is the current directory (paths then stay relative)."""
  stack = [base]
  while stack:
    folder = stack.pop()
    yield folder
    try:
      with os.scandir(folder or os.curdir) as entries:
        below = [
            os.path.join(folder, e.name)
            for e in entries
            if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
        ]
    except OSError:  # unreadable: as glob, what cannot be listed matches nothing
      continue
    stack.extend(sorted(below, reverse=True))


def _glob(pattern: str) -> Iterator[str]:
  """``glob.glob(pattern, recursive=True)``, but a ``**`` component follows no
  directory link (``_dirs_below``); may repeat a path."""
  parts = pattern.split(os.sep)
  if "**" not in parts:
    yield from glob.glob(pattern)
    return
  i = parts.index("**")
  head, rest = os.sep.join(parts[:i]) or (os.sep if i else ""), os.sep.join(parts[i + 1 :])
  if glob.has_magic(head):
    bases = [b for b in glob.glob(head) if os.path.isdir(b)]
  else:
    bases = [head] if not head or os.path.isdir(head) else []
  for base in bases:
    for folder in _dirs_below(base):
      prefix = glob.escape(folder) if folder else ""
      yield from _glob(os.path.join(prefix, rest or "*"))


def expand_pattern(pattern: str) -> list[str]:
  """The files ``pattern`` matches (``~`` expanded), sorted, without repeats.

  As ``glob.glob(pattern, recursive=True)`` (hidden names matched only by a
  component that starts with ``.``), except that ``**`` follows no
  directory link: a link to a directory below a ``**`` is neither descended
  into nor matched, so links to ``..`` cannot make the search endless (glob's
  own recursion through two of them grows exponentially) nor reach files
  outside the folder.  A directory link named in the pattern, or matched by
  a one-level wildcard (``*``, ``?``, ``[...]``), is followed (the pattern
  bounds the depth), and ``**`` recurses inside it.  A link to a file is a
  file wherever it is.

  Args:
    pattern: one glob pattern (``data.train_files`` holds several, comma-separated).

  Returns:
    The paths of the matching regular files (links to files included), as
    spelled from ``pattern`` (not resolved).
  """
  return sorted({p for p in _glob(os.path.expanduser(pattern)) if os.path.isfile(p)})


def _overlap_message(path: Path, first: tuple[str, str], second: tuple[str, str]) -> str:
  """One line: ``path`` is matched by two splits' patterns ((split, pattern) each)."""
  (a, pa), (b, pb) = first, second
  why = (
      "the model would be trained on text it is evaluated on"
      if "train" in (a, b)
      else f"{a} and {b} would score the same text"
  )
  return (
      f"{path} is in two splits: data.{a}_files ({pa!r}) and data.{b}_files ({pb!r}) both "
      f"match it, so {why}; change the patterns so that each file is in one split, or set "
      "data.allow_split_overlap=True if that is meant."
  )


def resolve_files(s: TextSettings) -> dict[str, list[Path]]:
  """The files of each split: each pattern's matches (``expand_pattern``),
  sorted, without repeats, as real paths (links and ``..`` resolved).

  All the patterns are expanded before any file is read: a file in two
  splits (the same real path, however spelled) is refused unless
  ``s.allow_split_overlap``; then each split's files are checked.

  Raises:
    DataError: a pattern matches no file, a file is in two splits, a split's
      files are all empty, or a file is not UTF-8 text (checked on its first
      8 KiB).
  """
  found: dict[str, list[Path]] = {}
  first_match: dict[Path, tuple[str, str]] = {}  # real path -> (split, pattern) first matching
  for split in SPLITS:
    files: list[Path] = []
    seen: set[Path] = set()
    for pattern in s.patterns(split):
      matches = [Path(p) for p in expand_pattern(pattern)]
      if not matches:
        raise DataError(
            f"data.{split}_files: no file matches {pattern!r} (from "
            f"{os.getcwd()}); check the path, or quote the pattern so the shell "
            "does not expand it."
        )
      for m in sorted(matches):
        real = m.resolve()
        if real in seen:
          continue  # matched twice in one split: read once
        first = first_match.setdefault(real, (split, pattern))
        if first[0] != split and not s.allow_split_overlap:
          raise DataError(_overlap_message(real, first, (split, pattern)))
        seen.add(real)
        files.append(real)
    found[split] = files
  for split, files in found.items():
    if all(f.stat().st_size == 0 for f in files):
      raise DataError(
          f"data.{split}_files: the {split} split would be empty: "
          f"{', '.join(map(str, files[:3]))} hold no text."
      )
    for f in files:
      why = _sniff(f)
      if why:
        raise DataError(
            f"data.{split}_files: {f} is not UTF-8 text ({why}); give UTF-8 text "
            "files, plain or gzip."
        )
  return found


def fingerprint(s: TextSettings, files: Mapping[str, Sequence[Path]]) -> str:
  """16 hex digits naming the prepared dataset of these settings and files
  (each file's path, size and modification time; not its contents)."""
  desc = {
      "format": STORAGE_FORMAT,
      "settings": fingerprint_settings(s),
      "files": {
          split: [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in fs]
          for split, fs in files.items()
      },
  }
  if s.tokenizer.startswith(PRETRAINED):
    p = Path(s.tokenizer[len(PRETRAINED) :]).expanduser()
    desc["pretrained"] = (
        str(p.resolve()),
        *((p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else ()),
    )
  return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


class _Hashing(io.RawIOBase):
  """A read-only raw stream over ``raw`` that hashes (sha256) and counts the bytes read."""

  def __init__(self, raw):
    super().__init__()
    self._raw, self.sha256, self.size = raw, hashlib.sha256(), 0

  def readable(self):
    return True

  def readinto(self, b):
    n = self._raw.readinto(b)
    if n:
      self.sha256.update(memoryview(b)[:n])
      self.size += n
    return n


@contextlib.contextmanager
def _open_binary(path: Path, hashes: dict | None = None):
  """The decompressed bytes of ``path`` (gzip told by its magic bytes).

  With ``hashes``, the file's sha256 and size (of the bytes on disk) are
  stored there under ``str(path)`` once the stream closes; ``hashes["_read"]``
  is the ``_Hashing`` while it is open (progress).
  """
  with open(path, "rb") as raw:
    gz = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    counted = _Hashing(raw) if hashes is not None else raw
    if hashes is not None:
      hashes["_read"] = counted
    stream = io.BufferedReader(counted, _BLOCK)
    yield gzip.GzipFile(fileobj=stream) if gz else stream
    if hashes is not None:
      stream.read()  # the rest, so the hash covers the whole file
      hashes[str(path)] = (counted.sha256.hexdigest(), counted.size)


@contextlib.contextmanager
def _open_lines(path: Path, hashes: dict | None = None) -> Iterator[Iterator[str]]:
  """The lines of ``path`` (UTF-8, universal newlines, line breaks kept; a
  byte order mark at the start of the file dropped, as ``utf-8-sig`` does).

  Raises:
    DataError: not UTF-8, a NUL byte, or a damaged gzip file (the message
      names the file and the line).
  """
  lineno = 0

  def lines(text):
    nonlocal lineno
    for lineno, line in enumerate(text, 1):  # noqa: B007
      if "\0" in line:
        raise DataError(
            f"{path} line {lineno} has a NUL byte: a binary file given as text? "
            "Give text files (plain or gzip)."
        )
      yield line

  with _open_binary(path, hashes) as f:
    # utf-8-sig: a byte order mark opening the file is not text (one later in it is)
    text = io.TextIOWrapper(f, encoding="utf-8-sig", newline=None)
    try:
      yield lines(text)
    except UnicodeDecodeError:
      raise DataError(
          f"{path} is not UTF-8 text ({_first_bad_utf8(path)}); convert it to "
          "UTF-8 (e.g. iconv -f latin1 -t utf-8)."
      ) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
      raise DataError(
          f"{path} is a damaged gzip file (after line {lineno}: {err}); "
          "replace it with an intact copy."
      ) from None


def _first_bad_utf8(path: Path) -> str:
  """Where the first byte of ``path`` (decompressed) that is not UTF-8 is."""
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset = line = 0
  with _open_binary(path) as f:
    while block := f.read(_BLOCK):
      try:
        decoder.decode(block)
      except UnicodeDecodeError as err:
        # err.start counts from the bytes the decoder held back plus this block
        held = len(err.object) - len(block)
        at = offset + err.start - held
        line += err.object[: err.start].count(b"\n") + 1
        return f"line {line:,}: byte {err.object[err.start]:#04x} at offset {at:,}"
      line += block.count(b"\n")
      offset += len(block)
  return "a multi-byte character cut at the end of the file"


def document_lines(
    files: Sequence[Path], separator: str, progress=None, hashes: dict | None = None
) -> Iterator[tuple[str, bool]]:
  """Every line of ``files`` in order, without its line break, with whether it
  starts a document (``separator``: each file, paragraph or line is one).

  A paragraph is a run of lines up to and including the blank lines after
  it.  ``hashes`` (path -> (sha256, size)) is filled in as files are read;
  ``progress`` (tqdm) advances by the bytes read.
  """
  hashes = {} if hashes is None else hashes
  for path in files:
    with _open_lines(path, hashes) as lines:
      counted, last = hashes["_read"], 0
      first, blank_before = True, False
      for line in lines:
        body = line[:-1] if line.endswith("\n") else line
        blank = not body.strip()
        yield body, (
            first
            or separator == "line"
            or (separator == "paragraph" and blank_before and not blank)
        )
        first, blank_before = False, blank
        if progress is not None and counted.size - last >= _BLOCK:
          progress.update(counted.size - last)
          last = counted.size
    if progress is not None:
      progress.update(counted.size - last)
