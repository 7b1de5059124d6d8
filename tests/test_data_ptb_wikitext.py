"""Tests of transformer_xl.data.ptb_wikitext: ptb, ptb_char, wikitext2, wikitext103.

Each builder is fed a tiny file in its canonical archive format and the
decoded streams are compared with an independent tokenisation of the same
text; the real files, where present, are checked against the documented
counts.
"""

from __future__ import annotations

import time

import pytest

from transformer_xl.data import DataError, load_corpus

from data_samples import (
    _PTB,
    _WIKI,
    CHUNK,
    _char_symbols,
    _check_corpus,
    _ids,
    _ptb_tgz,
    _real,
    _vocab_from,
    _wiki_zip,
    _word_symbols,
)


def test_ptb(tmp_path):
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  corpus = load_corpus(
      "ptb", data_dir=tmp_path / "tfds", manual_dir=manual, verify_checksums=False, chunk_size=CHUNK
  )
  symbols = {s: _word_symbols(t) for s, t in _PTB.items()}
  vocab = _vocab_from(symbols["train"])
  assert vocab[:3] == ["<eos>", "the", "a"]  # "the" and "a" tie: first wins
  assert "zebra" not in vocab  # valid-only word -> <unk>
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  # valid: "saw", "zebra" (not in train) and the literal <unk>, 5 times.
  assert (expected["valid"] == vocab.index("<unk>")).sum() == 15
  _check_corpus(corpus, "ptb", tmp_path / "tfds", "word", vocab, 0, expected)


def test_ptb_char(tmp_path):
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  corpus = load_corpus(
      "ptb_char",
      data_dir=tmp_path / "tfds",
      manual_dir=manual,
      verify_checksums=False,
      chunk_size=CHUNK,
  )
  symbols = {s: _char_symbols(t) for s, t in _PTB.items()}
  assert symbols["train"][:9] == ["t", "h", "e", "_", "c", "a", "t", "_", "s"]
  vocab = _vocab_from(symbols["train"])
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  _check_corpus(
      corpus, "ptb_char", tmp_path / "tfds", "char", vocab, vocab.index("<eos>"), expected
  )


@pytest.mark.parametrize("name,top", [("wikitext2", "wikitext-2"), ("wikitext103", "wikitext-103")])
def test_wikitext(tmp_path, name, top):
  manual = tmp_path / "manual"
  _wiki_zip(manual, top)
  corpus = load_corpus(
      name, data_dir=tmp_path / "tfds", manual_dir=manual, verify_checksums=False, chunk_size=CHUNK
  )
  symbols = {s: _word_symbols(t) for s, t in _WIKI.items()}
  vocab = _vocab_from(symbols["train"])
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  # A blank line (" ") is one <eos>: the stream starts
  # <eos> = Valkyria Chronicles III = <eos> <eos>.
  assert list(expected["train"][:2]) == [0, vocab.index("=")]
  assert list(expected["train"][6:8]) == [0, 0]
  assert "戦場のヴァルキュリア3" in vocab
  _check_corpus(corpus, name, tmp_path / "tfds", "word", vocab, 0, expected)


def test_oov_without_unk_is_an_error(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "wiki.train.tokens").write_text(" a b c \n" * 40)
  (manual / "wiki.valid.tokens").write_text(" a b \n a zebra \n")
  (manual / "wiki.test.tokens").write_text(" c \n")
  with pytest.raises(DataError, match="'zebra' is not in the vocabulary"):
    load_corpus(
        "wikitext2",
        data_dir=tmp_path / "tfds",
        manual_dir=manual,
        download=False,
        verify_checksums=False,
    )


def test_real_ptb(tmp_path):
  start = time.monotonic()
  corpus = load_corpus(
      "ptb", data_dir=tmp_path, manual_dir=_real("ptb"), download=False, verify_checksums=True
  )
  print(f"real PTB build: {time.monotonic() - start:.1f} s")
  assert {s: src.num_tokens for s, src in corpus.splits.items()} == {
      "train": 929_589,
      "valid": 73_760,
      "test": 82_430,
  }
  assert corpus.vocab_size == 10_000
  assert corpus.vocab[corpus.boundary_id] == "<eos>"
  first = corpus.splits["valid"].read(0, 8)
  assert [corpus.vocab[t] for t in first] == [
      "consumers",
      "may",
      "want",
      "to",
      "move",
      "their",
      "telephones",
      "a",
  ]


def test_real_wikitext2(tmp_path):
  start = time.monotonic()
  corpus = load_corpus(
      "wikitext2",
      data_dir=tmp_path,
      manual_dir=_real("wikitext-2"),
      download=False,
      verify_checksums=True,
  )
  print(f"real WikiText-2 build: {time.monotonic() - start:.1f} s")
  assert {s: src.num_tokens for s, src in corpus.splits.items()} == {
      "train": 2_088_628,
      "valid": 217_646,
      "test": 245_569,
  }
  assert corpus.vocab_size == 33_278
  assert [corpus.vocab[t] for t in corpus.splits["test"].read(0, 6)] == [
      "<eos>",
      "=",
      "Robert",
      "<unk>",
      "=",
      "<eos>",
  ]
