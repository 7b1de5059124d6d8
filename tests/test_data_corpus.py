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
from transformer_xl.data.tokenizers import (
    LM1B_S,
    LM1B_UNK,
    TEXT8_VOCAB,
    AlphabetTokenizer,
    ByteTokenizer,
    LineTokenizer,
)


def _corpus(vocab, tokenizer=None, name="toy"):
  return Corpus(
      name=name,
      unit="word",
      vocab=tuple(vocab),
      boundary_id=0,
      splits={"train": ArraySource(np.zeros([1], np.int32))},
      tokenizer=tokenizer,
  )


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
  assert bytes(ids.astype(np.uint8)) == "Città\n".encode()
  assert "".join(corpus.vocab[t] for t in ids).encode("latin-1") == "Città\n".encode()


def test_corpus_without_tokenizer_cannot_encode():
  with pytest.raises(ValueError, match="'toy' has no tokenizer"):
    _corpus(["<eos>"]).encode("a\n")


def test_importing_the_package_does_not_import_tfds():
  code = (
      "import sys, transformer_xl.data; "
      "assert 'tensorflow_datasets' not in sys.modules, 'tfds imported'"
  )
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]


# -- decoding: Corpus.decode / Corpus.decoder, the inverse of encode ------------


def _normalised(text):
  """What line-based encoding keeps: words of each line, one space apart, a final newline."""
  return "".join(" ".join(line.split()) + "\n" for line in text.splitlines())


@pytest.mark.parametrize(
    "name, vocab, tokenizer, text, expected",
    [
        (
            "ptb",
            ["<eos>", "the", "cat", "sat", "<unk>"],
            LineTokenizer("ptb"),
            " the cat  sat \n\n the zebra",
            "the cat sat\n\nthe <unk>\n",
        ),
        (
            "ptb_char",
            ["<eos>", "a", "b", "_"],
            LineTokenizer("ptb_char", chars=True),
            " ab  b \nba",
            "ab b\nba\n",
        ),
        (
            "lm1b",
            [LM1B_UNK, LM1B_S, "The", "cat"],
            LineTokenizer("lm1b", end=LM1B_S, unk=LM1B_UNK),
            "The cat\nThe aardvark\n",
            "The cat\nThe <UNK>\n",
        ),
    ],
)
def test_decode_inverts_encode_for_lines(name, vocab, tokenizer, text, expected):
  corpus = _corpus(vocab, tokenizer, name=name)
  assert corpus.decode(corpus.encode(text)) == expected
  known = text.replace("zebra", "cat").replace("aardvark", "cat")
  assert corpus.decode(corpus.encode(known)) == _normalised(known)


def test_decode_inverts_encode_for_text8_and_bytes():
  text8 = AlphabetTokenizer("text8", TEXT8_VOCAB, "space and a-z")
  corpus = _corpus(text8.vocab, text8)
  assert corpus.decode(corpus.encode(" the cat  sat")) == " the cat  sat"
  enwik8 = _corpus(ByteTokenizer().vocab, ByteTokenizer())
  text = "Città <b>\n  naïve 日本 \U0001F600\t"
  assert enwik8.decode(enwik8.encode(text)) == text
  with pytest.raises(IndexError, match=r"\[0, 256\)"):
    enwik8.decode([300])
  with pytest.raises(IndexError, match=r"\[0, 27\)"):
    corpus.decode([-1])


def test_streaming_decode_holds_back_incomplete_utf8():
  corpus = _corpus(ByteTokenizer().vocab, ByteTokenizer())
  ids = corpus.encode("aà日\U0001F600b")
  decoder = corpus.decoder()
  pieces = [decoder.decode(ids[i : i + 1]) for i in range(len(ids))] + [decoder.decode([], True)]
  assert "".join(pieces) == "aà日\U0001F600b"
  assert pieces[1] == "" and pieces[2] == "à"  # the 2-byte "à" comes out once complete
  assert corpus.decode(ids[:-2]) == "aà日\ufffd"  # an incomplete final sequence, replaced
  assert corpus.decode([0xFF, 0x61]) == "\ufffda"  # an invalid byte


def test_streaming_decode_of_words_continues_lines():
  corpus = _corpus(["<eos>", "the", "cat"], LineTokenizer("ptb"))
  ids = corpus.encode("the cat\ncat the\n")
  decoder = corpus.decoder()
  pieces = [decoder.decode([t]) for t in ids]
  assert pieces == ["the", " cat", "\n", "cat", " the", "\n"]
  assert "".join(pieces) == corpus.decode(ids)


def test_encode_can_leave_the_last_line_open():
  corpus = _corpus(["<eos>", "the", "cat"], LineTokenizer("ptb"))
  np.testing.assert_array_equal(corpus.encode("the cat\nthe", end_last_line=False), [1, 2, 0, 1])
  np.testing.assert_array_equal(corpus.encode("the cat\n", end_last_line=False), [1, 2, 0])
  np.testing.assert_array_equal(corpus.encode("the\r\ncat\r\n", end_last_line=False), [1, 0, 2, 0])
  np.testing.assert_array_equal(corpus.encode("the cat"), [1, 2, 0])
  assert corpus.encode("", end_last_line=False).size == 0
  enwik8 = _corpus(ByteTokenizer().vocab, ByteTokenizer())
  np.testing.assert_array_equal(enwik8.encode("a\n", end_last_line=False), [97, 10])


def test_unk_id():
  assert _corpus(["<eos>", "the", "<unk>"], LineTokenizer("ptb")).unk_id == 2
  assert _corpus(["<eos>", "a", "_"], LineTokenizer("ptb_char", chars=True)).unk_id is None
  assert _corpus(ByteTokenizer().vocab, ByteTokenizer()).unk_id is None
