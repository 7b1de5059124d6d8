"""Tokenisation rules: how text becomes token ids and back, for builders,
``Corpus.encode`` and ``Corpus.decode``.

Each corpus's builder holds one of these objects (in its spec) and attaches
it to the :class:`~transformer_xl.data.corpus.Corpus` it returns, so that
text encoded later (``Corpus.encode``, e.g. ``main.py --mode=score``) gets
the ids the builder gave the corpus's own files.

* :class:`ByteTokenizer` (enwik8): one token per byte, id = byte value.
* :class:`AlphabetTokenizer` (text8): one token per character of a fixed
  alphabet (id = position in the alphabet); any other character is an error.
* :class:`LineTokenizer` (ptb, ptb_char, wikitext*, lm1b): per line, the
  symbols of ``line.split()`` (no lower-casing; ptb_char: their characters
  with "_" between words), then one end symbol (``<eos>``; lm1b ``<S>``), as
  the reference implementation (Dai et al. 2019, ``pytorch/utils/
  vocabulary.py``) reads a line.  A blank line gives a lone end symbol.  A
  symbol outside the vocabulary becomes the unknown-word symbol (``<unk>``;
  lm1b ``<UNK>``) if the vocabulary has it, else raises DataError.

Each tokenizer also has ``decoder(vocab)``: a fresh incremental
:class:`Decoder` that turns ids back into text as they arrive (generation
streams it): bytes as UTF-8 (an incomplete sequence waits for its next
bytes), alphabet symbols joined, words joined by spaces, ptb_char's "_" as a
space, the end symbol (``<eos>``, lm1b ``<S>``) as a newline.  Decoding
inverts ``encode`` up to what the tokenisation drops: whitespace within
and around a line's words (words and ptb_char), a last line's missing
newline, and words mapped to the unknown-word symbol.

The builders read files line by line with universal newlines
(``Source.open_text``); :meth:`LineTokenizer.encode` splits a string with
``str.splitlines``, which also splits at the rarer line separators
(``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``,
``\\u2029``).
"""
from __future__ import annotations

import codecs
import dataclasses
from typing import Protocol, Sequence

import numpy as np

from transformer_xl.data.corpus import DataError

EOS = "<eos>"  # end of line, word-level and ptb_char corpora
UNK = "<unk>"  # unknown word where the vocabulary has it (ptb, wikitext)
WORD_BOUNDARY = "_"  # between the words of a line, ptb_char only
LM1B_S = "<S>"  # sentence boundary, the reference's add_double_eos symbol
LM1B_UNK = "<UNK>"  # the reference's (and 1b_word_vocab.txt's) unknown word
TEXT8_VOCAB = (" ",) + tuple("abcdefghijklmnopqrstuvwxyz")  # id -> symbol


class Decoder(Protocol):
  """Incremental detokenisation: ids in, text out, state carried between calls."""

  def decode(self, ids: Sequence[int], final: bool = False) -> str:
    """The text of ``ids`` (int token ids, [N]) given everything decoded before.

    With ``final`` the stream ends here: held-back input (an incomplete
    UTF-8 sequence) is flushed.
    """


def _checked_ids(ids: Sequence[int], vocab_size: int) -> np.ndarray:
  """``ids`` as int64 [N]; IndexError for an id outside [0, vocab_size)."""
  ids = np.asarray(ids, np.int64).reshape(-1)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise IndexError(f"token ids must be in [0, {vocab_size}); got [{ids.min()}, {ids.max()}].")
  return ids


class ByteDecoder:
  """Bytes (id = byte value) to text as UTF-8.

  An incomplete multi-byte sequence at the end of a call is held back until
  the next call completes it; invalid bytes, and an incomplete sequence at
  the ``final`` call, become U+FFFD (Python's ``errors="replace"``).
  """

  def __init__(self):
    self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

  def decode(self, ids: Sequence[int], final: bool = False) -> str:
    """Text of the byte ids [N] (values 0..255).

    Raises:
      IndexError: an id outside 0..255.
    """
    ids = _checked_ids(ids, 256)
    return self._utf8.decode(ids.astype(np.uint8).tobytes(), final)


@dataclasses.dataclass
class SymbolDecoder:
  """Ids to their symbols, joined with nothing (text8's alphabet).

  Attributes:
    vocab: id -> symbol.
  """

  vocab: Sequence[str]

  def decode(self, ids: Sequence[int], final: bool = False) -> str:
    """``"".join(vocab[i] for i in ids)``; stateless (``final`` is ignored).

    Raises:
      IndexError: an id outside the vocabulary.
    """
    del final
    return "".join(self.vocab[i] for i in _checked_ids(ids, len(self.vocab)))


