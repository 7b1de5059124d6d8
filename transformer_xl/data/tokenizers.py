"""Tokenisation rules: how text becomes token ids, for builders and ``Corpus.encode``.

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

The builders read files line by line with universal newlines
(``Source.open_text``); :meth:`LineTokenizer.encode` splits a string with
``str.splitlines``, which also splits at the rarer line separators
(``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``,
``\\u2029``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from transformer_xl.data.corpus import DataError

EOS = "<eos>"  # end of line, word-level and ptb_char corpora
UNK = "<unk>"  # unknown word where the vocabulary has it (ptb, wikitext)
WORD_BOUNDARY = "_"  # between the words of a line, ptb_char only
LM1B_S = "<S>"  # sentence boundary, the reference's add_double_eos symbol
LM1B_UNK = "<UNK>"  # the reference's (and 1b_word_vocab.txt's) unknown word
TEXT8_VOCAB = (" ",) + tuple("abcdefghijklmnopqrstuvwxyz")  # id -> symbol


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

  def encode(self, text: str, vocab: Sequence[str]) -> np.ndarray:
    """int32 [N]: the UTF-8 bytes of ``text`` (``vocab`` is not consulted)."""
    del vocab
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


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

  def encode(self, text: str, vocab: Sequence[str]) -> np.ndarray:
    """int32 [N]: one id per character of ``text``.

    Raises:
      DataError: ``text`` has a character outside the alphabet.
    """
    bad = sorted(set(text) - set(self.alphabet))
    if bad:
      raise DataError(f"{self.corpus} has only {self.description}; the text "
                      f"has {bad[:10]}.")
    index = {s: i for i, s in enumerate(vocab)}
    return np.asarray([index[c] for c in text], dtype=np.int32)


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

  def encode(self, text: str, vocab: Sequence[str]) -> np.ndarray:
    """int32 [N]: the ids of every line of ``text`` (``str.splitlines``).

    Raises:
      DataError: a symbol outside ``vocab`` while ``vocab`` lacks ``unk``.
    """
    index = {s: i for i, s in enumerate(vocab)}
    unk = index.get(self.unk, -1)
    ids = []
    for lineno, line in enumerate(text.splitlines(), 1):
      for symbol in self.symbols(line):
        i = index.get(symbol, unk)
        if i < 0:
          raise DataError(
              f"{self.corpus}: line {lineno}: {symbol!r} is not in the vocabulary, "
              "which has no unknown-word symbol to map it to.")
        ids.append(i)
      ids.append(index[self.end])
    return np.asarray(ids, dtype=np.int32)
