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
    return int(self.tokens.shape[0])

  def read(self, start: int, stop: int) -> np.ndarray:
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
    return len(self.vocab)
