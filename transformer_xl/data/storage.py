"""Chunked token-stream storage: the base tfds builder.

Every corpus is a tfds dataset (array_record, ``disable_shuffling=True``)
that stores, per split ("train", "valid", "test"), consecutive records
``{"tokens": int32[<= chunk_size]}`` with integer keys 0, 1, 2, ..., so
record ``i`` holds tokens ``[i * chunk_size, (i + 1) * chunk_size)`` of the
split's stream and only the last record may be shorter.  The vocabulary
(id -> symbol), the unit, the boundary id, the chunk size and the per-split
token counts are stored in the dataset's ``metadata.json`` (a
``tfds.core.MetadataDict``), so a prepared dataset loads without its source
files.  Reading goes through ``builder.as_data_source()`` (no TensorFlow).

``TokenStreamBuilder`` is the base of the corpus builders; each family
module (``enwik8_text8.py``, ``ptb_wikitext.py``, ``lm1b.py``,
``text_builder.py``) subclasses it with a ``CorpusSpec`` per corpus and a
``_plan`` that tokenises the sources.  It prepares a dataset (one run at a
time per folder, a full disk reported as one message) and loads it as a
``Corpus``; the readers it loads it with (``ChunkedSource``,
``ChunkedSentenceIndex``) and the checks of a prepared dataset's files are
in ``prepared.py``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import filelock
import numpy as np
import tensorflow_datasets as tfds

from transformer_xl import errors
from transformer_xl.data import sources
from transformer_xl.data.corpus import Corpus, DataError, Tokenizer
from transformer_xl.data.prepared import (
    METADATA_KEYS,
    SPLITS,
    ChunkedSource,
    PreparedInfo,
    damaged_message,
    first_line,
    metadata_problem,
)
from transformer_xl.util import report

CHUNK_SIZE = 65536  # tokens per record
BUILDER_PREFIX = "txl_"  # tfds name = prefix + corpus name: no clash with tfds's own
LOCK_SUFFIX = ".lock"  # <data_dir>/.locks/<dataset folder>.lock: held while a run prepares it
# What a full disk looks like in an OSError's errno, or in the text of the RuntimeError that
# array_record raises through tfds ("write() failed: No space left on device; writing PATH; ...").
_DISK_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusSpec:
  """What a corpus is: one row of a family module's table of corpora.

  Attributes:
    name: corpus name as given to ``load_corpus`` (e.g. "ptb"); the tfds
      builder is ``builder_name``.
    unit: "byte", "char" or "word".
    boundary: the symbol whose id is ``Corpus.boundary_id``.
    tokenizer: the tokenisation (``tokenizers.py``), attached to the Corpus.
    source: the source files (``sources.SourceSpec``, or
      ``sources.ShardedSourceSpec`` for lm1b).
    homepage: the corpus's web page (tfds ``DatasetInfo.homepage``).
    manual_instructions: what to put into the manual dir (tfds
      ``MANUAL_DOWNLOAD_INSTRUCTIONS``).
  """

  name: str
  unit: str
  boundary: str
  tokenizer: Tokenizer
  source: sources.SourceSpec | sources.ShardedSourceSpec
  homepage: str
  manual_instructions: str

  @property
  def builder_name(self) -> str:
    """The tfds builder name, ``txl_<name>`` (the prepared dataset's directory)."""
    return BUILDER_PREFIX + self.name


@dataclasses.dataclass
class Plan:
  """What a builder writes: vocabulary, counts and a token stream per split.

  ``streams[split]()`` yields int32 arrays of any lengths whose
  concatenation is the split's stream of ``num_tokens[split]`` tokens.
  Every key of ``streams`` becomes a tfds split of chunk records: "train",
  "valid", "test", plus any extra int32 streams a builder stores (lm1b: the
  sentence lengths), written in the order of ``streams``.  ``metadata``
  holds extra entries for metadata.json.  ``num_tokens`` None: the builder
  counts while it writes, and records ``num_tokens`` in the metadata itself
  before the last stream ends (one pass instead of two; text_builder.py).
  """

  vocab: list[str]
  boundary_id: int
  num_tokens: dict[str, int] | None
  streams: dict[str, Callable[[], Iterator[np.ndarray]]]
  metadata: dict = dataclasses.field(default_factory=dict)


def rechunk(pieces: Iterable[np.ndarray], chunk_size: int) -> Iterator[np.ndarray]:
  """Re-cuts a stream given as arrays of any lengths into chunk_size pieces."""
  pending, n = [], 0
  for piece in pieces:
    if not len(piece):
      continue
    pending.append(np.asarray(piece, np.int32))
    n += len(piece)
    if n >= chunk_size:
      flat = np.concatenate(pending) if len(pending) > 1 else pending[0]
      k = (n // chunk_size) * chunk_size
      for i in range(0, k, chunk_size):
        yield flat[i : i + chunk_size]
      pending, n = [flat[k:]], n - k
  if n:
    yield np.concatenate(pending)


def key_stride(num_tokens: int | None, chunk_size: int) -> int:
  """The step between the keys of consecutive records of a split.

  tfds writes a split through its shuffler, which (with ``disable_shuffling``,
  keys kept in order) files a record in bucket ``floor(key * 1000 / 2**128)``
  and holds a whole bucket in memory to sort it; keys 0, 1, 2, ... would put
  the whole split in bucket 0 (all of lm1b's 3 GB at once).  Keys spread
  evenly over [0, 2**128) keep the order and bound the memory to a
  thousandth of the split (beyond tfds's 1 GB in-memory buffer).  1 when
  the length is not known.
  """
  if not num_tokens:
    return 1
  records = -(-int(num_tokens) // chunk_size)
  return max(1, (2**128 - 1) // records)


class TokenStreamBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the corpus builders: one contiguous token stream per split.

  A concrete subclass sets ``SPEC`` (a ``CorpusSpec``), which gives it
  its tfds name (``SPEC.builder_name``) and manual-download instructions;
  its docstring's first paragraph is the tfds description.  A family base
  implements ``_plan`` (and, for sharded sources, ``locate_sources``).

  Args:
    chunk_size: tokens per record when preparing.  Reading always uses the
      chunk size stored with the prepared dataset.
    data_dir: tfds data dir (default: tfds's, ``~/tensorflow_datasets``).
    **kwargs: passed to ``tfds.core.GeneratorBasedBuilder``.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Token stream in int32 chunk records."}
  SPEC: ClassVar[CorpusSpec]

  def __init_subclass__(cls, **kwargs):
    spec = cls.__dict__.get("SPEC")
    if spec is not None:  # tfds reads both when it registers the class.
      cls.name = spec.builder_name
      cls.MANUAL_DOWNLOAD_INSTRUCTIONS = spec.manual_instructions
    super().__init_subclass__(**kwargs)

  def __init__(self, *, chunk_size: int = CHUNK_SIZE, data_dir=None, **kwargs):
    if int(chunk_size) < 1:
      raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    self._chunk_size = int(chunk_size)
    self._sources: dict[str, sources.Source] | None = None
    self._verify_checksums = True
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return PreparedInfo(
        builder=self,
        description=(self.__doc__ or "").strip().split("\n\n")[0],
        features=tfds.features.FeaturesDict(
            {
                "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            }
        ),
        homepage=self.SPEC.homepage,
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def is_prepared(self) -> bool:
    """Whether the dataset is written in ``data_dir`` (has dataset_info.json).

    tfds writes into a temporary directory and renames it when complete, so
    the file exists only for a complete dataset.  (tfds's own check logs a
    warning for every dataset not prepared yet.)
    """
    return (Path(self.data_dir) / "dataset_info.json").is_file()

  # -- sources -----------------------------------------------------------

  def default_manual_dir(self) -> Path:
    """tfds's manual dir for this data dir: ``<data_dir>/downloads/manual``."""
    return Path(self.data_dir_root) / "downloads" / "manual"

  def locate_sources(
      self,
      *,
      manual_dir=None,
      download: bool = True,
      verify_checksums: bool = True,
  ) -> dict[str, sources.Source]:
    """Finds (and with ``verify_checksums`` checks) the source files.

    See ``sources.locate`` for the search order.  Fast: reads no file
    unless ``verify_checksums`` (then each file is hashed once).

    Returns:
      source file name -> ``sources.Source``.

    Raises:
      DataError: a file is missing or fails its checksum.
    """
    found = sources.locate(
        self.SPEC.source,
        manual_dir=(Path(manual_dir) if manual_dir else self.default_manual_dir()),
        download_dir=Path(self.data_dir_root) / "downloads",
        download=download,
    )
    if verify_checksums:
      sources.verify_all(found)
    return found

  def prepare(
      self,
      *,
      manual_dir=None,
      download: bool = True,
      verify_checksums: bool = True,
  ) -> None:
    """Locates the sources, then writes the dataset (``download_and_prepare``).

    One run at a time prepares a dataset folder: the run holds its lock
    (``preparation_lock``) while it works, and a second
    run waits for it, then uses the dataset the first one wrote (or, if
    that one failed, prepares it itself).

    Args:
      manual_dir: directory holding the archive or the extracted files
        (default ``default_manual_dir``).
      download: try the canonical URL if no local copy exists.
      verify_checksums: check published sizes/checksums (and, where known,
        token counts and vocabulary size); tiny test files need False.

    Raises:
      DataError: missing or bad source files (before any tokenisation), a
        source that cannot be tokenised (e.g. a valid/test word outside the
        vocabulary and no ``<unk>``), a full disk (nothing of the unfinished
        dataset is kept), or a damaged dataset that another run prepared.
    """
    with self.preparation_lock():
      if self.is_prepared():  # another run prepared it while this one waited
        report.log(f"Using the dataset in {self.data_dir} that another run prepared.")
        self.info.read_from_directory(self.data_dir)
        return
      self._prepare(manual_dir=manual_dir, download=download, verify_checksums=verify_checksums)

  def _prepare(self, *, manual_dir, download: bool, verify_checksums: bool) -> None:
    """``prepare``'s work, its lock held: the sources located, the dataset written."""
    self._sources = self.locate_sources(
        manual_dir=manual_dir, download=download, verify_checksums=verify_checksums
    )
    self._verify_checksums = verify_checksums
    config = tfds.download.DownloadConfig(manual_dir=str(manual_dir) if manual_dir else None)
    self._write(config)

  def lock_path(self) -> str:
    """The lock file of this dataset folder's preparation.

    ``<data_dir>/.locks/<the folder's path under data_dir>.lock``, e.g.
    ``<data_dir>/.locks/txl_ptb/1.0.0.lock`` for ``<data_dir>/txl_ptb/1.0.0``:
    outside the dataset's folders, so that a preparation that fails early
    (a missing source file) leaves none of them behind.
    """
    root, folder = str(self.data_dir_root), str(self.data_dir)
    return os.path.join(root, ".locks", os.path.relpath(folder, root) + LOCK_SUFFIX)

  @contextlib.contextmanager
  def preparation_lock(self) -> Iterator[None]:
    """Holds ``lock_path()`` while this run prepares the dataset folder.

    An exclusive ``flock`` (``filelock``, as ``run/lock.py``), which the
    kernel releases when its holder ends however it ends (kill -9
    included); the empty file stays.  A run that finds it held says so
    (``report.log``) and waits as long as the other one prepares.  On a
    remote data dir (gs://), or where the file cannot be locked, there is
    no lock (with a note for the latter).
    """
    folder = str(self.data_dir)
    if "://" in folder:
      yield
      return
    path = self.lock_path()
    lock = filelock.FileLock(path, thread_local=False, fallback_to_soft=False)
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      try:
        lock.acquire(timeout=0)
      except filelock.Timeout:
        report.log(
            f"Waiting for another run that prepares the dataset in {folder} (it holds {path})."
        )
        lock.acquire()
    except OSError as err:  # no flock on this file system, or the folder cannot be written
      report.log(f"Preparing {folder} without a lock ({path}: {err}).")
      yield
      return
    try:
      yield
    finally:
      lock.release()

  def _write(self, download_config) -> None:
    """``download_and_prepare``, with a full disk reported as one DataError.

    tfds writes into a temporary folder beside the dataset's and renames it
    when complete; a failure removes it, so nothing half-written stays.
    """
    try:
      self.download_and_prepare(download_config=download_config)
    except errors.UserError:
      raise
    except (OSError, RuntimeError) as err:
      message = self._disk_full_message(err)
      if message is None:
        raise
      raise DataError(message) from None

  def _disk_full_message(self, err: BaseException) -> str | None:
    """The message of a preparation that found its disk full; None for another error.

    A full disk arrives as an OSError (ENOSPC, EDQUOT: the temporary token
    files, tfds's own files) or as the RuntimeError of array_record's writer,
    whose text holds the C library's reason and the file written.
    """
    reason = path = None
    seen: BaseException | None = err
    chain: set[int] = set()  # the exceptions looked at: a chain that loops ends
    while seen is not None and reason is None and id(seen) not in chain:
      chain.add(id(seen))
      if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
        reason, path = _DISK_FULL[seen.errno], seen.filename
      else:
        text = str(seen)
        for code, what in _DISK_FULL.items():
          if os.strerror(code) in text:
            found = re.search(r"writing (\S+?);", text)
            reason, path = what, (found.group(1) if found else None)
            break
        if reason is None and "Not enough disk space" in text:  # tfds's check before it starts
          reason = "not enough space left on the device"
      seen = seen.__cause__ or seen.__context__
    if reason is None:
      return None
    root = os.path.abspath(str(self.data_dir_root))
    temp = os.path.abspath(tempfile.gettempdir())
    path = os.path.abspath(os.fspath(path)) if path else None
    if path is None or path.startswith(root + os.sep):
      where, advice = root, "set data.data_dir to a folder on a disk with room"
    elif path.startswith(temp + os.sep):
      where = temp
      advice = "set TMPDIR to a folder on a disk with room (the temporary token files go there)"
    else:
      where, advice = os.path.dirname(path), "set data.data_dir to a folder on a disk with room"
    return (
        f"Could not prepare the dataset in {self.data_dir}: {reason} in {where}. "
        f"Nothing of the unfinished dataset was kept. Free space there, or {advice}, "
        "and run the same command again."
    )

  @abc.abstractmethod
  def _plan(self, found: Mapping[str, sources.Source], verify: bool) -> Plan:
    """Reads the sources; returns vocabulary, counts and token streams."""

  def _split_generators(self, dl_manager):
    if self._sources is None:  # download_and_prepare called directly
      self._sources = self.locate_sources(
          manual_dir=getattr(dl_manager, "_manual_dir", None), download=True, verify_checksums=True
      )
    plan = self._plan(self._sources, self._verify_checksums)
    for split in SPLITS if plan.num_tokens is not None else ():
      if plan.num_tokens[split] == 0:
        raise DataError(
            f"{self.SPEC.name}: split {split!r} would be empty; the source files are too short."
        )
    self.info.metadata.update(
        {
            "corpus": self.SPEC.name,
            "unit": self.SPEC.unit,
            "vocab": list(plan.vocab),
            "boundary_id": int(plan.boundary_id),
            "num_tokens": (
                {s: int(plan.num_tokens[s]) for s in SPLITS} if plan.num_tokens is not None else {}
            ),
            "chunk_size": self._chunk_size,
            "checksums_verified": bool(self._verify_checksums),
        }
    )
    self.info.metadata.update(plan.metadata)
    self._streams = plan.streams
    self._counts = {s: int(n) for s, n in (plan.num_tokens or {}).items()}
    return {split: self._generate_examples(split) for split in plan.streams}

  def _generate_examples(self, split: str):
    n, stride = 0, None
    chunks = rechunk(self._streams[split](), self._chunk_size)
    for i, chunk in enumerate(chunks):
      if stride is None:  # the split's length is known by its first chunk (counted before)
        stride = key_stride(self._counts.get(split), self._chunk_size)
      n += len(chunk)
      yield i * stride, {"tokens": chunk}
    expected = self._counts.get(split)
    if expected is None and split in SPLITS and n == 0:
      raise DataError(f"{self.SPEC.name}: split {split!r} is empty: its files hold no token.")
    if expected is not None and n != expected:
      raise DataError(
          f"{self.SPEC.name}/{split}: wrote {n} tokens, counted {expected} "
          "before; did a source file change during the build?"
      )

  # -- reading -----------------------------------------------------------

  def data_source(self, split: str):
    """``as_data_source(split)``, with a damaged file reported as DataError.

    Raises:
      DataError: the split's files cannot be opened (the message names the
        directory and says to delete it to rebuild).
    """
    try:
      return self.as_data_source(split=split)
    except (RuntimeError, ValueError, OSError) as err:
      raise DataError(
          damaged_message(str(self.data_dir), f"split {split!r} cannot be opened ({err})")
      ) from None

  def metadata(self, required: Sequence[str] = ()) -> dict:
    """The prepared dataset's metadata.json, read and checked.

    Args:
      required: keys a family needs beyond ``METADATA_KEYS`` (text: the
        documents, bytes and tokenizer).

    Returns:
      A copy of its entries: ``unit`` (str), ``vocab`` (id -> symbol),
      ``boundary_id``, ``chunk_size`` (tokens per record), ``num_tokens``
      (split -> tokens), and the family's own.

    Raises:
      DataError: the file cannot be read or parsed (cut short, not UTF-8,
        not a JSON object), lacks a key, or an entry has the wrong type (the
        message names the folder and says to delete it).
    """
    folder = str(self.data_dir)
    try:
      md = self.info.metadata  # tfds reads metadata.json here, once it is asked for
      entries = dict(md.items()) if md is not None else {}
    except (ValueError, TypeError, OSError) as err:  # JSONDecodeError, UnicodeDecodeError, ...
      raise DataError(
          damaged_message(folder, f"its metadata.json cannot be read ({first_line(err)})")
      ) from None
    missing = [k for k in (*METADATA_KEYS, *required) if k not in entries]
    problem = f"lacks {', '.join(missing)}" if missing else metadata_problem(entries)
    if problem:
      raise DataError(damaged_message(folder, f"its metadata.json {problem}"))
    return entries

  def as_corpus(self) -> Corpus:
    """The prepared dataset as a ``Corpus`` of ``ChunkedSource``.

    The corpus carries ``SPEC.tokenizer`` (for ``Corpus.encode``).

    Raises:
      DataError: the dataset is not prepared, or its metadata is damaged or
        incomplete (``metadata``).
    """
    if not self.is_prepared():
      raise DataError(f"{self.name} is not prepared in {self.data_dir}.")
    md = self.metadata()
    splits = {
        split: ChunkedSource(
            self.data_source(split),
            md["num_tokens"][split],
            md["chunk_size"],
            name=f"{self.SPEC.name}/{split}",
            path=str(self.data_dir),
        )
        for split in SPLITS
    }
    return Corpus(
        name=self.SPEC.name,
        unit=md["unit"],
        vocab=tuple(md["vocab"]),
        boundary_id=int(md["boundary_id"]),
        splits=splits,
        tokenizer=self.SPEC.tokenizer,
    )
