"""Corpora as token streams: the interface the rest of the package uses.

Every corpus is a tfds dataset (array_record, ``disable_shuffling=True``)
whose records are consecutive chunks of one split's token stream.  The rest
of the package only sees :class:`Corpus` and :class:`TokenSource` (and, for
sentence-level corpora such as One Billion Word, :class:`SentenceIndex`);
which tfds builder backs a name is decided in :func:`load_corpus`.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

import numpy as np


class DataError(FileNotFoundError):
  """A corpus cannot be built or read.

  The message names the missing or bad file, where to put it (the manual
  dir), and its expected checksum.  Raised before any compilation.
  """


class TokenSource(Protocol):
  """Random access to one split's token stream (int32 token ids)."""

  @property
  def num_tokens(self) -> int:
    """Length of the split's token stream, in tokens."""

  def read(self, start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of the stream as an int32 array of shape [stop - start].

    Reads only the chunks that cover the range.  Raises IndexError if the
    range is outside [0, num_tokens].
    """


@dataclasses.dataclass(frozen=True)
class ArraySource:
  """A TokenSource over an in-memory int32 array (tests, small corpora)."""

  tokens: np.ndarray

  @property
  def num_tokens(self) -> int:
    """Length of the array, in tokens."""
    return int(self.tokens.shape[0])

  def read(self, start: int, stop: int) -> np.ndarray:
    """int32 tokens [start, stop); IndexError outside [0, num_tokens]."""
    if not 0 <= start <= stop <= self.num_tokens:
      raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_tokens}]")
    return np.asarray(self.tokens[start:stop], dtype=np.int32)


class SentenceIndex(Protocol):
  """Sentence boundaries of one split's token stream (sentence-level corpora).

  The split's stream is the concatenation of its sentences; sentence ``i``
  occupies tokens ``[offsets[i], offsets[i + 1])`` of the stream, where
  ``offsets`` is an int64 array of ``num_sentences + 1`` entries with
  ``offsets[0] == 0`` and ``offsets[-1] == num_tokens`` of the split.  For
  One Billion Word a sentence's tokens are its words followed by one ``<S>``
  (see ``builders.TxlLm1b``), so every sentence holds at least one token.
  """

  @property
  def num_sentences(self) -> int:
    """Number of sentences of the split."""

  def read_offsets(self, start: int, stop: int) -> np.ndarray:
    """``offsets[start:stop]`` as an int64 array of shape [stop - start].

    Valid for ``0 <= start <= stop <= num_sentences + 1`` (the offsets array
    has ``num_sentences + 1`` entries); raises IndexError otherwise.
    """


def sentence_offsets(lengths: np.ndarray) -> np.ndarray:
  """Offsets from sentence lengths: int64 [n + 1], ``[0, l0, l0 + l1, ...]``.

  Args:
    lengths: integer array [n], tokens per sentence (each >= 1).

  Raises:
    ValueError: ``lengths`` is not a 1-D integer array, or has an entry < 1.
  """
  lengths = np.asarray(lengths)
  if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
    raise ValueError(f"sentence lengths must be a 1-D integer array, got "
                     f"dtype {lengths.dtype} and shape {lengths.shape}.")
  if lengths.size and int(lengths.min()) < 1:
    bad = int(np.argmax(lengths < 1))
    raise ValueError(f"sentence {bad} has length {int(lengths[bad])}; every "
                     "sentence must hold at least one token.")
  offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
  np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
  return offsets


@dataclasses.dataclass(frozen=True)
class ArraySentenceIndex:
  """A :class:`SentenceIndex` over an in-memory offsets array (tests).

  Attributes:
    offsets: int64 [num_sentences + 1], strictly increasing from 0; see
      :func:`sentence_offsets` to build it from lengths.

  Raises:
    ValueError (on construction): ``offsets`` is not 1-D integer, is empty,
      does not start at 0 or is not strictly increasing.
  """

  offsets: np.ndarray

  def __post_init__(self):
    offsets = np.asarray(self.offsets)
    if (offsets.ndim != 1 or offsets.shape[0] < 1
        or not np.issubdtype(offsets.dtype, np.integer)):
      raise ValueError(f"offsets must be a non-empty 1-D integer array, got "
                       f"dtype {offsets.dtype} and shape {offsets.shape}.")
    if offsets[0] != 0 or np.any(np.diff(offsets) < 1):
      raise ValueError("offsets must start at 0 and increase strictly (every "
                       "sentence holds at least one token).")
    offsets = offsets.astype(np.int64)
    offsets.flags.writeable = False
    object.__setattr__(self, "offsets", offsets)

  @property
  def num_sentences(self) -> int:
    """Number of sentences, ``len(offsets) - 1``."""
    return int(self.offsets.shape[0]) - 1

  def read_offsets(self, start: int, stop: int) -> np.ndarray:
    """int64 ``offsets[start:stop]``; IndexError outside [0, num_sentences + 1]."""
    if not 0 <= start <= stop <= self.offsets.shape[0]:
      raise IndexError(f"range [{start}, {stop}) outside "
                       f"[0, {self.offsets.shape[0]}]")
    return self.offsets[start:stop].copy()


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A tokenised corpus.

  Attributes:
    name: dataset name as given to :func:`load_corpus` (e.g. "ptb").
    unit: "byte", "char" or "word"; decides the reported metric (bpc for
      byte/char, ppl for word).
    vocab: symbol of each token id (id -> string); len(vocab) is n_token.
    boundary_id: id of the symbol that separates documents/lines (``<eos>``
      for word level, the newline/space/word-boundary symbol otherwise); the
      evaluator uses it as the context of a split's first token so that
      every token of the split is scored.
    splits: "train", "valid", "test" -> TokenSource.
    sentence_offsets: for sentence-level corpora (One Billion Word), "train",
      "valid", "test" -> :class:`SentenceIndex` of that split's stream, so
      that training can shuffle whole sentences
      (``input_pipeline.ShuffledSentenceIterator``); None for corpora that
      are one running text (every other corpus).
  """

  name: str
  unit: str
  vocab: Sequence[str]
  boundary_id: int
  splits: Mapping[str, TokenSource]
  sentence_offsets: Mapping[str, SentenceIndex] | None = None

  @property
  def vocab_size(self) -> int:
    """n_token: number of distinct token ids."""
    return len(self.vocab)


# Names accepted by load_corpus.
CORPUS_NAMES = (
    "enwik8", "text8", "ptb", "ptb_char", "wikitext2", "wikitext103", "lm1b")


def load_corpus(
    name: str,
    *,
    data_dir=None,
    manual_dir=None,
    download: bool = True,
    verify_checksums: bool = True,
    chunk_size: int | None = None,
) -> Corpus:
  """Loads a corpus, preparing its tfds dataset first if needed.

  If the dataset (builder ``txl_<name>``, see ``datasets/builders.py``) is
  not prepared in ``data_dir``, its source files are located, checked and
  tokenised into array_record chunks (``download_and_prepare``).  The
  returned splits read only the chunks covering a requested range, via
  ``builder.as_data_source()`` (no TensorFlow needed).  A prepared dataset
  loads without its source files.

  Args:
    name: one of :data:`CORPUS_NAMES`: "enwik8" (bytes, 256 ids), "text8"
      (27 chars), "ptb" (words), "ptb_char" (chars of PTB), "wikitext2",
      "wikitext103" (words), "lm1b" (One Billion Word: words, sentences
      ended by ``<S>``, with ``sentence_offsets``; see ``builders.TxlLm1b``).
    data_dir: tfds data dir; default tfds's (``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    manual_dir: where the canonical archive or the extracted files are looked
      for; default ``<data_dir>/downloads/manual``.
    download: try the canonical URL (a few seconds' timeout) when no local
      copy exists.
    verify_checksums: check the published sizes/checksums of the source files
      (and documented token counts where known).  Must be False for files
      that are not the canonical ones (tests).
    chunk_size: tokens per stored record when preparing (default 65536,
      8192 for lm1b, whose training reads short random sentences); a
      prepared dataset keeps the chunk size it was written with.

  Returns:
    A :class:`Corpus` whose ``splits`` ("train", "valid", "test") are
    TokenSources of int32 ids; splits of enwik8/text8 are 90M/5M/5M symbols
    (Dai et al. 2019, Sec. 4).  Only lm1b has ``sentence_offsets``.

  Raises:
    ValueError: unknown ``name``.
    DataError: source files missing (message: file names, manual dir,
      canonical URL, expected checksums; raised before any tokenisation and
      without waiting on the network for more than a few seconds), a
      checksum mismatch, or an unusable source.
  """
  if name not in CORPUS_NAMES:
    raise ValueError(
        f"Unknown corpus {name!r}; valid names: {', '.join(CORPUS_NAMES)}.")
  from transformer_xl.datasets import builders  # imports tfds

  kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
  builder = builders.BUILDERS[name](data_dir=data_dir, **kwargs)
  if not builder.is_prepared():
    builder.prepare(manual_dir=manual_dir, download=download,
                    verify_checksums=verify_checksums)
  return builder.as_corpus()


def encode_text(corpus: Corpus, text: str) -> np.ndarray:
  """int32 token ids of ``text`` with ``corpus``'s tokenisation (see builders.encode_text)."""
  from transformer_xl.datasets import builders  # imports tfds: only when needed
  return builders.encode_text(corpus, text)
