"""The corpus types: token streams, sentence boundaries, Corpus, DataError.

Every split of a corpus is one token stream (int32 ids) read by range
through a ``TokenSource``; sentence-level corpora (One Billion Word)
also have a ``SentenceIndex`` per split.  The in-memory versions
(``ArraySource``, ``ArraySentenceIndex``) serve tests and small
corpora; the stored ones are in ``prepared.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from transformer_xl import errors

DataError = errors.DataError  # re-exported (transformer_xl.errors)


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
  (see ``lm1b.TxlLm1b``), so every sentence holds at least one token.
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
    raise ValueError(
        f"sentence lengths must be a 1-D integer array, got "
        f"dtype {lengths.dtype} and shape {lengths.shape}."
    )
  if lengths.size and int(lengths.min()) < 1:
    bad = int(np.argmax(lengths < 1))
    raise ValueError(
        f"sentence {bad} has length {int(lengths[bad])}; every "
        "sentence must hold at least one token."
    )
  offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
  np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
  return offsets


@dataclasses.dataclass(frozen=True)
class ArraySentenceIndex:
  """A ``SentenceIndex`` over an in-memory offsets array (tests).

  Attributes:
    offsets: int64 [num_sentences + 1], strictly increasing from 0; see
      ``sentence_offsets`` to build it from lengths.

  Raises:
    ValueError (on construction): ``offsets`` is not 1-D integer, is empty,
      does not start at 0 or is not strictly increasing.
  """

  offsets: np.ndarray

  def __post_init__(self):
    offsets = np.asarray(self.offsets)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or not np.issubdtype(offsets.dtype, np.integer):
      raise ValueError(
          f"offsets must be a non-empty 1-D integer array, got "
          f"dtype {offsets.dtype} and shape {offsets.shape}."
      )
    if offsets[0] != 0 or np.any(np.diff(offsets) < 1):
      raise ValueError(
          "offsets must start at 0 and increase strictly (every "
          "sentence holds at least one token)."
      )
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
      raise IndexError(f"range [{start}, {stop}) outside [0, {self.offsets.shape[0]}]")
    return self.offsets[start:stop].copy()


class WordsOfStream(Mapping[str, int]):
  """Split -> words of a word-level stream whose lines end with one boundary
  symbol: the tokens that are not ``boundary_id``, counted when first asked
  for (one read of the split, in blocks) and kept.

  For PTB and WikiText (``str.split`` of each line, one ``<eos>`` after it,
  no ``<eos>`` in the raw text) this is the raw text's whitespace words:
  checked on the shared copies (PTB valid / test 70,390 / 78,669 words,
  WikiText-2 213,886 / 241,211) in ``tests/test_word_ppl.py``.

  Args:
    splits: split -> ``TokenSource``.
    boundary_id: the line-end symbol's id.
  """

  _BLOCK = 1 << 22  # tokens read at a time (16 MiB of int32)

  def __init__(self, splits: Mapping[str, TokenSource], boundary_id: int):
    self._splits, self._boundary_id = splits, boundary_id
    self._counted: dict[str, int] = {}

  def __getitem__(self, split: str) -> int:
    if split not in self._counted:
      source = self._splits[split]
      words = 0
      for start in range(0, source.num_tokens, self._BLOCK):
        block = source.read(start, min(start + self._BLOCK, source.num_tokens))
        words += int(np.count_nonzero(block != self._boundary_id))
      self._counted[split] = words
    return self._counted[split]

  def __iter__(self):
    return iter(self._splits)

  def __len__(self) -> int:
    return len(self._splits)


class Tokenizer(Protocol):
  """A corpus's tokenisation of text and its inverse (see ``tokenizers.py``)."""

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N] ids of ``text`` under ``vocab`` (id -> symbol); with
    ``end_last_line=False`` a last line without a line break gets no end
    symbol.

    Raises:
      DataError: the text has a symbol the vocabulary lacks and cannot map
        to an unknown-word symbol.
    """

  def decoder(self, vocab: Sequence[str]):
    """A fresh incremental ``tokenizers.Decoder`` (ids -> text) for ``vocab``."""


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A tokenised corpus.

  Attributes:
    name: dataset name as given to ``load_corpus`` (e.g. "ptb").
    unit: "byte", "char", "word" or "subword"; decides the reported metric
      (bpc for byte/char, ppl for word/subword).
    vocab: symbol of each token id (id -> string); len(vocab) is n_token.
    boundary_id: id of the symbol that separates documents/lines (``<eos>``
      for word level, the newline/space/word-boundary symbol otherwise); the
      evaluator uses it as the context of a split's first token so that
      every token of the split is scored.
    splits: "train", "valid", "test" -> TokenSource.
    sentence_offsets: for sentence-level corpora (One Billion Word), "train",
      "valid", "test" -> ``SentenceIndex`` of that split's stream, so
      that training can shuffle whole sentences (``ShuffledSentenceIterator``
      in ``shuffled.py``); None for corpora that are one running text (every
      other corpus).
    tokenizer: the rules that turned the source text into ``splits``, for
      ``encode``; set on every corpus ``load_corpus`` returns, None on a
      corpus built by hand (which then cannot encode).
    documents: for corpora of one's own text (``data.dataset="text"``),
      "train", "valid", "test" -> ``SentenceIndex`` of the documents
      of that split's stream (a document's tokens end with its last line's
      end symbol); None for the built-in corpora.
    num_bytes: "train", "valid", "test" -> UTF-8 bytes of the split's text
      (each line with one line break), for bits per byte; None where not
      recorded (the built-in corpora).
    num_files: "train", "valid", "test" -> files the split was read from,
      for corpora of one's own text files; None elsewhere (tfds datasets,
      the built-in corpora).
    num_words: "train", "valid", "test" -> whitespace-separated words of the
      split's raw text (``str.split``, as PG-19 counts them; Rae et al.
      2020), for word-level perplexity (``run.metrics.corpus_level``): one's
      own text and tfds datasets record them when prepared; the word-level
      built-in corpora (ptb, wikitext2, wikitext103) count the tokens that
      are not ``<eos>`` (``WordsOfStream``); None where words are not
      known (bytes, characters, lm1b, a text dataset prepared before words
      were recorded).
    document_bytes, document_words: "train", "valid", "test" -> int32 UTF-8
      bytes and whitespace words of each document (in ``documents`` order;
      -1 where a count does not fit in int32), for per-document bits per
      byte and word-level perplexity (``eval.documents="whole"``); recorded
      with ``num_words``, None where it is not.
  """

  name: str
  unit: str
  vocab: Sequence[str]
  boundary_id: int
  splits: Mapping[str, TokenSource]
  sentence_offsets: Mapping[str, SentenceIndex] | None = None
  tokenizer: Tokenizer | None = None
  documents: Mapping[str, SentenceIndex] | None = None
  num_bytes: Mapping[str, int] | None = None
  num_files: Mapping[str, int] | None = None
  num_words: Mapping[str, int] | None = None
  document_bytes: Mapping[str, TokenSource] | None = None
  document_words: Mapping[str, TokenSource] | None = None

  @property
  def vocab_size(self) -> int:
    """n_token: number of distinct token ids."""
    return len(self.vocab)

  @property
  def unk_id(self) -> int | None:
    """Id of the unknown-word symbol that ``encode`` maps unknown words
    to (``<unk>``, lm1b ``<UNK>``); None where the vocabulary has none
    (bytes, characters, a corpus without tokenizer)."""
    symbol = getattr(self.tokenizer, "unk", None)
    return list(self.vocab).index(symbol) if symbol in self.vocab else None

  def _tokenizer(self, what: str) -> Tokenizer:
    if self.tokenizer is None:
      raise errors.ConfigError(
          f"corpus {self.name!r} has no tokenizer (only corpora "
          f"from load_corpus have one), so it cannot {what} text."
      )
    return self.tokenizer

  def encode(self, text: str, end_last_line: bool = True) -> np.ndarray:
    """Token ids of ``text`` under this corpus's tokenisation and vocabulary.

    The rules of the corpus's builder (see ``tokenizers.py``): word level
    splits each line on whitespace and ends it with ``<eos>`` (lm1b:
    ``<S>``); ptb_char spells words with "_" between them and ``<eos>`` per
    line; text8 maps space and a..z; enwik8 takes the UTF-8 bytes.  Unknown
    words become ``<unk>`` / ``<UNK>`` where the vocabulary has one.

    Args:
      text: the text.
      end_last_line: True (the builders' rule) ends every line with the end
        symbol; False leaves a last line without a line break open, to be
        continued (a generation prompt).  Only line-based corpora have end
        symbols.

    Returns:
      int32 [N] token ids.

    Raises:
      DataError: a symbol outside the vocabulary with no unknown-word
        symbol, or a character text8 does not have.
      ValueError: the corpus has no ``tokenizer``.
    """
    return self._tokenizer("encode").encode(text, self.vocab, end_last_line)

  def decoder(self):
    """A fresh incremental decoder (``tokenizers.Decoder``): ``decode(ids,
    final=False) -> str`` carries its state between calls, for text that
    streams out token by token (generation).

    Raises:
      ValueError: the corpus has no ``tokenizer``.
    """
    return self._tokenizer("decode").decoder(self.vocab)

  def decode(self, ids) -> str:
    """The text of token ids (int [N]), the inverse of ``encode``.

    Bytes (enwik8) as UTF-8 (invalid or incomplete sequences become
    U+FFFD), characters joined (text8's space; ptb_char's "_" as a space),
    words separated by one space, the end symbol (``<eos>``, lm1b ``<S>``)
    as a newline.  ``decode(encode(text)) == text`` for bytes and text8;
    for line-based corpora up to the whitespace within lines, a final
    newline, and unknown words (which come back as ``<unk>``).

    Raises:
      ValueError: the corpus has no ``tokenizer``.
      IndexError: an id outside the vocabulary.
    """
    return self.decoder().decode(ids, final=True)
