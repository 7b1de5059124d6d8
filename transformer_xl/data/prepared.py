"""A prepared dataset read back: its records, and its files checked.

Every corpus is stored as a tfds dataset (``storage.py`` writes it) whose
split ``s`` holds consecutive records ``{"tokens": int32[<= chunk_size]}``,
record ``i`` holding tokens ``[i * chunk_size, (i + 1) * chunk_size)`` of
the split's stream (only the last may be shorter); the vocabulary, unit,
boundary id, chunk size and per-split token counts are in its
``metadata.json``.  Here is what reads it back, never trusting the files:
``ChunkedSource`` (a split's token stream, each record checked for its
length), ``ChunkedSentenceIndex`` (sentence or document offsets from
stored lengths), ``PreparedInfo`` (tfds's ``dataset_info.json`` reading,
checked), ``metadata_problem`` and ``counts_problem`` (the entries of
``metadata.json``), and ``damaged_message``, the one message of a damaged
dataset (what failed, and how to rebuild it).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Mapping

import numpy as np
import tensorflow_datasets as tfds

from transformer_xl.data.checks import is_int
from transformer_xl.data.corpus import DataError, sentence_offsets

SPLITS = ("train", "valid", "test")
# The metadata.json entries every prepared dataset has (``TokenStreamBuilder.metadata``).
METADATA_KEYS = ("unit", "vocab", "boundary_id", "num_tokens", "chunk_size")


def damaged_message(path: str, what: str) -> str:
  """The message for a damaged prepared dataset: what failed, and how to rebuild."""
  return (
      f"The prepared dataset in {path} is damaged: {what}. Delete it to rebuild it "
      f"(rm -r {path}); the next run prepares it again from the source files."
  )


def first_line(err: BaseException) -> str:
  """``Kind: first line of the message`` (at most 200 characters), for a message."""
  text = (str(err).strip().splitlines() or [""])[0][:200]
  return f"{type(err).__name__}: {text}" if text else type(err).__name__


class PreparedInfo(tfds.core.DatasetInfo):
  """tfds's ``DatasetInfo``, whose reading of a prepared dataset's files is checked.

  tfds reads ``dataset_info.json`` (and ``features.json``) of a prepared
  dataset when its builder is made, and fails on a damaged one with
  whatever the parser raises (``ParseError``, ``UnicodeDecodeError``,
  ``AssertionError`` for a missing version, ...).  Here that is a
  ``DataError`` that names the folder and says to delete it.  The split
  files it names must be files of that folder: tfds would follow a
  ``filepathTemplate`` with a ``..`` or an absolute path to records
  elsewhere, which no preparation writes (a copied or hand-edited file).
  """

  def read_from_directory(self, dataset_info_dir) -> None:
    """tfds's ``read_from_directory``, then the split files checked to lie in the folder.

    Raises:
      DataError: the files cannot be read or parsed, list no split, or a
        split's files lie outside ``dataset_info_dir``.
    """
    folder = os.fspath(dataset_info_dir)
    try:
      super().read_from_directory(dataset_info_dir)
    except Exception as err:  # pylint: disable=broad-except  (tfds raises many kinds)
      raise DataError(
          damaged_message(folder, f"its dataset_info.json cannot be read ({first_line(err)})")
      ) from None
    if not self.splits:  # tfds reads a missing or empty "splits" as none, then a KeyError
      raise DataError(damaged_message(folder, "its dataset_info.json lists no split"))
    if "://" in folder:  # a remote folder: its paths are URLs, not resolved here
      return
    inside = os.path.normpath(os.path.abspath(folder))
    for name, split in self.splits.items():
      try:
        paths = [os.fspath(p) for p in split.filepaths]
      except Exception as err:  # pylint: disable=broad-except  (a template tfds cannot expand)
        raise DataError(
            damaged_message(folder, f"its dataset_info.json names no files ({first_line(err)})")
        ) from None
      for path in paths:
        if os.path.dirname(os.path.normpath(os.path.join(inside, path))) != inside:
          raise DataError(
              damaged_message(
                  folder,
                  f"its dataset_info.json names files outside the folder for split "
                  f"{name!r} ({path})",
              )
          )


class ChunkedSource:
  """A ``TokenSource`` over chunk records.

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
    path: the prepared dataset's directory, for error messages.

  Raises:
    DataError: the number of records does not match ``num_tokens`` and
      ``chunk_size``.
  """

  def __init__(
      self,
      records,
      num_tokens: int,
      chunk_size: int,
      name: str = "",
      cache_chunks: int = 64,
      path: str = "",
  ):
    self._path = str(path)
    self._records = records
    self._num_tokens = int(num_tokens)
    self._chunk_size = int(chunk_size)
    self._name = name
    self._cache_chunks = int(cache_chunks)
    self._cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    self._lock = threading.Lock()
    expected = -(-self._num_tokens // self._chunk_size)
    if len(records) != expected:
      raise DataError(
          damaged_message(
              self._path or name,
              f"{name}: {len(records)} records stored, expected {expected} "
              f"({self._num_tokens} tokens in chunks of {self._chunk_size})",
          )
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
      try:
        if len(todo) > 1 and hasattr(self._records, "__getitems__"):
          records = self._records.__getitems__(todo)
        else:
          records = [self._records[k] for k in todo]
      except (RuntimeError, ValueError, OSError, KeyError) as err:
        # array_record / riegeli report a damaged file as RuntimeError or ValueError.
        raise DataError(
            damaged_message(
                self._path or self._name,
                f"{self._name}: records {todo[0]}..{todo[-1]} cannot be read ({err})",
            )
        ) from None
      for key, record in zip(todo, records):
        try:
          tokens = np.asarray(record["tokens"], dtype=np.int32)
        except (TypeError, ValueError, KeyError) as err:
          raise DataError(
              damaged_message(
                  self._path or self._name,
                  f"{self._name}: record {key} does not decode ({err})",
              )
          ) from None
        c = self._chunk_size
        expected = min(c, self._num_tokens - key * c)
        if tokens.shape != (expected,):
          raise DataError(
              damaged_message(
                  self._path or self._name,
                  f"{self._name}: record {key} holds {tokens.size} tokens, expected {expected}",
              )
          )
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
      raise IndexError(f"range [{start}, {stop}) outside [0, {self._num_tokens}]")
    if start == stop:
      return np.zeros([0], np.int32)
    c = self._chunk_size
    first, last = start // c, (stop - 1) // c
    pieces = self._fetch(list(range(first, last + 1)))
    offset = first * c
    if len(pieces) == 1:
      return pieces[0][start - offset : stop - offset].copy()
    return np.concatenate(pieces)[start - offset : stop - offset]


class ChunkedSentenceIndex:
  """A ``SentenceIndex`` over stored lengths.

  The lengths (tokens per sentence, int32) are stored like a token stream,
  in the chunk records of the split ``<split>_sentence_lengths``.  The first
  ``read_offsets`` reads all of them (for lm1b train about 30M
  sentences: 120 MB read, 240 MB of int64 offsets kept) and keeps the
  offsets; later calls slice them.  Thread-safe; pickles without the
  offsets.

  Args:
    lengths: a ``ChunkedSource`` (or any TokenSource) whose tokens are
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
        if lengths.size and (
            int(lengths.min()) < 1 or int(lengths.sum(dtype=np.int64)) != self._num_tokens
        ):
          raise DataError(
              f"{self._name}: the stored sentence lengths do not add up to "
              f"the {self._num_tokens} tokens of the split (or one is < 1); "
              "the prepared dataset is corrupt, delete its directory to "
              "rebuild it."
          )
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
      raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_sentences + 1}]")
    return self._all_offsets()[start:stop].copy()


