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
lm1b           txl_lm1b       word   words + ``<S>`` per sentence, and the
                                     sentence lengths (see :class:`TxlLm1b`)
=============  =============  =====  ==========================================

Word-level tokenisation follows the reference implementation (Dai et al.
2019, ``pytorch/utils/vocabulary.py`` and ``pytorch/data_utils.py``): each
line is split on whitespace (``str.split()``), one ``<eos>`` is appended per
line (blank lines give a lone ``<eos>``), no lower-casing, and the vocabulary
is built from train only: ``<eos>`` first (id 0), then the train symbols by
descending count, ties broken by first occurrence in train (what
``Counter.most_common`` does in the reference's ``Vocab.build_vocab``).
One Billion Word (lm1b) is by sentence instead, with ``<S>`` and a
vocabulary file or count threshold: see :class:`TxlLm1b`.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import itertools
import threading
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from transformer_xl.datasets import Corpus, DataError, sentence_offsets, sources

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
      # A batch read costs a thread-pool start in array_record: only worth it
      # for several records (one record is the common case for short reads).
      if len(todo) > 1 and hasattr(self._records, "__getitems__"):
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
  Every key of ``streams`` becomes a tfds split of chunk records: "train",
  "valid", "test", plus any extra int32 streams a builder stores (lm1b: the
  sentence lengths).  ``metadata`` holds extra entries for metadata.json.
  """

  vocab: list[str]
  boundary_id: int
  num_tokens: dict[str, int]
  streams: dict[str, Callable[[], Iterator[np.ndarray]]]
  metadata: dict = dataclasses.field(default_factory=dict)


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
  (a :class:`sources.SourceSpec`, or a :class:`sources.ShardedSourceSpec`
  with its own :meth:`locate_sources`), ``HOMEPAGE`` and implement
  :meth:`_plan`.

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
    self.info.metadata.update(plan.metadata)
    self._streams = plan.streams
    self._counts = {s: int(n) for s, n in plan.num_tokens.items()}
    return {split: self._generate_examples(split) for split in plan.streams}

  def _generate_examples(self, split: str):
    n, expected = 0, self._counts[split]
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


# -- One Billion Word (lm1b) -------------------------------------------------

LM1B_S = "<S>"  # sentence boundary, the reference's add_double_eos symbol
LM1B_UNK = "<UNK>"  # the reference's (and 1b_word_vocab.txt's) unknown word
LM1B_MIN_FREQ = 3  # Chelba et al. 2013: words seen < 3 times are <UNK>
LM1B_VOCAB_FILE = "1b_word_vocab.txt"
LM1B_VOCAB_SIZE = 793_471  # lines of the reference's 1b_word_vocab.txt
LM1B_CHUNK_SIZE = 8192  # tokens per record: sentences are read at random
SENTENCE_LENGTHS = "_sentence_lengths"  # suffix of the sentence-length splits
_LM1B_TOP = "1-billion-word-language-modeling-benchmark-r13output"
_LM1B_URL = ("http://www.statmt.org/lm-benchmark/"
             f"{_LM1B_TOP}.tar.gz")


def _lm1b_source() -> sources.ShardedSourceSpec:
  train = tuple(
      sources.SourceFile(
          name=f"news.en-{i:05d}-of-00100",
          member=(f"{_LM1B_TOP}/training-monolingual.tokenized.shuffled/"
                  f"news.en-{i:05d}-of-00100"))
      for i in range(1, 100))
  heldout = sources.SourceFile(
      name="news.en.heldout-00000-of-00050",
      member=(f"{_LM1B_TOP}/heldout-monolingual.tokenized.shuffled/"
              "news.en.heldout-00000-of-00050"))
  return sources.ShardedSourceSpec(
      corpus="lm1b", archive=f"{_LM1B_TOP}.tar.gz", url=_LM1B_URL,
      train=train, heldout=heldout, extras=(LM1B_VOCAB_FILE,),
      note=("No published checksum is known for the One Billion Word files; "
            "with verify_checksums=True the build checks the documented "
            "structure instead: all 99 training shards "
            "news.en-00001..00099-of-00100 and the held-out shard "
            "news.en.heldout-00000-of-00050 present, and, if "
            f"{LM1B_VOCAB_FILE} is used, its {LM1B_VOCAB_SIZE:,} entries. "
            f"Optional: the reference vocabulary {LM1B_VOCAB_FILE} "
            "(https://github.com/rafaljozefowicz/lm/raw/master/"
            f"{LM1B_VOCAB_FILE}) in the manual dir; without it the "
            "vocabulary is built from the training shards."))


def build_lm1b_vocab(counts: Mapping[str, int],
                     min_freq: int = LM1B_MIN_FREQ) -> list[str]:
  """The lm1b vocabulary built from training counts (no vocabulary file).

  Rule (deterministic; Chelba et al. 2013's vocabulary rule "words seen
  fewer than 3 times in training become ``<UNK>``", laid out like the
  reference's ``1b_word_vocab.txt``, which lists "symbol count" lines by
  descending count with ``<S>`` and ``<UNK>`` among the words):

  * ``counts`` are over the training stream as stored: every word of every
    sentence, plus one ``<S>`` per sentence;
  * a symbol with count >= ``min_freq`` is kept; ``<S>`` and ``<UNK>`` are
    always kept; ``<UNK>``'s count is the sum of the counts of the symbols
    dropped (plus any literal ``<UNK>`` in the text);
  * order: descending count, ties by code-point order of the symbol (so the
    result does not depend on the order the shards are read in).

  Args:
    counts: symbol -> count (e.g. a ``collections.Counter``).
    min_freq: smallest count of a kept word, >= 1.

  Returns:
    The vocabulary, id -> symbol.

  Raises:
    ValueError: min_freq < 1.
  """
  if min_freq < 1:
    raise ValueError(f"min_freq must be >= 1, got {min_freq}")
  counts = dict(counts)
  s_count = counts.pop(LM1B_S, 0)
  unk_count = counts.pop(LM1B_UNK, 0)
  kept = [(c, w) for w, c in counts.items() if c >= min_freq]
  unk_count += sum(c for c in counts.values() if c < min_freq)
  kept += [(s_count, LM1B_S), (unk_count, LM1B_UNK)]
  kept.sort(key=lambda cw: (-cw[0], cw[1]))
  return [w for _, w in kept]


def read_lm1b_vocab_file(source: sources.Source) -> list[str]:
  """Reads a vocabulary file as the reference does (``_build_from_file``).

  One entry per line; the symbol is the line's first whitespace-separated
  field (``1b_word_vocab.txt`` lines are "symbol count"); a repeated symbol
  keeps its first id.

  Returns:
    id -> symbol.

  Raises:
    DataError: a blank line (the reference fails on it), or ``<S>`` or
      ``<UNK>`` missing (the reference needs ``<UNK>``; ``<S>`` is the
      sentence boundary).
  """
  vocab, seen = [], set()
  with source.open_text() as f:
    for lineno, line in enumerate(f, 1):
      fields = line.split()
      if not fields:
        raise DataError(f"{source} line {lineno} is blank; every line of a "
                        "vocabulary file must start with a symbol.")
      if fields[0] not in seen:
        seen.add(fields[0])
        vocab.append(fields[0])
  for special in (LM1B_S, LM1B_UNK):
    if special not in seen:
      raise DataError(f"{source} lacks the symbol {special}, which the lm1b "
                      "vocabulary needs (sentence boundary and unknown word).")
  return vocab


class ChunkedSentenceIndex:
  """A :class:`~transformer_xl.datasets.SentenceIndex` over stored lengths.

  The lengths (tokens per sentence, int32) are stored like a token stream,
  in the chunk records of the split ``<split>_sentence_lengths``.  The first
  :meth:`read_offsets` reads all of them (for lm1b train about 30M
  sentences: 120 MB read, 240 MB of int64 offsets kept) and keeps the
  offsets; later calls slice them.  Thread-safe; pickles without the
  offsets.

  Args:
    lengths: a :class:`ChunkedSource` (or any TokenSource) whose tokens are
      the sentence lengths; its ``num_tokens`` is the number of sentences.
    num_tokens: tokens of the split's token stream (the lengths' sum).
    name: for error messages, e.g. "lm1b/train".
  """

  def __init__(self, lengths, num_tokens: int, name: str = ""):
    self._lengths = lengths
    self._num_tokens = int(num_tokens)
    self._name = name
    self._offsets: np.ndarray | None = None
    self._lock = threading.Lock()

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_offsets"], state["_lock"] = None, None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  @property
  def num_sentences(self) -> int:
    """Number of sentences of the split."""
    return int(self._lengths.num_tokens)

  def _all_offsets(self) -> np.ndarray:
    with self._lock:
      if self._offsets is None:
        lengths = self._lengths.read(0, self.num_sentences)
        if lengths.size and (int(lengths.min()) < 1
                             or int(lengths.sum(dtype=np.int64))
                             != self._num_tokens):
          raise DataError(
              f"{self._name}: the stored sentence lengths do not add up to "
              f"the {self._num_tokens} tokens of the split (or one is < 1); "
              "the prepared dataset is corrupt, delete its directory to "
              "rebuild it.")
        offsets = sentence_offsets(lengths)
        offsets.flags.writeable = False
        self._offsets = offsets
      return self._offsets

  def read_offsets(self, start: int, stop: int) -> np.ndarray:
    """Offsets ``[start, stop)``: int64, shape [stop - start].

    Offset ``i`` is the stream position of sentence ``i``'s first token;
    offset ``num_sentences`` is the stream length.

    Raises:
      IndexError: the range is outside ``[0, num_sentences + 1]`` or
        reversed.
      DataError: the stored lengths are corrupt.
    """
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop <= self.num_sentences + 1:
      raise IndexError(f"range [{start}, {stop}) outside "
                       f"[0, {self.num_sentences + 1}]")
    return self._all_offsets()[start:stop].copy()


class TxlLm1b(_TokenStreamBuilder):
  """One Billion Word benchmark (Chelba et al. 2013), word level, by sentence.

  Tokenisation (reference ``utils/vocabulary.py``, ``add_double_eos``):
  each line of a shard is one sentence; its words are ``line.split()`` (no
  lower-casing).  The reference wraps a sentence as ``<S> w1 ... wn <S>``;
  here each split is stored as one stream in which every sentence is
  followed by ONE ``<S>`` (``w1 ... wn <S>``), so ``<S>`` plays the role
  ``<eos>`` plays for WikiText: ``boundary_id`` is the id of ``<S>``, the
  evaluator's ``[<S>] + stream`` gives exactly the reference's pairs
  (``<S>``->w1, ..., wn->``<S>``) for every sentence, and valid/test ppl
  scores every word and one ``<S>`` per sentence exactly once.  A word
  outside the vocabulary becomes ``<UNK>`` (the reference's spelling, as in
  ``1b_word_vocab.txt``; the reference's ``Vocab`` looks up ``'<UNK>'``).

  Sentence boundaries: besides "train", "valid" and "test", the dataset
  stores for each split the splits ``<split>_sentence_lengths``: chunk
  records of int32 sentence lengths (words + 1), in stream order; the
  corpus exposes them as ``Corpus.sentence_offsets[split]``
  (:class:`ChunkedSentenceIndex`), which the training iterator
  (``input_pipeline.ShuffledSentenceIterator``) shuffles.

  Splits: train = every training shard present, in shard order (all 99,
  ``news.en-00001`` .. ``news.en-00099-of-00100``, when
  ``verify_checksums``); valid = test = held-out shard
  ``news.en.heldout-00000-of-00050``, as the reference does (its
  ``getdata.sh`` copies that shard to both valid.txt and test.txt).  The
  held-out shard is fixed (choosing another would need a separate dataset
  version; not provided).

  Vocabulary: if ``1b_word_vocab.txt`` (the reference's file, from
  https://github.com/rafaljozefowicz/lm, 793,471 entries incl. ``<S>`` and
  ``<UNK>``) is in the manual dir it is used as the reference uses it: one
  entry per line, the first field is the symbol, id = line number (checked
  for 793,471 entries when ``verify_checksums``).  Otherwise the vocabulary
  is built from the training shards by :func:`build_lm1b_vocab` (count >= 3,
  ``<S>`` and ``<UNK>`` always in, by descending count then code point); its
  ids then differ from the reference file's.  The metadata records which
  (``vocab_source``), and the training shards used (``train_shards``).

  Source: ``1-billion-word-language-modeling-benchmark-r13output.tar.gz``
  from http://www.statmt.org/lm-benchmark/ (about 1.7 GB), or its extracted
  tree.  No checksum is published; with ``verify_checksums`` the documented
  structure is checked instead (see ``SOURCE.note``).  A tarball is
  extracted once into ``<data_dir>/downloads/extracted/lm1b`` (about 4 GB;
  may be deleted after the build).  Building reads the training shards
  twice (counting, then encoding): several minutes for the full corpus.
  Default chunk size :data:`LM1B_CHUNK_SIZE` (training reads short random
  sentences; smaller records mean less decoding per sentence).
  """

  CORPUS = "lm1b"
  UNIT = "word"
  HOMEPAGE = "https://www.statmt.org/lm-benchmark/"
  SOURCE = _lm1b_source()
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f"Put {_LM1B_TOP}.tar.gz or its extracted directory tree (and "
      f"optionally {LM1B_VOCAB_FILE}) into the manual dir.")

  def __init__(self, *, chunk_size: int = LM1B_CHUNK_SIZE, data_dir=None,
               **kwargs):
    super().__init__(chunk_size=chunk_size, data_dir=data_dir, **kwargs)

  def locate_sources(
      self,
      *,
      manual_dir=None,
      download: bool = True,
      verify_checksums: bool = True,
  ) -> dict[str, sources.Source]:
    """Finds the shards (see :func:`sources.locate_sharded`).

    With ``verify_checksums`` all 99 training shards must be present (the
    documented structure; no checksum is published), else at least one.

    Returns:
      file name -> :class:`sources.Source`: the training shards found (in
      shard order), the held-out shard, and ``1b_word_vocab.txt`` if it is
      in the manual dir.

    Raises:
      DataError: shards missing or an unreadable/incomplete archive.
    """
    return sources.locate_sharded(
        self.SOURCE,
        manual_dir=(Path(manual_dir) if manual_dir
                    else self.default_manual_dir()),
        download_dir=Path(self.data_dir_root) / "downloads",
        download=download,
        require_all_train=verify_checksums,
    )

  @staticmethod
  def _sentence_lengths(source: sources.Source,
                        counter: collections.Counter | None) -> np.ndarray:
    """int32 [n_lines]: words + 1 per line; counts the words if asked."""
    lengths = []
    with source.open_text() as f:
      for line in f:
        words = line.split()
        if counter is not None:
          counter.update(words)
        lengths.append(len(words) + 1)
    return np.asarray(lengths, dtype=np.int32)

  @staticmethod
  def _encode(source: sources.Source, index: Mapping[str, int],
              step: int) -> Iterator[np.ndarray]:
    """Ids of ``source``, each sentence followed by ``<S>``, in pieces."""
    boundary, unk = index[LM1B_S], index[LM1B_UNK]
    get, buf = index.get, []
    with source.open_text() as f:
      for line in f:
        buf.extend(map(get, line.split(), itertools.repeat(unk)))
        buf.append(boundary)
        if len(buf) >= step:
          yield np.asarray(buf, dtype=np.int32)
          buf = []
    if buf:
      yield np.asarray(buf, dtype=np.int32)

  def _plan(self, found, verify):
    spec = self.SOURCE
    train = [found[f.name] for f in spec.train if f.name in found]
    heldout = found[spec.heldout.name]
    vocab_file = found.get(LM1B_VOCAB_FILE)
    counter = collections.Counter() if vocab_file is None else None
    train_lengths = [self._sentence_lengths(src, counter) for src in train]
    heldout_lengths = self._sentence_lengths(heldout, None)
    n_train_sentences = sum(len(x) for x in train_lengths)
    if vocab_file is not None:
      vocab = read_lm1b_vocab_file(vocab_file)
      if verify and len(vocab) != LM1B_VOCAB_SIZE:
        raise DataError(
            f"{vocab_file} has {len(vocab):,} entries, the reference's "
            f"{LM1B_VOCAB_FILE} has {LM1B_VOCAB_SIZE:,}; replace it with the "
            "reference file, or pass verify_checksums=False to use it on "
            "purpose.")
      vocab_source = f"file {LM1B_VOCAB_FILE}"
    else:
      counter[LM1B_S] += n_train_sentences
      vocab = build_lm1b_vocab(counter)
      vocab_source = (f"built from the training shards (min_freq "
                      f"{LM1B_MIN_FREQ}, by descending count, then code point)")
    index = {s: i for i, s in enumerate(vocab)}
    step = self._chunk_size
    lengths = {"train": train_lengths, "valid": [heldout_lengths],
               "test": [heldout_lengths]}
    streams = {
        "train": lambda: itertools.chain.from_iterable(
            self._encode(src, index, step) for src in train),
        "valid": lambda: self._encode(heldout, index, step),
        "test": lambda: self._encode(heldout, index, step),
    }
    num_tokens = {s: int(sum(int(x.sum(dtype=np.int64)) for x in lengths[s]))
                  for s in SPLITS}
    num_sentences = {s: int(sum(len(x) for x in lengths[s])) for s in SPLITS}
    for s in SPLITS:
      streams[s + SENTENCE_LENGTHS] = lambda s=s: iter(lengths[s])
      num_tokens[s + SENTENCE_LENGTHS] = num_sentences[s]
    return _Plan(
        vocab=vocab, boundary_id=index[LM1B_S], num_tokens=num_tokens,
        streams=streams,
        metadata={
            "num_sentences": num_sentences,
            "vocab_source": vocab_source,
            "train_shards": [src.file.name for src in train],
            "heldout_shard": spec.heldout.name,
        })

  def as_corpus(self) -> Corpus:
    """The prepared dataset as a :class:`Corpus` with ``sentence_offsets``.

    ``splits`` are :class:`ChunkedSource` token streams, as for every
    corpus; ``sentence_offsets[split]`` is a :class:`ChunkedSentenceIndex`
    over the split's stored sentence lengths.

    Raises:
      DataError: the dataset is not prepared or its metadata is incomplete.
    """
    corpus = super().as_corpus()
    md = self.info.metadata
    if "num_sentences" not in md:
      raise DataError(
          f"{self.data_dir}: metadata.json lacks num_sentences; delete the "
          "directory to rebuild the dataset.")
    index = {
        split: ChunkedSentenceIndex(
            ChunkedSource(
                self.as_data_source(split=split + SENTENCE_LENGTHS),
                md["num_sentences"][split], md["chunk_size"],
                name=f"{self.CORPUS}/{split}{SENTENCE_LENGTHS}",
                cache_chunks=0),
            num_tokens=corpus.splits[split].num_tokens,
            name=f"{self.CORPUS}/{split}")
        for split in SPLITS
    }
    return dataclasses.replace(corpus, sentence_offsets=index)


BUILDERS: dict[str, type[_TokenStreamBuilder]] = {
    b.CORPUS: b
    for b in (TxlEnwik8, TxlText8, TxlPtb, TxlPtbChar, TxlWikitext2,
              TxlWikitext103, TxlLm1b)
}


def encode_text(corpus: Corpus, text: str) -> np.ndarray:
  """Token ids of ``text`` under ``corpus``'s tokenisation and vocabulary.

  The same rules as the corpus's builder: word level (ptb, wikitext*) split
  each line on whitespace and end it with ``<eos>`` (lm1b: ``<S>``); ptb_char
  spells words with "_" between them and ``<eos>`` per line; text8 maps
  space and a..z; enwik8 takes the UTF-8 bytes.  Unknown words become
  ``<unk>`` / ``<UNK>`` where the vocabulary has one.

  Args:
    corpus: a loaded :class:`Corpus` (its ``name`` picks the rules).
    text: the text.

  Returns:
    int32 [N] token ids.

  Raises:
    DataError: a symbol outside the vocabulary with no unknown-word symbol,
      or a character text8 does not have.
  """
  index = {s: i for i, s in enumerate(corpus.vocab)}
  if corpus.name == "enwik8":
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
  if corpus.name == "text8":
    bad = sorted(set(text) - set(TEXT8_VOCAB))
    if bad:
      raise DataError(f"text8 has only space and a-z; the text has {bad[:10]}.")
    return np.asarray([index[c] for c in text], dtype=np.int32)
  builder = BUILDERS[corpus.name]
  symbols_of = getattr(builder, "symbols", str.split)
  end = LM1B_S if corpus.name == "lm1b" else EOS
  unk = index.get(LM1B_UNK if corpus.name == "lm1b" else UNK, -1)
  ids = []
  for lineno, line in enumerate(text.splitlines(), 1):
    for symbol in symbols_of(line):
      i = index.get(symbol, unk)
      if i < 0:
        raise DataError(f"{corpus.name}: line {lineno}: {symbol!r} is not in the vocabulary, "
                        "which has no unknown-word symbol to map it to.")
      ids.append(i)
    ids.append(index[end])
  return np.asarray(ids, dtype=np.int32)
