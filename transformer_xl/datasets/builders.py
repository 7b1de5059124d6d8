"""tfds builders that store each corpus split as one contiguous token stream.

Every builder writes, per split ("train", "valid", "test"), consecutive
array_record records ``{"tokens": int32[<= chunk_size]}`` with integer keys
0, 1, 2, ... and ``disable_shuffling=True``, so record ``i`` holds tokens
``[i * chunk_size, (i + 1) * chunk_size)`` of the split and only the last
record may be shorter.  The vocabulary (id -> symbol), the unit, the boundary
id, the chunk size and the per-split token counts are stored in the dataset's
``metadata.json`` (a ``tfds.core.MetadataDict``), so a prepared dataset loads
without its source files.

Corpora (builder names carry a ``txl_`` prefix so they cannot collide with
tfds's own datasets):

=============  =============  =====  ==========================================
name           builder        unit   tokens
=============  =============  =====  ==========================================
enwik8         txl_enwik8     byte   raw bytes, 256 ids (id = byte value)
text8          txl_text8      char   " " + a..z, 27 ids
ptb            txl_ptb        word   words + ``<eos>`` per line
ptb_char       txl_ptb_char   char   characters, "_" between words, ``<eos>``
wikitext2      txl_wikitext2  word   words + ``<eos>`` per line
wikitext103    txl_wikitext103 word  words + ``<eos>`` per line
=============  =============  =====  ==========================================

Word-level tokenisation follows the reference implementation (Dai et al.
2019, ``pytorch/utils/vocabulary.py`` and ``pytorch/data_utils.py``): each
line is split on whitespace (``str.split()``), one ``<eos>`` is appended per
line (blank lines give a lone ``<eos>``), no lower-casing, and the vocabulary
is built from train only: ``<eos>`` first (id 0), then the train symbols by
descending count, ties broken by first occurrence in train (what
``Counter.most_common`` does in the reference's ``Vocab.build_vocab``).
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import threading
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from transformer_xl.datasets import Corpus, DataError, sources

CHUNK_SIZE = 65536  # tokens per record
SPLITS = ("train", "valid", "test")
EOS = "<eos>"
UNK = "<unk>"
WORD_BOUNDARY = "_"  # between the words of a line, ptb_char only


class ChunkedSource:
  """A :class:`~transformer_xl.datasets.TokenSource` over chunk records.

  Reads only the records that cover a requested range.  Record ``i`` must
  hold tokens ``[i * chunk_size, min((i + 1) * chunk_size, num_tokens))``;
  every record read is checked for that length.  The last ``cache_chunks``
  decoded records are kept (LRU), so a reader that walks a few streams
  forward in short segments decodes each record once.  Thread-safe; pickles
  without its cache.

  Args:
    records: a sequence of ``{"tokens": int32[<= chunk_size]}`` (e.g. what
      ``builder.as_data_source(split)`` returns); supports ``len`` and
      integer indexing, and ``__getitems__`` (batch read) if present.
    num_tokens: length of the split's token stream, in tokens.
    chunk_size: tokens per record.
    name: for error messages, e.g. "ptb/valid".
    cache_chunks: how many decoded records to keep (64 x 65536 int32 tokens
      = 16 MiB); 0 disables the cache.

  Raises:
    DataError: the number of records does not match ``num_tokens`` and
      ``chunk_size``.
  """

  def __init__(self, records, num_tokens: int, chunk_size: int, name: str = "",
               cache_chunks: int = 64):
    self._records = records
    self._num_tokens = int(num_tokens)
    self._chunk_size = int(chunk_size)
    self._name = name
    self._cache_chunks = int(cache_chunks)
    self._cache: collections.OrderedDict[int, np.ndarray] = (
        collections.OrderedDict())
    self._lock = threading.Lock()
    expected = -(-self._num_tokens // self._chunk_size)
    if len(records) != expected:
      raise DataError(
          f"{name}: {len(records)} records stored, expected {expected} "
          f"({self._num_tokens} tokens in chunks of {self._chunk_size}); the "
          "prepared dataset is corrupt, delete its directory to rebuild it."
      )

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_cache"], state["_lock"] = collections.OrderedDict(), None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  @property
  def num_tokens(self) -> int:
    """Length of the split's token stream, in tokens."""
    return self._num_tokens

  @property
  def chunk_size(self) -> int:
    """Tokens per record (the last record may hold fewer)."""
    return self._chunk_size

  @property
  def num_chunks(self) -> int:
    """Number of records, ``ceil(num_tokens / chunk_size)``."""
    return len(self._records)

  def _fetch(self, keys: list[int]) -> list[np.ndarray]:
    """Decoded, length-checked tokens of records ``keys`` (via the cache)."""
    with self._lock:
      cached = {k: self._cache[k] for k in keys if k in self._cache}
      for k in cached:
        self._cache.move_to_end(k)
    todo = [k for k in keys if k not in cached]
    if todo:
      if hasattr(self._records, "__getitems__"):
        records = self._records.__getitems__(todo)
      else:
        records = [self._records[k] for k in todo]
      for key, record in zip(todo, records):
        tokens = np.asarray(record["tokens"], dtype=np.int32)
        c = self._chunk_size
        expected = min(c, self._num_tokens - key * c)
        if tokens.shape != (expected,):
          raise DataError(
              f"{self._name}: record {key} holds {tokens.shape[0]} tokens, "
              f"expected {expected}; the prepared dataset is corrupt.")
        tokens.flags.writeable = False
        cached[key] = tokens
      if self._cache_chunks > 0:
        with self._lock:
          for key in todo:
            self._cache[key] = cached[key]
          while len(self._cache) > self._cache_chunks:
            self._cache.popitem(last=False)
    return [cached[k] for k in keys]

  def read(self, start: int, stop: int) -> np.ndarray:
    """Tokens ``[start, stop)`` of the stream: int32, shape ``[stop - start]``.

    Returns a new array (the caller may modify it).

    Raises:
      IndexError: the range is outside ``[0, num_tokens]`` or reversed.
      DataError: a record has the wrong length (corrupt dataset).
    """
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop <= self._num_tokens:
      raise IndexError(
          f"range [{start}, {stop}) outside [0, {self._num_tokens}]")
    if start == stop:
      return np.zeros([0], np.int32)
    c = self._chunk_size
    first, last = start // c, (stop - 1) // c
    pieces = self._fetch(list(range(first, last + 1)))
    offset = first * c
    if len(pieces) == 1:
      return pieces[0][start - offset:stop - offset].copy()
    return np.concatenate(pieces)[start - offset:stop - offset]