@dataclasses.dataclass
class LineDecoder:
  """Lines of symbols to text (ptb, ptb_char, wikitext*, lm1b).

  The end symbol becomes a newline; otherwise words are separated by one
  space (none at the start of a line), or, with ``chars`` (ptb_char), the
  characters are joined and :data:`WORD_BOUNDARY` becomes a space.  The
  state is whether the last symbol ended a line.  The inverse of
  :meth:`LineTokenizer.encode` (the reference's ``Vocab.tokenize``,
  ``pytorch/utils/vocabulary.py``, whose ``convert_to_sent`` joins symbols
  with spaces).

  Attributes:
    vocab: id -> symbol.
    end: the end-of-line symbol.
    chars: character level (ptb_char).
    at_line_start: True at the start of a stream or after an end symbol.
  """

  vocab: Sequence[str]
  end: str
  chars: bool = False
  at_line_start: bool = True

  def decode(self, ids: Sequence[int], final: bool = False) -> str:
    """The text of ``ids`` following what was decoded before (``final`` is ignored).

    Raises:
      IndexError: an id outside the vocabulary.
    """
    del final
    out = []
    for i in _checked_ids(ids, len(self.vocab)):
      symbol = self.vocab[i]
      if symbol == self.end:
        out.append("\n")
        self.at_line_start = True
        continue
      if self.chars:
        out.append(" " if symbol == WORD_BOUNDARY else symbol)
      else:
        out.append(symbol if self.at_line_start else " " + symbol)
      self.at_line_start = False
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """Raw bytes (enwik8): 256 ids, id = byte value, ``vocab[i] = chr(i)``.

  ``"".join(vocab[t] for t in ids).encode("latin-1")`` gives the bytes back.
  """

  @property
  def vocab(self) -> tuple[str, ...]:
    """The fixed vocabulary: ``chr(0) .. chr(255)``."""
    return tuple(chr(i) for i in range(256))

  def byte_table(self) -> np.ndarray | None:
    """None: the id of a byte is its value (no lookup table)."""
    return None

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: the UTF-8 bytes of ``text`` (``vocab`` is not consulted; no
    end symbols, so ``end_last_line`` changes nothing)."""
    del vocab, end_last_line
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decoder(self, vocab: Sequence[str]) -> ByteDecoder:
    """A fresh incremental UTF-8 decoder (``vocab`` is not consulted)."""
    del vocab
    return ByteDecoder()


@dataclasses.dataclass(frozen=True)
class AlphabetTokenizer:
  """Characters of a fixed alphabet (text8), id = position in ``alphabet``.

  Attributes:
    corpus: corpus name, for error messages.
    alphabet: the symbols, one character each, in id order.
    description: the alphabet in words, for error messages.
  """

  corpus: str
  alphabet: tuple[str, ...]
  description: str

  @property
  def vocab(self) -> tuple[str, ...]:
    """The fixed vocabulary: the alphabet."""
    return self.alphabet

  def byte_table(self) -> np.ndarray:
    """int32 [256]: the id of each byte value, -1 outside the alphabet."""
    table = np.full(256, -1, dtype=np.int32)
    for i, symbol in enumerate(self.alphabet):
      table[ord(symbol)] = i
    return table

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: one id per character of ``text`` (no end symbols, so
    ``end_last_line`` changes nothing).

    Raises:
      DataError: ``text`` has a character outside the alphabet.
    """
    del end_last_line
    bad = sorted(set(text) - set(self.alphabet))
    if bad:
      raise DataError(f"{self.corpus} has only {self.description}; the text "
                      f"has {bad[:10]}.")
    index = {s: i for i, s in enumerate(vocab)}
    return np.asarray([index[c] for c in text], dtype=np.int32)

  def decoder(self, vocab: Sequence[str]) -> SymbolDecoder:
    """A decoder that joins the symbols of ``vocab`` (the alphabet)."""
    return SymbolDecoder(vocab)


@dataclasses.dataclass(frozen=True)
class LineTokenizer:
  """Whitespace-separated symbols per line, then an end symbol.

  Attributes:
    corpus: corpus name, for error messages.
    end: the symbol appended to every line (``<eos>``, lm1b ``<S>``); the
      corpus's boundary symbol.
    unk: the unknown-word symbol used when the vocabulary has it.
    chars: spell each line as the characters of its words joined by
      :data:`WORD_BOUNDARY` (ptb_char) instead of the words.
  """

  corpus: str
  end: str = EOS
  unk: str = UNK
  chars: bool = False

  def symbols(self, line: str) -> list[str]:
    """The symbols of one line, without its end symbol.

    Raises:
      DataError: (``chars``) a word contains "_" (the result would be
        ambiguous).
    """
    words = line.split()
    if not self.chars:
      return words
    if any(WORD_BOUNDARY in w for w in words):
      raise DataError(
          f"{self.corpus}: the line {line.strip()!r} has a word containing the "
          f"word-boundary symbol {WORD_BOUNDARY!r}.")
    return list(WORD_BOUNDARY.join(words))

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: the ids of every line of ``text`` (``str.splitlines``).

    Args:
      text: the text.
      vocab: id -> symbol.
      end_last_line: False leaves a last line that has no line break
        without its end symbol, so that it can be continued (a generation
        prompt); True (the builders' rule) ends every line.

    Raises:
      DataError: a symbol outside ``vocab`` while ``vocab`` lacks ``unk``.
    """
    index = {s: i for i, s in enumerate(vocab)}
    unk = index.get(self.unk, -1)
    ids = []
    lines = text.splitlines(keepends=True)
    for lineno, line in enumerate(lines, 1):
      body = line.splitlines()[0]
      for symbol in self.symbols(body):
        i = index.get(symbol, unk)
        if i < 0:
          raise DataError(
              f"{self.corpus}: line {lineno}: {symbol!r} is not in the vocabulary, "
              "which has no unknown-word symbol to map it to.")
        ids.append(i)
      if end_last_line or lineno < len(lines) or body != line:
        ids.append(index[self.end])
    return np.asarray(ids, dtype=np.int32)

  def decoder(self, vocab: Sequence[str]) -> LineDecoder:
    """A fresh decoder at the start of a line (:class:`LineDecoder`)."""
    return LineDecoder(vocab, self.end, self.chars)