def counts_problem(entries: Mapping, key: str) -> str | None:
  """Why ``entries[key]`` is not a split -> count (integer >= 0) mapping; None if it is."""
  counts = entries[key]
  if not isinstance(counts, Mapping) or not all(
      is_int(counts.get(split)) and counts[split] >= 0 for split in SPLITS
  ):
    return f"has no count per split in {key!r} ({str(counts)[:80]})"
  return None


def metadata_problem(entries: Mapping) -> str | None:
  """Why the ``METADATA_KEYS`` entries of a metadata.json cannot be used; None if they can."""
  vocab = entries["vocab"]
  if not isinstance(vocab, list) or not vocab or not all(isinstance(v, str) for v in vocab):
    return "has no vocabulary (a list of symbols) in 'vocab'"
  if not isinstance(entries["unit"], str):
    return f"has unit={entries['unit']!r}, not a name"
  boundary = entries["boundary_id"]
  if not is_int(boundary) or not 0 <= boundary < len(vocab):
    return f"has boundary_id={boundary!r}, not an id of its {len(vocab)} symbols"
  if not is_int(entries["chunk_size"]) or entries["chunk_size"] < 1:
    return f"has chunk_size={entries['chunk_size']!r}, not a positive integer"
  return counts_problem(entries, "num_tokens")
