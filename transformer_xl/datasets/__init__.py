"""Corpora as token streams: the interface the rest of the package uses.

Every corpus is a tfds dataset (array_record, ``disable_shuffling=True``)
whose records are consecutive chunks of one split's token stream.  The rest
of the package only sees :class:`Corpus` and :class:`TokenSource`; which tfds
builder backs a name is decided in :func:`load_corpus`.
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
  """

  name: str
  unit: str
  vocab: Sequence[str]
  boundary_id: int
  splits: Mapping[str, TokenSource]

  @property
  def vocab_size(self) -> int:
    """n_token: number of distinct token ids."""
    return len(self.vocab)


# Names accepted by load_corpus.
CORPUS_NAMES = (
    "enwik8", "text8", "ptb", "ptb_char", "wikitext2", "wikitext103")


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
      "wikitext103" (words).
    data_dir: tfds data dir; default tfds's (``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    manual_dir: where the canonical archive or the extracted files are looked
      for; default ``<data_dir>/downloads/manual``.
    download: try the canonical URL (a few seconds' timeout) when no local
      copy exists.
    verify_checksums: check the published sizes/checksums of the source files
      (and documented token counts where known).  Must be False for files
      that are not the canonical ones (tests).
    chunk_size: tokens per stored record when preparing (default 65536); a
      prepared dataset keeps the chunk size it was written with.

  Returns:
    A :class:`Corpus` whose ``splits`` ("train", "valid", "test") are
    TokenSources of int32 ids; splits of enwik8/text8 are 90M/5M/5M symbols
    (Dai et al. 2019, Sec. 4).

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
