"""Tokenisation rules: how text becomes token ids and back, for builders,
``Corpus.encode`` and ``Corpus.decode``.

Each corpus's builder holds one of these objects (in its spec) and attaches
it to the ``Corpus`` it returns, so that
text encoded later (``Corpus.encode``, e.g. ``main.py --mode=score``) gets
the ids the builder gave the corpus's own files.

* ``ByteTokenizer`` (enwik8): one token per byte, id = byte value.
* ``AlphabetTokenizer`` (text8): one token per character of a fixed
  alphabet (id = position in the alphabet); any other character is an error.
* ``LineTokenizer`` (ptb, ptb_char, wikitext*, lm1b): per line, the
  symbols of ``line.split()`` (no lower-casing; ptb_char: their characters
  with "_" between words), then one end symbol (``<eos>``; lm1b ``<S>``), as
  the reference implementation (Dai et al. 2019, ``pytorch/utils/
  vocabulary.py``) reads a line.  A blank line gives a lone end symbol.  A
  symbol outside the vocabulary becomes the unknown-word symbol (``<unk>``;
  lm1b ``<UNK>``) if the vocabulary has it, else raises DataError.

For one's own text (``data.dataset="text"``, ``text_builder.py``):
``CharTokenizer`` (characters, the newline as the end symbol,
``<unk>``), ``SentencePieceTokenizer`` (a SentencePiece model, ``</s>``
ending each line) and ``HuggingFaceTokenizer`` (a ``tokenizer.json``,
its newline token ending each line); ``byte`` and ``word`` reuse
``ByteTokenizer`` and ``LineTokenizer``.

Each tokenizer also has ``decoder(vocab)``: a fresh incremental
``Decoder`` that turns ids back into text as they arrive (generation
streams it): bytes as UTF-8 (an incomplete sequence waits for its next
bytes), alphabet symbols joined, words joined by spaces, ptb_char's "_" as a
space, the end symbol (``<eos>``, lm1b ``<S>``) as a newline.  Decoding
inverts ``encode`` up to what the tokenisation drops: whitespace within
and around a line's words (words and ptb_char), a last line's missing
newline, and words mapped to the unknown-word symbol.

The builders read files line by line with universal newlines
(``Source.open_text``); ``LineTokenizer.encode`` splits a string with
``str.splitlines``, which also splits at the rarer line separators
(``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``,
``\\u2029``).
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
from collections.abc import Sequence
from typing import Protocol

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
  characters are joined and ``WORD_BOUNDARY`` becomes a space.  The
  state is whether the last symbol ended a line.  The inverse of
  ``LineTokenizer.encode`` (the reference's ``Vocab.tokenize``,
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
      raise DataError(f"{self.corpus} has only {self.description}; the text has {bad[:10]}.")
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
      ``WORD_BOUNDARY`` (ptb_char) instead of the words.
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
          f"word-boundary symbol {WORD_BOUNDARY!r}."
      )
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
              "which has no unknown-word symbol to map it to."
          )
        ids.append(i)
      if end_last_line or lineno < len(lines) or body != line:
        ids.append(index[self.end])
    return np.asarray(ids, dtype=np.int32)

  def decoder(self, vocab: Sequence[str]) -> LineDecoder:
    """A fresh decoder at the start of a line (``LineDecoder``)."""
    return LineDecoder(vocab, self.end, self.chars)


# -- tokenisations of one's own text (data.dataset="text", "tfds:NAME"; text_builder.py) --------

NEWLINE = "\n"  # the end symbol of a line at character level (CharTokenizer)
REPLACEMENT = "\ufffd"  # how an unknown character decodes (CharTokenizer)


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
  """The characters of each line, then a newline symbol (``data.tokenizer="char"``).

  The vocabulary is built from the training text (``text_builder.py``): the
  newline first (the boundary, id 0), the characters by descending count,
  then ``<unk>``, which any other character maps to.  Decoding joins the
  characters; ``<unk>`` comes back as U+FFFD.

  Attributes:
    corpus: corpus name, for error messages.
  """

  corpus: str
  end: str = NEWLINE
  unk: str = UNK

  def symbols(self, line: str) -> list[str]:
    """The characters of one line, without its line break."""
    return list(line)

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: every character of ``text``; each line ends with the newline
    symbol (with ``end_last_line=False`` not a last line that has no line
    break).  Unknown characters become ``<unk>``.

    Raises:
      DataError: an unknown character while ``vocab`` lacks ``<unk>``.
    """
    index = {s: i for i, s in enumerate(vocab)}
    unk = index.get(self.unk, -1)

    def line_ids(body: str) -> list[int]:
      ids = [index.get(c, unk) for c in body]
      if -1 in ids:
        raise DataError(
            f"{self.corpus}: {body[ids.index(-1)]!r} is not in the vocabulary, "
            "which has no <unk> to map it to."
        )
      return ids

    return _encode_lines(line_ids, index[self.end], text, end_last_line)

  def decoder(self, vocab: Sequence[str]) -> SymbolDecoder:
    """A decoder joining the characters (``<unk>`` as U+FFFD)."""
    return SymbolDecoder([REPLACEMENT if s == self.unk else s for s in vocab])


