"""Text scored: its tokens, and its scores per token, per byte and per word.

``text_tokens`` is how a text is scored (the boundary symbol first, as its
first token's context; ``--mode=score --text`` and
``LanguageModel.score_text``), ``unknown_words`` what its vocabulary lacks;
``TextScore`` holds a text's per-token NLL with the measures that compare
across tokenizers: bits per UTF-8 byte (``bits_per_byte``) and the
perplexity per whitespace-separated word (``word_perplexity``), over the
text's size (``text_size``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from transformer_xl import data
from transformer_xl.run import metrics


def unknown_words(corpus: data.Corpus, text: str) -> int:
  """How many symbols of ``text`` the corpus's vocabulary lacks (they are
  encoded as its unknown-word symbol, e.g. ``<unk>``); 0 for byte- and
  character-level corpora, whose tokenisers take every symbol or raise."""
  symbols = getattr(corpus.tokenizer, "symbols", None)
  if symbols is None:
    return 0
  vocab = set(corpus.vocab)
  return sum(s not in vocab for line in text.splitlines() for s in symbols(line))


def text_tokens(corpus: data.Corpus, text: str) -> np.ndarray:
  """int32 [1, N + 1]: the boundary symbol, then ``text`` tokenised for the
  corpus (N tokens), so that ``Evaluator.score`` scores every token."""
  ids = corpus.encode(text)
  return np.concatenate([[corpus.boundary_id], ids]).astype(np.int32)[None, :]


@dataclasses.dataclass(frozen=True)
class TextScore:
  """Per-token scores of a text (``LanguageModel.score_text``).

  Attributes:
    tokens: int32 [N], the text's ids (the boundary symbol before them is
      their first context, not scored).
    nll: float32 [N], -log p(token | everything before it), nats.
    unit: "byte", "char", "word" or "subword".
    num_bytes: UTF-8 bytes of the text scored (None: not known).
    num_words: whitespace-separated words of the text scored (None: not
      known).
  """

  tokens: np.ndarray
  nll: np.ndarray
  unit: str
  num_bytes: int | None = None
  num_words: int | None = None

  @property
  def total_nats(self) -> float:
    """Sum of the NLL over the N tokens, nats."""
    return float(np.sum(self.nll, dtype=np.float64))

  @property
  def loss_nats(self) -> float:
    """Mean NLL per token, nats."""
    return float(np.mean(self.nll, dtype=np.float64))

  @property
  def bits_per_token(self) -> float:
    """Mean NLL per token in bits: loss_nats / ln 2."""
    return self.loss_nats / math.log(2.0)

  @property
  def bpc(self) -> float | None:
    """Bits per character: ``bits_per_token`` of a byte- or character-level
    corpus, where a token is one byte or character (the paper's bpc); None
    for word and subword corpora (use ``bits_per_token``, or
    ``bits_per_byte`` to compare across tokenizers)."""
    return None if self.unit in metrics.PER_TOKEN_UNITS else self.bits_per_token

  @property
  def ppl(self) -> float:
    """Perplexity per token, exp(mean NLL)."""
    return float(np.exp(self.loss_nats))

  @property
  def bits_per_byte(self) -> float | None:
    """Total NLL in bits over the text's UTF-8 bytes, total_nats / (num_bytes
    x ln 2): comparable across tokenizers (PG-19's measure); None when the
    bytes are not known."""
    return bits_per_byte(self.total_nats, self.num_bytes)

  @property
  def word_ppl(self) -> float | None:
    """Word-level perplexity, exp(total_nats / num_words), over the text's
    whitespace-separated words whatever the tokenizer (for a word-level
    corpus it differs from ``ppl``, whose tokens include the end-of-line
    symbols); None when the words are not known, or none."""
    return word_perplexity(self.total_nats, self.num_words)


def text_size(text: str) -> tuple[int, int]:
  """(UTF-8 bytes, whitespace-separated words) of ``text``: what bits per byte
  and word-level perplexity divide by."""
  return len(text.encode("utf-8")), len(text.split())


def bits_per_byte(total_nats: float, num_bytes: int | None) -> float | None:
  """total_nats / (num_bytes x ln 2), bits per UTF-8 byte; None without bytes."""
  return total_nats / (num_bytes * math.log(2.0)) if num_bytes else None


def word_perplexity(total_nats: float, num_words: int | None) -> float | None:
  """exp(total_nats / num_words), perplexity per word (inf where it overflows);
  None without words."""
  if not num_words:
    return None
  try:
    return math.exp(total_nats / num_words)
  except OverflowError:
    return math.inf
