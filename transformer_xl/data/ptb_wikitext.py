"""Corpora of one text file per split: ptb, ptb_char, wikitext2, wikitext103.

Tokenisation (``tokenizers.LineTokenizer``) and vocabulary follow the
reference implementation (Dai et al. 2019, ``pytorch/utils/vocabulary.py``
and ``pytorch/data_utils.py``): each line is split on whitespace
(``str.split()``), one ``<eos>`` is appended per line (blank lines give a
lone ``<eos>``), no lower-casing, and the vocabulary is built from train
only: ``<eos>`` first (id 0), then the train symbols by descending count,
ties broken by first occurrence in train (what ``Counter.most_common`` does
in the reference's ``Vocab.build_vocab``); ``boundary_id`` is the id of
``<eos>``.  A valid/test symbol outside the vocabulary maps to ``<unk>`` if
the vocabulary has it, else raises DataError.  ptb_char spells each line as
characters (``LineTokenizer.chars``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping

import numpy as np

from transformer_xl.data import sources
from transformer_xl.data.corpus import Corpus, DataError, WordsOfStream
from transformer_xl.data.prepared import SPLITS
from transformer_xl.data.storage import CorpusSpec, Plan, TokenStreamBuilder
from transformer_xl.data.tokenizers import EOS, UNK, LineTokenizer


@dataclasses.dataclass(frozen=True)
class Expected:
  """Documented token counts (with ``<eos>``) and vocabulary size."""

  num_tokens: Mapping[str, int]
  vocab_size: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class LineCorpusSpec(CorpusSpec):
  """A ``CorpusSpec`` of a corpus stored as one text file per split.

  Attributes:
    split_files: split -> its file name in ``source``.
    expected: documented counts, checked with ``verify_checksums``; None if
      none are documented.
  """

  split_files: Mapping[str, str]
  expected: Expected | None = None


def _line_spec(name: str, unit: str, chars: bool = False, **kwargs) -> LineCorpusSpec:
  """A spec whose lines end with ``<eos>`` and whose unknown word is ``<unk>``."""
  tokenizer = LineTokenizer(name, end=EOS, unk=UNK, chars=chars)
  return LineCorpusSpec(name=name, unit=unit, boundary=EOS, tokenizer=tokenizer, **kwargs)


def _ptb_source(corpus: str) -> sources.SourceSpec:
  md5 = {
      "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
      "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
      "test": "8b80168b89c18661a38ef683c0dc3721",
  }
  return sources.SourceSpec(
      corpus=corpus,
      archive="simple-examples.tgz",
      url="http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
      files=tuple(
          sources.SourceFile(
              name=f"ptb.{s}.txt", member=f"simple-examples/data/ptb.{s}.txt", md5=md5[s]
          )
          for s in SPLITS
      ),
  )


def _wikitext_source(
    corpus: str, top: str, md5: Mapping[str, str] | None, note: str = ""
) -> sources.SourceSpec:
  return sources.SourceSpec(
      corpus=corpus,
      archive=f"{top}-v1.zip",
      url=(f"https://s3.amazonaws.com/research.metamind.io/wikitext/{top}-v1.zip"),
      files=tuple(
          sources.SourceFile(
              name=f"wiki.{s}.tokens", member=f"{top}/wiki.{s}.tokens", md5=md5[s] if md5 else None
          )
          for s in SPLITS
      ),
      note=note,
  )


_PTB_HOMEPAGE = "http://www.fit.vutbr.cz/~imikolov/rnnlm/"
_PTB_FILES = {s: f"ptb.{s}.txt" for s in SPLITS}
_PTB_MANUAL = "Put simple-examples.tgz or ptb.{train,valid,test}.txt into the manual dir."
_WIKITEXT_HOMEPAGE = (
    "https://www.salesforce.com/blog/"
    "the-wikitext-long-term-dependency-language-modeling-dataset/"
)
_WIKITEXT_FILES = {s: f"wiki.{s}.tokens" for s in SPLITS}

PTB = _line_spec(
    "ptb",
    "word",
    homepage=_PTB_HOMEPAGE,
    source=_ptb_source("ptb"),
    split_files=_PTB_FILES,
    manual_instructions=_PTB_MANUAL,
    expected=Expected({"train": 929_589, "valid": 73_760, "test": 82_430}, 10_000),
)

PTB_CHAR = _line_spec(
    "ptb_char",
    "char",
    chars=True,
    homepage=_PTB_HOMEPAGE,
    source=_ptb_source("ptb_char"),
    split_files=_PTB_FILES,
    manual_instructions=_PTB_MANUAL,
)

WIKITEXT2 = _line_spec(
    "wikitext2",
    "word",
    homepage=_WIKITEXT_HOMEPAGE,
    source=_wikitext_source(
        "wikitext2",
        "wikitext-2",
        {
            "train": "34a77ebe59551b3a3b3d8c0a2797c976",
            "valid": "d756d22ab2310e7e60c094bea5c5a8eb",
            "test": "781c9418ab9414bd09e4aad825aae752",
        },
    ),
    split_files=_WIKITEXT_FILES,
    manual_instructions=(
        "Put wikitext-2-v1.zip or wiki.{train,valid,test}.tokens into the manual dir."
    ),
    expected=Expected({"train": 2_088_628, "valid": 217_646, "test": 245_569}, 33_278),
)

WIKITEXT103 = _line_spec(
    "wikitext103",
    "word",
    homepage=_WIKITEXT_HOMEPAGE,
    source=_wikitext_source(
        "wikitext103",
        "wikitext-103",
        None,
        note=(
            "No published checksum is known for WikiText-103; with "
            "verify_checksums=True the build checks the documented counts "
            "instead: 103,227,021 / 217,646 / 245,569 tokens (with <eos>), "
            "vocabulary 267,735."
        ),
    ),
    split_files=_WIKITEXT_FILES,
    manual_instructions=(
        "Put wikitext-103-v1.zip or wiki.{train,valid,test}.tokens into the manual dir."
    ),
    expected=Expected({"train": 103_227_021, "valid": 217_646, "test": 245_569}, 267_735),
)


class _LineBuilder(TokenStreamBuilder, skip_registration=True):
  """Builds a ``LineCorpusSpec`` corpus (see the module docstring)."""

  SPEC: LineCorpusSpec

  def _count(self, source: sources.Source) -> tuple[collections.Counter, int]:
    """(symbol counts in first-occurrence order, tokens incl. <eos>)."""
    symbols_of = self.SPEC.tokenizer.symbols
    counter, n = collections.Counter(), 0
    with source.open_text() as f:
      for line in f:
        symbols = symbols_of(line)
        counter.update(symbols)
        n += len(symbols) + 1
    return counter, n

  def _encode(
      self, source: sources.Source, index: Mapping[str, int], step: int
  ) -> Iterator[np.ndarray]:
    """Yields the ids of ``source`` in pieces of about ``step`` tokens.

    Raises:
      DataError: a symbol outside ``index`` while the vocabulary has no
        ``<unk>``.
    """
    tokenizer = self.SPEC.tokenizer
    end, unk = index[tokenizer.end], index.get(tokenizer.unk, -1)
    get = index.get
    buf: list[int] = []
    with source.open_text() as f:
      for lineno, line in enumerate(f, 1):
        symbols = tokenizer.symbols(line)
        ids = [get(s, unk) for s in symbols]
        if unk < 0 and -1 in ids:
          symbol = symbols[ids.index(-1)]
          raise DataError(
              f"{self.SPEC.name}: {source} line {lineno}: {symbol!r} is not in "
              f"the vocabulary built from {self.SPEC.split_files['train']}, which "
              f"has no {tokenizer.unk} to map it to."
          )
        buf += ids
        buf.append(end)
        if len(buf) >= step:
          yield np.asarray(buf, dtype=np.int32)
          buf = []
    if buf:
      yield np.asarray(buf, dtype=np.int32)

  def _plan(self, found, verify):
    spec = self.SPEC
    by_split = {s: found[name] for s, name in spec.split_files.items()}
    counter, n_train = self._count(by_split["train"])
    counter.pop(spec.boundary, None)
    # <eos> first, then descending count; sorted() is stable, so ties keep
    # first-occurrence order (= Counter.most_common in the reference).
    vocab = [spec.boundary] + sorted(counter, key=counter.__getitem__, reverse=True)
    index = {s: i for i, s in enumerate(vocab)}
    step = self._chunk_size
    num_tokens = {"train": n_train}
    for split in ("valid", "test"):  # also finds out-of-vocabulary symbols
      num_tokens[split] = sum(len(p) for p in self._encode(by_split[split], index, step))
    if verify and spec.expected is not None:
      got = (dict(num_tokens), len(vocab))
      want = (dict(spec.expected.num_tokens), spec.expected.vocab_size)
      if got != want:
        raise DataError(
            f"{spec.name}: token counts {got[0]} and vocabulary size "
            f"{got[1]} differ from the documented {want[0]} and {want[1]}; "
            "the source files are not the canonical ones: replace them, or pass "
            "--config.data.verify_checksums=false to use them on purpose."
        )
    streams = {s: (lambda src=src: self._encode(src, index, step)) for s, src in by_split.items()}
    return Plan(
        vocab=vocab, boundary_id=index[spec.boundary], num_tokens=num_tokens, streams=streams
    )

  def as_corpus(self) -> Corpus:
    """The corpus, with ``num_words`` for the word-level ones (``WordsOfStream``:
    the tokens that are not ``<eos>``, counted when asked for); ptb_char has none.

    Raises:
      DataError: as ``TokenStreamBuilder.as_corpus``.
    """
    corpus = super().as_corpus()
    if self.SPEC.unit != "word" or self.SPEC.tokenizer.chars:
      return corpus
    return dataclasses.replace(corpus, num_words=WordsOfStream(corpus.splits, corpus.boundary_id))


class TxlPtb(_LineBuilder):
  """Penn Treebank, Mikolov's preprocessed word-level version.

  Word level, vocabulary from train (see the module docstring).  Expected:
  929,589 / 73,760 / 82,430 tokens, vocabulary 10,000 (checked with
  ``verify_checksums``).

  Source: ``simple-examples/data/ptb.{train,valid,test}.txt`` from
  http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz, checked
  against their published md5s (``PTB.source``).
  """

  SPEC = PTB


class TxlPtbChar(_LineBuilder):
  """Penn Treebank at character level, derived from the word-level files.

  Each line becomes the characters of its words with the word-boundary
  symbol "_" between words, then one ``<eos>`` (the layout of Mikolov's
  ``ptb.char.*.txt``); ``<unk>`` and ``N`` are spelled out as characters.
  Vocabulary from train (``<eos>`` = id 0, then characters by descending
  count, ties by first occurrence); unit "char"; ``boundary_id`` = id of
  ``<eos>``.  A character outside the vocabulary raises DataError, and so
  does a "_" inside a word.

  Source: the same files and md5s as ``TxlPtb``.
  """

  SPEC = PTB_CHAR


class TxlWikitext2(_LineBuilder):
  """WikiText-2 (v1, tokenized), word level.

  Tokenised as ``TxlPtb`` (a blank line gives one ``<eos>``).
  Expected: 2,088,628 / 217,646 / 245,569 tokens, vocabulary 33,278
  (Merity et al. 2016, Table 1; checked with ``verify_checksums``).

  Source: ``wikitext-2/wiki.{train,valid,test}.tokens`` from
  https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip,
  checked against their md5s (``WIKITEXT2.source``).
  """

  SPEC = WIKITEXT2


class TxlWikitext103(_LineBuilder):
  """WikiText-103 (v1, tokenized), word level.

  Tokenised as ``TxlPtb``.  No published checksums are known for these
  files, so none are checked; with ``verify_checksums`` the build instead
  checks the documented counts (Merity et al. 2016, Table 1): 103,227,021 /
  217,646 / 245,569 tokens including ``<eos>``, vocabulary 267,735 (the
  reference implementation's n_token for wt103).  The check runs after the
  counting pass, before any record is written.

  Source: ``wikitext-103/wiki.{train,valid,test}.tokens`` from
  https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip.
  """

  SPEC = WIKITEXT103