class SubwordDecoder:
  """Subword ids to text, a line at a time (SentencePiece, Hugging Face tokenizers).

  The ids of the current line are kept; each call decodes the whole line
  and emits what is new.  Text that ends in U+FFFD (an incomplete UTF-8
  sequence of byte-fallback pieces) is held back until more ids arrive or
  ``final``.  The end id becomes a newline and starts a new line.

  Args:
    decode_line: ids (list of int) -> the text of one line.
    end_id: the id that ends a line.
    vocab_size: ids must be in [0, vocab_size).
  """

  def __init__(self, decode_line, end_id: int, vocab_size: int):
    self._decode_line, self._end_id, self._vocab_size = decode_line, int(end_id), vocab_size
    self._line: list[int] = []
    self._emitted = ""

  def _flush(self, final: bool) -> str:
    text = self._decode_line(self._line)
    if not final:
      text = text.rstrip(REPLACEMENT)
    if not text.startswith(self._emitted):  # the decoding of the line changed: start over
      self._emitted = ""
    new, self._emitted = text[len(self._emitted) :], text
    return new

  def decode(self, ids: Sequence[int], final: bool = False) -> str:
    """The text of ``ids`` ([N] ints) following what was decoded before.

    Raises:
      IndexError: an id outside the vocabulary.
    """
    out = []
    for i in _checked_ids(ids, self._vocab_size).tolist():
      if i == self._end_id:
        out.append(self._flush(final=True) + "\n")
        self._line, self._emitted = [], ""
      else:
        self._line.append(i)
    if self._line:
      out.append(self._flush(final))
    return "".join(out)


def _encode_lines(line_ids, end_id: int, text: str, end_last_line: bool) -> np.ndarray:
  """The ids of each line of ``text`` (``line_ids(str) -> list``), each ended by
  ``end_id`` (not a last line without a line break if not ``end_last_line``)."""
  ids: list[int] = []
  lines = text.splitlines(keepends=True)
  for lineno, line in enumerate(lines, 1):
    body = line.splitlines()[0]
    ids += line_ids(body)
    if end_last_line or lineno < len(lines) or body != line:
      ids.append(end_id)
  return np.asarray(ids, dtype=np.int32)


