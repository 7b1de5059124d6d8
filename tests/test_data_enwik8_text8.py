"""Tests of transformer_xl.data.enwik8_text8: the enwik8 and text8 builders.

Each builder is fed a tiny file in its canonical archive format and the
decoded streams are compared with an independent tokenisation of the same
text.  A small chunk size makes every split span several records.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_xl.data import DataError, load_corpus

from data_samples import CHUNK, _check_corpus, _enwik8_bytes, _text8_text, _zip


@pytest.mark.parametrize("as_archive", [True, False])
def test_enwik8(tmp_path, as_archive):
  data = _enwik8_bytes()
  manual = tmp_path / "manual"
  manual.mkdir()
  if as_archive:
    _zip(manual / "enwik8.zip", {"enwik8": data})
  else:
    (manual / "enwik8").write_bytes(data)
  corpus = load_corpus(
      "enwik8",
      data_dir=tmp_path / "tfds",
      manual_dir=manual,
      verify_checksums=False,
      chunk_size=CHUNK,
  )
  ids = np.frombuffer(data, np.uint8).astype(np.int32)
  k = len(data) // 20  # 5% valid, 5% test (90M/5M/5M on the real file)
  expected = {"train": ids[: -2 * k], "valid": ids[-2 * k : -k], "test": ids[-k:]}
  assert len(expected["train"]) == 5400
  _check_corpus(
      corpus, "enwik8", tmp_path / "tfds", "byte", [chr(i) for i in range(256)], 10, expected
  )
  text = "".join(corpus.vocab[t] for t in corpus.splits["train"].read(0, 400))
  assert text.encode("latin-1") == data[:400]


def test_text8(tmp_path):
  text = _text8_text()
  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "text8.zip", {"text8": text.encode("ascii")})
  corpus = load_corpus(
      "text8",
      data_dir=tmp_path / "tfds",
      manual_dir=manual,
      verify_checksums=False,
      chunk_size=CHUNK,
  )
  alphabet = " abcdefghijklmnopqrstuvwxyz"
  ids = np.array([alphabet.index(c) for c in text], np.int32)
  k = len(text) // 20
  expected = {"train": ids[: -2 * k], "valid": ids[-2 * k : -k], "test": ids[-k:]}
  _check_corpus(corpus, "text8", tmp_path / "tfds", "char", list(alphabet), 0, expected)


def test_text8_rejects_other_characters(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "text8").write_bytes(b" anarchism originated\nas a term " * 20)
  with pytest.raises(DataError, match="byte 10 at offset 21"):
    load_corpus(
        "text8",
        data_dir=tmp_path / "tfds",
        manual_dir=manual,
        download=False,
        verify_checksums=False,
    )