@dataclasses.dataclass
class _Plan:
  """What a builder writes: vocabulary, counts and a token stream per split.

  ``streams[split]()`` yields int32 arrays of any lengths whose
  concatenation is the split's stream of ``num_tokens[split]`` tokens.
  """

  vocab: list[str]
  boundary_id: int
  num_tokens: dict[str, int]
  streams: dict[str, Callable[[], Iterator[np.ndarray]]]


def _rechunk(pieces: Iterable[np.ndarray],
             chunk_size: int) -> Iterator[np.ndarray]:
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
        yield flat[i:i + chunk_size]
      pending, n = [flat[k:]], n - k
  if n:
    yield np.concatenate(pending)


class _TokenStreamBuilder(tfds.core.GeneratorBasedBuilder,
                          skip_registration=True):
  """Base of the corpus builders: one contiguous token stream per split.

  Subclasses set ``CORPUS`` (name in ``load_corpus``), ``UNIT``, ``SOURCE``
  (a :class:`sources.SourceSpec`), ``HOMEPAGE`` and implement :meth:`_plan`.

  Args:
    chunk_size: tokens per record when preparing.  Reading always uses the
      chunk size stored with the prepared dataset.
    data_dir: tfds data dir (default: tfds's, ``~/tensorflow_datasets``).
    **kwargs: passed to ``tfds.core.GeneratorBasedBuilder``.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Token stream in int32 chunk records."}
  CORPUS: ClassVar[str]
  UNIT: ClassVar[str]
  SOURCE: ClassVar[sources.SourceSpec]
  HOMEPAGE: ClassVar[str] = ""

  def __init__(self, *, chunk_size: int = CHUNK_SIZE, data_dir=None, **kwargs):
    if int(chunk_size) < 1:
      raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    self._chunk_size = int(chunk_size)
    self._sources: dict[str, sources.Source] | None = None
    self._verify_checksums = True
    kwargs.setdefault("file_format", "array_record")
    super().__init__(data_dir=data_dir, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(self.__doc__ or "").strip().split("\n\n")[0],
        features=tfds.features.FeaturesDict({
            "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        }),
        homepage=self.HOMEPAGE,
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

    See :func:`sources.locate` for the search order.  Fast: reads no file
    unless ``verify_checksums`` (then each file is hashed once).

    Returns:
      source file name -> :class:`sources.Source`.

    Raises:
      DataError: a file is missing or fails its checksum.
    """
    found = sources.locate(
        self.SOURCE,
        manual_dir=(Path(manual_dir) if manual_dir
                    else self.default_manual_dir()),
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

    Args:
      manual_dir: directory holding the archive or the extracted files
        (default :meth:`default_manual_dir`).
      download: try the canonical URL if no local copy exists.
      verify_checksums: check published sizes/checksums (and, where known,
        token counts and vocabulary size); tiny test files need False.

    Raises:
      DataError: missing or bad source files (before any tokenisation), or a
        source that cannot be tokenised (e.g. a valid/test word outside the
        vocabulary and no ``<unk>``).
    """
    self._sources = self.locate_sources(
        manual_dir=manual_dir, download=download,
        verify_checksums=verify_checksums)
    self._verify_checksums = verify_checksums
    config = tfds.download.DownloadConfig(
        manual_dir=str(manual_dir) if manual_dir else None)
    self.download_and_prepare(download_config=config)

  # -- writing -----------------------------------------------------------

  @abc.abstractmethod
  def _plan(self, found: Mapping[str, sources.Source], verify: bool) -> _Plan:
    """Reads the sources; returns vocabulary, counts and token streams."""

  def _split_generators(self, dl_manager):
    if self._sources is None:  # download_and_prepare called directly
      self._sources = self.locate_sources(
          manual_dir=getattr(dl_manager, "_manual_dir", None),
          download=True, verify_checksums=True)
    plan = self._plan(self._sources, self._verify_checksums)
    for split in SPLITS:
      if plan.num_tokens[split] == 0:
        raise DataError(
            f"{self.CORPUS}: split {split!r} would be empty; the source "
            "files are too short.")
    self.info.metadata.update({
        "corpus": self.CORPUS,
        "unit": self.UNIT,
        "vocab": list(plan.vocab),
        "boundary_id": int(plan.boundary_id),
        "num_tokens": {s: int(plan.num_tokens[s]) for s in SPLITS},
        "chunk_size": self._chunk_size,
        "checksums_verified": bool(self._verify_checksums),
    })
    self._streams = plan.streams
    return {split: self._generate_examples(split) for split in SPLITS}

  def _generate_examples(self, split: str):
    n, expected = 0, self.info.metadata["num_tokens"][split]
    chunks = _rechunk(self._streams[split](), self._chunk_size)
    for key, chunk in enumerate(chunks):
      n += len(chunk)
      yield key, {"tokens": chunk}
    if n != expected:
      raise DataError(
          f"{self.CORPUS}/{split}: wrote {n} tokens, counted {expected} "
          "before; did a source file change during the build?")

  # -- reading -----------------------------------------------------------

  def as_corpus(self) -> Corpus:
    """The prepared dataset as a :class:`Corpus` of :class:`ChunkedSource`.

    Raises:
      DataError: the dataset is not prepared or its metadata is incomplete.
    """
    if not self.is_prepared():
      raise DataError(f"{self.name} is not prepared in {self.data_dir}.")
    md = self.info.metadata
    missing = [k for k in ("unit", "vocab", "boundary_id", "num_tokens",
                           "chunk_size") if k not in (md or {})]
    if missing:
      raise DataError(
          f"{self.data_dir}: metadata.json lacks {missing}; delete the "
          "directory to rebuild the dataset.")
    splits = {
        split: ChunkedSource(
            self.as_data_source(split=split), md["num_tokens"][split],
            md["chunk_size"], name=f"{self.CORPUS}/{split}")
        for split in SPLITS
    }
    return Corpus(name=self.CORPUS, unit=md["unit"], vocab=tuple(md["vocab"]),
                  boundary_id=int(md["boundary_id"]), splits=splits)


# -- byte / character corpora (enwik8, text8) ------------------------------

_MAHONEY_SIZE = 100_000_000


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
  """[start, stop) of train/valid/test in a stream of n symbols.

  The last 5% is test, the 5% before it valid, the rest train: for
  n = 10^8 exactly 90M/5M/5M (Dai et al. 2019, Sec. 4, following the
  reference ``prep_enwik8.py``: ``num_test_chars = 5000000``).  For other n
  (only with ``verify_checksums=False``) valid = test = n // 20.
  """
  k = n // 20
  return {"train": (0, n - 2 * k), "valid": (n - 2 * k, n - k),
          "test": (n - k, n)}


def _lookup_stream(data: np.ndarray, table: np.ndarray | None,
                   step: int) -> Iterator[np.ndarray]:
  for i in range(0, len(data), step):
    piece = data[i:i + step]
    yield table[piece] if table is not None else piece.astype(np.int32)


class _MahoneyBuilder(_TokenStreamBuilder, skip_registration=True):
  """Shared code of enwik8 and text8: one 10^8-symbol file, 90/5/5 split."""

  @abc.abstractmethod
  def _symbols(self) -> tuple[list[str], np.ndarray | None, int]:
    """(vocab, byte -> id table or None for identity, boundary id)."""

  def _plan(self, found, verify):
    (source,) = found.values()
    data = np.frombuffer(source.read_bytes(), dtype=np.uint8)
    if verify and len(data) != _MAHONEY_SIZE:
      raise DataError(f"{source}: {len(data):,} bytes, expected "
                      f"{_MAHONEY_SIZE:,}.")
    vocab, table, boundary_id = self._symbols()
    if table is not None:
      counts = np.bincount(data, minlength=256)
      bad = np.flatnonzero((counts > 0) & (table < 0))
      if bad.size:
        position = int(np.argmax(data == bad[0]))
        raise DataError(
            f"{source}: byte {int(bad[0])} at offset {position} is outside "
            f"the {self.CORPUS} alphabet {''.join(vocab)!r}.")
    bounds = split_bounds(len(data))
    step = self._chunk_size
    streams = {
        s: (lambda a=a, b=b: _lookup_stream(data[a:b], table, step))
        for s, (a, b) in bounds.items()
    }
    return _Plan(vocab=vocab, boundary_id=boundary_id,
                 num_tokens={s: b - a for s, (a, b) in bounds.items()},
                 streams=streams)


class TxlEnwik8(_MahoneyBuilder):
  """enwik8 (Hutter Prize): the first 10^8 bytes of English Wikipedia XML.

  Byte level over all 256 byte values: token id = byte value, vocab[i] =
  ``chr(i)`` (so ``"".join(vocab[t] for t in ids).encode("latin-1")`` gives
  the bytes back); ``boundary_id`` = 10 (newline).  This models the raw
  bytes, every one of them a token.  The reference implementation instead
  rewrites the file as lines of decimal byte values, one line per newline
  (``prep_enwik8.py``), and builds a 204-symbol vocabulary from its train
  file (``data_utils.py``), so its ids, and its treatment of newline bytes,
  differ.  Split: first 90M bytes train, next 5M valid, last 5M test (Dai et
  al. 2019, Sec. 4).

  Source: ``enwik8`` from http://mattmahoney.net/dc/enwik8.zip, checked
  against its size (100,000,000 bytes), md5
  a1fa5ffddb56f4953e226637dabbb36a and sha256
  2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8 (both of
  the unzipped file, as published).
  """

  CORPUS = "enwik8"
  UNIT = "byte"
  HOMEPAGE = "http://mattmahoney.net/dc/textdata.html"
  SOURCE = sources.SourceSpec(
      corpus="enwik8", archive="enwik8.zip",
      url="http://mattmahoney.net/dc/enwik8.zip",
      files=(sources.SourceFile(
          name="enwik8", member="enwik8", size=_MAHONEY_SIZE,
          md5="a1fa5ffddb56f4953e226637dabbb36a",
          sha256="2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"),))
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Put enwik8.zip or enwik8 into the manual dir."

  def _symbols(self):
    return [chr(i) for i in range(256)], None, 10


TEXT8_VOCAB = (" ",) + tuple("abcdefghijklmnopqrstuvwxyz")


class TxlText8(_MahoneyBuilder):
  """text8: 10^8 characters of cleaned Wikipedia (a-z and space only).

  Character level, 27 symbols in code-point order: id 0 = " " (space), ids
  1..26 = "a".."z"; ``boundary_id`` = 0 (space, the word separator; the file
  has no newline).  Split: first 90M characters train, next 5M valid, last
  5M test (Dai et al. 2019, Sec. 4).  Any byte outside the alphabet raises
  DataError.

  Source: ``text8`` from http://mattmahoney.net/dc/text8.zip.  Mahoney's page
  publishes no checksum; with ``verify_checksums`` the file is checked for
  its documented size (100,000,000 bytes) and alphabet, and for sha256
  6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7 of the
  unzipped file, the value recorded by several independent public projects
  (which also agree on the zip's sha256, a6640522afe8...).
  """

  CORPUS = "text8"
  UNIT = "char"
  HOMEPAGE = "http://mattmahoney.net/dc/textdata.html"
  SOURCE = sources.SourceSpec(
      corpus="text8", archive="text8.zip",
      url="http://mattmahoney.net/dc/text8.zip",
      files=(sources.SourceFile(
          name="text8", member="text8", size=_MAHONEY_SIZE,
          sha256="6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"),),
      note="text8 must hold only the bytes a-z and space, no newline.")
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Put text8.zip or text8 into the manual dir."

  def _symbols(self):
    table = np.full(256, -1, dtype=np.int32)
    for i, symbol in enumerate(TEXT8_VOCAB):
      table[ord(symbol)] = i
    return list(TEXT8_VOCAB), table, 0


# -- line-based corpora (ptb, ptb_char, wikitext) ---------------------------


@dataclasses.dataclass(frozen=True)
class Expected:
  """Documented token counts (with ``<eos>``) and vocabulary size."""

  num_tokens: Mapping[str, int]
  vocab_size: int


class _LineBuilder(_TokenStreamBuilder, skip_registration=True):
  """Word/char corpora stored as one text file per split.

  ``SPLIT_FILES`` maps each split to its file name in ``SOURCE``;
  ``EXPECTED`` holds documented counts, checked when ``verify_checksums``.
  """

  SPLIT_FILES: ClassVar[Mapping[str, str]]
  EXPECTED: ClassVar[Expected | None] = None

  @staticmethod
  def symbols(line: str) -> list[str]:
    """The symbols of one line, without its ``<eos>``: ``line.split()``."""
    return line.split()

  def _count(self, source: sources.Source) -> tuple[collections.Counter, int]:
    """(symbol counts in first-occurrence order, tokens incl. <eos>)."""
    counter, n = collections.Counter(), 0
    with source.open_text() as f:
      for line in f:
        symbols = self.symbols(line)
        counter.update(symbols)
        n += len(symbols) + 1
    return counter, n

  def _encode(self, source: sources.Source, index: Mapping[str, int],
              step: int) -> Iterator[np.ndarray]:
    """Yields the ids of ``source`` in pieces of about ``step`` tokens.

    Raises:
      DataError: a symbol outside ``index`` while the vocabulary has no
        ``<unk>``.
    """
    eos, unk = index[EOS], index.get(UNK, -1)
    get = index.get
    buf: list[int] = []
    with source.open_text() as f:
      for lineno, line in enumerate(f, 1):
        symbols = self.symbols(line)
        ids = [get(s, unk) for s in symbols]
        if unk < 0 and -1 in ids:
          symbol = symbols[ids.index(-1)]
          raise DataError(
              f"{self.CORPUS}: {source} line {lineno}: {symbol!r} is not in "
              f"the vocabulary built from {self.SPLIT_FILES['train']}, which "
              f"has no {UNK} to map it to.")
        buf += ids
        buf.append(eos)
        if len(buf) >= step:
          yield np.asarray(buf, dtype=np.int32)
          buf = []
    if buf:
      yield np.asarray(buf, dtype=np.int32)

  def _plan(self, found, verify):
    by_split = {s: found[name] for s, name in self.SPLIT_FILES.items()}
    counter, n_train = self._count(by_split["train"])
    counter.pop(EOS, None)
    # <eos> first, then descending count; sorted() is stable, so ties keep
    # first-occurrence order (= Counter.most_common in the reference).
    vocab = [EOS] + sorted(counter, key=counter.__getitem__, reverse=True)
    index = {s: i for i, s in enumerate(vocab)}
    step = self._chunk_size
    num_tokens = {"train": n_train}
    for split in ("valid", "test"):  # also finds out-of-vocabulary symbols
      num_tokens[split] = sum(
          len(p) for p in self._encode(by_split[split], index, step))
    if verify and self.EXPECTED is not None:
      got = (dict(num_tokens), len(vocab))
      want = (dict(self.EXPECTED.num_tokens), self.EXPECTED.vocab_size)
      if got != want:
        raise DataError(
            f"{self.CORPUS}: token counts {got[0]} and vocabulary size "
            f"{got[1]} differ from the documented {want[0]} and {want[1]}; "
            "the source files are not the canonical ones.")
    streams = {
        s: (lambda src=src: self._encode(src, index, step))
        for s, src in by_split.items()
    }
    return _Plan(vocab=vocab, boundary_id=index[EOS], num_tokens=num_tokens,
                 streams=streams)


_PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"


def _ptb_source(corpus: str) -> sources.SourceSpec:
  md5 = {"train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
         "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
         "test": "8b80168b89c18661a38ef683c0dc3721"}
  return sources.SourceSpec(
      corpus=corpus, archive="simple-examples.tgz", url=_PTB_URL,
      files=tuple(
          sources.SourceFile(name=f"ptb.{s}.txt",
                             member=f"simple-examples/data/ptb.{s}.txt",
                             md5=md5[s])
          for s in SPLITS))


class TxlPtb(_LineBuilder):
  """Penn Treebank, Mikolov's preprocessed word-level version.

  Word level: each line split on whitespace plus one ``<eos>``; vocabulary
  from train (``<eos>`` = id 0, then by descending count, ties by first
  occurrence; reference ``utils/vocabulary.py``); ``boundary_id`` = id of
  ``<eos>``.  A valid/test word outside the vocabulary maps to ``<unk>`` if
  the vocabulary has it, else raises DataError.  Expected: 929,589 / 73,760
  / 82,430 tokens, vocabulary 10,000 (checked with ``verify_checksums``).

  Source: ``simple-examples/data/ptb.{train,valid,test}.txt`` from
  http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz, md5s train
  f26c4b92c5fdc7b3f8c7cdcb991d8420, valid aa0affc06ff7c36e977d7cd49e3839bf,
  test 8b80168b89c18661a38ef683c0dc3721.
  """

  CORPUS = "ptb"
  UNIT = "word"
  HOMEPAGE = "http://www.fit.vutbr.cz/~imikolov/rnnlm/"
  SOURCE = _ptb_source("ptb")
  SPLIT_FILES = {s: f"ptb.{s}.txt" for s in SPLITS}
  EXPECTED = Expected({"train": 929_589, "valid": 73_760, "test": 82_430},
                      10_000)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put simple-examples.tgz or ptb.{train,valid,test}.txt into the manual "
      "dir.")


class TxlPtbChar(_LineBuilder):
  """Penn Treebank at character level, derived from the word-level files.

  Each line becomes the characters of its words with the word-boundary
  symbol "_" between words, then one ``<eos>`` (the layout of Mikolov's
  ``ptb.char.*.txt``); ``<unk>`` and ``N`` are spelled out as characters.
  Vocabulary from train (``<eos>`` = id 0, then characters by descending
  count, ties by first occurrence); unit "char"; ``boundary_id`` = id of
  ``<eos>``.  A character outside the vocabulary raises DataError, and so
  does a "_" inside a word.

  Source: the same files and md5s as :class:`TxlPtb`.
  """

  CORPUS = "ptb_char"
  UNIT = "char"
  HOMEPAGE = "http://www.fit.vutbr.cz/~imikolov/rnnlm/"
  SOURCE = _ptb_source("ptb_char")
  SPLIT_FILES = {s: f"ptb.{s}.txt" for s in SPLITS}
  MANUAL_DOWNLOAD_INSTRUCTIONS = TxlPtb.MANUAL_DOWNLOAD_INSTRUCTIONS

  @staticmethod
  def symbols(line: str) -> list[str]:
    """Characters of the words of ``line`` joined by "_" (no ``<eos>``).

    Raises:
      DataError: a word contains "_" (the result would be ambiguous).
    """
    words = line.split()
    if any(WORD_BOUNDARY in w for w in words):
      raise DataError(
          f"ptb_char: the line {line.strip()!r} has a word containing the "
          f"word-boundary symbol {WORD_BOUNDARY!r}.")
    return list(WORD_BOUNDARY.join(words))


def _wikitext_source(corpus: str, top: str, md5: Mapping[str, str] | None,
                     note: str = "") -> sources.SourceSpec:
  return sources.SourceSpec(
      corpus=corpus, archive=f"{top}-v1.zip",
      url=("https://s3.amazonaws.com/research.metamind.io/wikitext/"
           f"{top}-v1.zip"),
      files=tuple(
          sources.SourceFile(name=f"wiki.{s}.tokens",
                             member=f"{top}/wiki.{s}.tokens",
                             md5=md5[s] if md5 else None)
          for s in SPLITS),
      note=note)


class TxlWikitext2(_LineBuilder):
  """WikiText-2 (v1, tokenized), word level.

  Tokenised as :class:`TxlPtb` (a blank line gives one ``<eos>``).
  Expected: 2,088,628 / 217,646 / 245,569 tokens, vocabulary 33,278
  (Merity et al. 2016, Table 1; checked with ``verify_checksums``).

  Source: ``wikitext-2/wiki.{train,valid,test}.tokens`` from
  https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip,
  md5s train 34a77ebe59551b3a3b3d8c0a2797c976, valid
  d756d22ab2310e7e60c094bea5c5a8eb, test 781c9418ab9414bd09e4aad825aae752.
  """

  CORPUS = "wikitext2"
  UNIT = "word"
  HOMEPAGE = ("https://www.salesforce.com/blog/"
              "the-wikitext-long-term-dependency-language-modeling-dataset/")
  SOURCE = _wikitext_source(
      "wikitext2", "wikitext-2",
      {"train": "34a77ebe59551b3a3b3d8c0a2797c976",
       "valid": "d756d22ab2310e7e60c094bea5c5a8eb",
       "test": "781c9418ab9414bd09e4aad825aae752"})
  SPLIT_FILES = {s: f"wiki.{s}.tokens" for s in SPLITS}
  EXPECTED = Expected({"train": 2_088_628, "valid": 217_646, "test": 245_569},
                      33_278)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put wikitext-2-v1.zip or wiki.{train,valid,test}.tokens into the "
      "manual dir.")


class TxlWikitext103(_LineBuilder):
  """WikiText-103 (v1, tokenized), word level.

  Tokenised as :class:`TxlPtb`.  No published checksums are known for these
  files, so none are checked; with ``verify_checksums`` the build instead
  checks the documented counts (Merity et al. 2016, Table 1): 103,227,021 /
  217,646 / 245,569 tokens including ``<eos>``, vocabulary 267,735 (the
  reference implementation's n_token for wt103).  The check runs after the
  counting pass, before any record is written.

  Source: ``wikitext-103/wiki.{train,valid,test}.tokens`` from
  https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip.
  """

  CORPUS = "wikitext103"
  UNIT = "word"
  HOMEPAGE = TxlWikitext2.HOMEPAGE
  SOURCE = _wikitext_source(
      "wikitext103", "wikitext-103", None,
      note=("No published checksum is known for WikiText-103; with "
            "verify_checksums=True the build checks the documented counts "
            "instead: 103,227,021 / 217,646 / 245,569 tokens (with <eos>), "
            "vocabulary 267,735."))
  SPLIT_FILES = {s: f"wiki.{s}.tokens" for s in SPLITS}
  EXPECTED = Expected(
      {"train": 103_227_021, "valid": 217_646, "test": 245_569}, 267_735)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put wikitext-103-v1.zip or wiki.{train,valid,test}.tokens into the "
      "manual dir.")


BUILDERS: dict[str, type[_TokenStreamBuilder]] = {
    b.CORPUS: b
    for b in (TxlEnwik8, TxlText8, TxlPtb, TxlPtbChar, TxlWikitext2,
              TxlWikitext103)
}