@dataclasses.dataclass(frozen=True)
class SentencePieceTokenizer:
  """A SentencePiece model (``data.tokenizer="sentencepiece"`` or ``pretrained:X.model``).

  Each line is encoded by the model (Kudo & Richardson 2018, the
  ``sentencepiece`` library) and ended with the model's end-of-sentence id
  ``</s>``, the corpus's boundary.  Models trained here use byte fallback,
  identity normalisation and keep all whitespace, so decoding gives the
  text back exactly; a pretrained model decodes as it was trained.

  Attributes:
    corpus: corpus name, for error messages.
    model_proto: the serialised model (what ``.model`` files hold).
  """

  corpus: str
  model_proto: bytes = dataclasses.field(repr=False)

  @functools.cached_property
  def processor(self):
    """The loaded ``sentencepiece.SentencePieceProcessor``."""
    import sentencepiece  # pylint: disable=import-outside-toplevel

    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(self.model_proto)
    return processor

  @property
  def vocab(self) -> tuple[str, ...]:
    """The pieces, id -> piece."""
    p = self.processor
    return tuple(p.id_to_piece(i) for i in range(p.get_piece_size()))

  @property
  def end_id(self) -> int:
    """The id that ends a line: ``</s>``."""
    return int(self.processor.eos_id())

  @property
  def unk(self) -> str:
    """The unknown piece (``<unk>``), for ``Corpus.unk_id``."""
    return self.processor.id_to_piece(self.processor.unk_id())

  def line_ids(self, line: str) -> list[int]:
    """The ids of one line (no line break, no end id)."""
    return self.processor.encode(line)

  def batch_line_ids(self, lines: list[str]) -> list[list[int]]:
    """``line_ids`` of many lines, in one multi-threaded call."""
    return self.processor.encode(lines)

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: each line's pieces, then ``</s>`` (see ``LineTokenizer``
    for ``end_last_line``); ``vocab`` is the model's and not consulted."""
    del vocab
    return _encode_lines(self.line_ids, self.end_id, text, end_last_line)

  def decoder(self, vocab: Sequence[str]) -> SubwordDecoder:
    """A fresh incremental decoder (``SubwordDecoder``)."""
    return SubwordDecoder(self.processor.decode, self.end_id, len(vocab))


@dataclasses.dataclass(frozen=True)
class HuggingFaceTokenizer:
  """A Hugging Face ``tokenizer.json`` (``data.tokenizer="pretrained:X/tokenizer.json"``).

  Each line is encoded without special tokens and ended with the token of
  a line break (``"\\n"``, which byte-level BPE vocabularies such as GPT-2's
  have as one token), the corpus's boundary.

  Attributes:
    corpus: corpus name, for error messages.
    json: the ``tokenizer.json`` text.
  """

  corpus: str
  json: str = dataclasses.field(repr=False)
  unk: str = ""

  @functools.cached_property
  def tokenizer(self):
    """The loaded ``tokenizers.Tokenizer``."""
    import tokenizers  # pylint: disable=import-outside-toplevel

    return tokenizers.Tokenizer.from_str(self.json)

  @property
  def vocab(self) -> tuple[str, ...]:
    """The tokens, id -> token (ids without a token, if any, as "")."""
    t = self.tokenizer
    return tuple(t.id_to_token(i) or "" for i in range(t.get_vocab_size(with_added_tokens=True)))

  @functools.cached_property
  def end_id(self) -> int:
    """The id of the line break.

    Raises:
      DataError: a line break is not one token of this tokenizer.
    """
    ids = self.tokenizer.encode("\n", add_special_tokens=False).ids
    if len(ids) != 1:
      raise DataError(
          f"{self.corpus}: the tokenizer encodes a line break as {ids}, not as one "
          "token, so it cannot mark line ends; use a tokenizer with a newline "
          "token (byte-level BPE such as GPT-2's) or data.tokenizer=sentencepiece."
      )
    return int(ids[0])

  def line_ids(self, line: str) -> list[int]:
    """The ids of one line (no line break, no end id)."""
    return self.tokenizer.encode(line, add_special_tokens=False).ids

  def batch_line_ids(self, lines: list[str]) -> list[list[int]]:
    """``line_ids`` of many lines, in one (parallel) call."""
    return [e.ids for e in self.tokenizer.encode_batch(lines, add_special_tokens=False)]

  def encode(self, text: str, vocab: Sequence[str], end_last_line: bool = True) -> np.ndarray:
    """int32 [N]: each line's tokens, then the line-break token."""
    del vocab
    return _encode_lines(self.line_ids, self.end_id, text, end_last_line)

  def decoder(self, vocab: Sequence[str]) -> SubwordDecoder:
    """A fresh incremental decoder (``SubwordDecoder``)."""
    return SubwordDecoder(
        lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False), self.end_id, len(vocab)
    )
