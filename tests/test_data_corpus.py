"""Tests of transformer_xl.data.corpus and .tokenizers: Corpus.encode and its rules.

The builders' streams are checked against ``Corpus.encode`` in
``test_score.py``; here the rules and their errors, without any tfds.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from transformer_xl.data import ArraySource, Corpus, DataError
from transformer_xl.data.tokenizers import (LM1B_S, LM1B_UNK, TEXT8_VOCAB, AlphabetTokenizer,
                                            ByteTokenizer, LineTokenizer)


def _corpus(vocab, tokenizer=None, name="toy"):
  return Corpus(name=name, unit="word", vocab=tuple(vocab), boundary_id=0,
                splits={"train": ArraySource(np.zeros([1], np.int32))}, tokenizer=tokenizer)


def test_words_per_line_with_unk():
  corpus = _corpus(["<eos>", "the", "cat", "<unk>"], LineTokenizer("ptb"))
  ids = corpus.encode(" the cat \n\n the zebra\n")
  np.testing.assert_array_equal(ids, [1, 2, 0, 0, 1, 3, 0])
  assert ids.dtype == np.int32


def test_words_without_unk_is_an_error():
  corpus = _corpus(["<eos>", "a", "b"], LineTokenizer("wikitext2"))
  with pytest.raises(DataError, match=r"wikitext2: line 2: 'zebra' is not in the vocabulary"):
    corpus.encode("a b\na zebra\n")


def test_lm1b_sentences_end_with_s_and_map_unknown_to_unk():
  tokenizer = LineTokenizer("lm1b", end=LM1B_S, unk=LM1B_UNK)
  corpus = _corpus([LM1B_UNK, LM1B_S, "The", "cat"], tokenizer)
  np.testing.assert_array_equal(corpus.encode("The cat\nThe aardvark\n"), [2, 3, 1, 2, 0, 1])


def test_ptb_char_spells_words_with_boundaries():
  corpus = _corpus(["<eos>", "a", "b", "_"], LineTokenizer("ptb_char", chars=True))
  np.testing.assert_array_equal(corpus.encode(" ab  b \n"), [1, 2, 3, 2, 0])
  with pytest.raises(DataError, match="ptb_char: the line 'a_b' has a word containing"):
    corpus.encode("a_b\n")
  with pytest.raises(DataError, match="'c' is not in the vocabulary"):
    corpus.encode("c\n")  # "<unk>" would be spelled as characters: no unknown symbol


def test_text8_alphabet():
  tokenizer = AlphabetTokenizer("text8", TEXT8_VOCAB, "space and a-z")
  corpus = _corpus(tokenizer.vocab, tokenizer)
  np.testing.assert_array_equal(corpus.encode(" ab z"), [0, 1, 2, 0, 26])
  with pytest.raises(DataError, match=r"text8 has only space and a-z; the text has \['\\n', 'A'\]"):
    corpus.encode("A b\n")
  table = tokenizer.byte_table()
  assert table[ord("a")] == 1 and table[ord("\n")] == -1


def test_enwik8_bytes():
  tokenizer = ByteTokenizer()
  corpus = _corpus(tokenizer.vocab, tokenizer)
  ids = corpus.encode("Città\n")
  assert bytes(ids.astype(np.uint8)) == "Città\n".encode("utf-8")
  assert "".join(corpus.vocab[t] for t in ids).encode("latin-1") == "Città\n".encode("utf-8")


def test_corpus_without_tokenizer_cannot_encode():
  with pytest.raises(ValueError, match="'toy' has no tokenizer"):
    _corpus(["<eos>"]).encode("a\n")


def test_importing_the_package_does_not_import_tfds():
  code = ("import sys, transformer_xl.data; "
          "assert 'tensorflow_datasets' not in sys.modules, 'tfds imported'")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
