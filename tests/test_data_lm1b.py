"""Tests of transformer_xl.data.lm1b: the One Billion Word builder.

The builder is fed tiny shards with the canonical names and directories
(as a tarball, as the extracted tree, as flat files) and its streams,
sentence offsets and vocabulary are compared with an independent
tokenisation.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

from transformer_xl.data import Corpus, DataError, lm1b, load_corpus, sentence_offsets

from data_samples import (
    _HELDOUT,
    _TRAIN,
    ARCHIVE,
    URL,
    _heldout_name,
    _lines,
    _load_lm1b,
    _members,
    _sentences,
    _tarball,
    _train_name,
    _write_files,
)


def _vocab_by_rule(train_sentences: list[list[str]]) -> list[str]:
  """Independent version of the documented rule: count >= 3, <S> counted
  once per sentence, <UNK> = sum of the rest, by count then code point."""
  counts = collections.Counter(w for s in train_sentences for w in s)
  counts["<S>"] += len(train_sentences)
  keep = {w: c for w, c in counts.items() if c >= 3 and w not in ("<S>", "<UNK>")}
  keep["<S>"] = counts["<S>"]
  keep["<UNK>"] = sum(c for w, c in counts.items() if w not in keep and w != "<S>")
  return sorted(keep, key=lambda w: (-keep[w], w))


def _encode(sentences: list[list[str]], vocab: list[str]):
  index = {w: i for i, w in enumerate(vocab)}
  ids, lengths = [], []
  for s in sentences:
    ids += [index.get(w, index["<UNK>"]) for w in s] + [index["<S>"]]
    lengths.append(len(s) + 1)
  return np.array(ids, np.int32), np.array(lengths)


def _expected(shards=(1, 2, 3), vocab=None):
  train = [s for i in shards for s in _sentences(_TRAIN[i])]
  if vocab is None:
    vocab = _vocab_by_rule(train)
  heldout = _sentences(_HELDOUT[0])
  tokens, lengths = {}, {}
  tokens["train"], lengths["train"] = _encode(train, vocab)
  tokens["valid"], lengths["valid"] = _encode(heldout, vocab)
  tokens["test"], lengths["test"] = _encode(heldout, vocab)
  return vocab, tokens, lengths


def _check(corpus: Corpus, vocab, tokens, lengths):
  assert corpus.name == "lm1b" and corpus.unit == "word"
  assert list(corpus.vocab) == list(vocab)
  assert corpus.boundary_id == list(vocab).index("<S>")
  assert set(corpus.sentence_offsets) == {"train", "valid", "test"}
  for split in ("train", "valid", "test"):
    src, index = corpus.splits[split], corpus.sentence_offsets[split]
    n = len(tokens[split])
    assert src.num_tokens == n and src.num_chunks >= 2
    np.testing.assert_array_equal(src.read(0, n), tokens[split])
    assert index.num_sentences == len(lengths[split])
    offsets = index.read_offsets(0, index.num_sentences + 1)
    assert offsets.dtype == np.int64
    np.testing.assert_array_equal(offsets, sentence_offsets(lengths[split]))
    np.testing.assert_array_equal(index.read_offsets(1, 3), offsets[1:3])
    with pytest.raises(IndexError):
      index.read_offsets(0, index.num_sentences + 2)
    # Each sentence ends with exactly one <S>, and only there.
    ends = offsets[1:] - 1
    is_boundary = src.read(0, n) == corpus.boundary_id
    np.testing.assert_array_equal(np.flatnonzero(is_boundary), ends)


@pytest.mark.parametrize("layout", ["tarball", "tree", "flat"])
def test_builds_from_canonical_layouts(tmp_path, layout):
  manual = tmp_path / "manual"
  if layout == "tarball":
    _tarball(manual / ARCHIVE, _members())
  else:
    _write_files(manual, _members(), flat=(layout == "flat"))
  corpus = _load_lm1b(tmp_path, manual)
  vocab, tokens, lengths = _expected()
  # The rule, by hand: 23 train sentences give <S> 23; "." ends 20 of them;
  # the many words seen once or twice add up to more (<UNK> first); "Città"
  # (2x) is rare, "zebra" (3x) is not.
  assert vocab[:3] == ["<UNK>", "<S>", "."]
  assert "Città" not in vocab and "zebra" in vocab
  _check(corpus, vocab, tokens, lengths)
  # valid == test == held-out shard 00000 (00001 unused).
  n = corpus.splits["valid"].num_tokens
  assert corpus.splits["test"].num_tokens == n
  np.testing.assert_array_equal(corpus.splits["valid"].read(0, n), corpus.splits["test"].read(0, n))
  words = [corpus.vocab[t] for t in corpus.splits["test"].read(0, 8)]
  assert words == ["The", "cat", "sat", "on", "a", "zebra", ".", "<S>"]
  builder = lm1b.TxlLm1b(data_dir=tmp_path / "tfds")
  md = builder.info.metadata
  assert md["train_shards"] == [_train_name(i) for i in (1, 2, 3)]
  assert md["heldout_shard"] == _heldout_name(0)
  assert md["num_sentences"] == {s: len(lengths[s]) for s in lengths}
  assert md["checksums_verified"] is False


def test_train_shards_in_shard_order(tmp_path):
  """Whatever order the files have in the archive, train is 1, 2, 3."""
  manual = tmp_path / "manual"
  members = _members()
  reordered = dict(sorted(members.items(), reverse=True))
  _tarball(manual / ARCHIVE, reordered)
  corpus = _load_lm1b(tmp_path, manual)
  _check(corpus, *_expected())


def test_subset_of_shards(tmp_path):
  manual = tmp_path / "manual"
  _write_files(manual, _members(train=(2, 3)), flat=False)
  corpus = _load_lm1b(tmp_path, manual)
  _check(corpus, *_expected(shards=(2, 3)))


def test_vocabulary_file_is_used_as_the_reference_does(tmp_path):
  manual = tmp_path / "manual"
  _tarball(manual / ARCHIVE, _members())
  # "symbol count" lines; the reference takes the first field; a repeated
  # symbol keeps its first id.
  entries = ["the 100", ", 90", "<S> 80", "cat 70", "<UNK> 60", "Città 5", "cat 3", "zebra 1"]
  (manual / "1b_word_vocab.txt").write_text("\n".join(entries) + "\n", encoding="utf-8")
  corpus = _load_lm1b(tmp_path, manual)
  vocab = ["the", ",", "<S>", "cat", "<UNK>", "Città", "zebra"]
  _check(corpus, vocab, *_expected(vocab=vocab)[1:])
  assert corpus.boundary_id == 2
  md = lm1b.TxlLm1b(data_dir=tmp_path / "tfds").info.metadata
  assert "1b_word_vocab.txt" in md["vocab_source"]


def test_vocabulary_file_without_unk(tmp_path):
  manual = tmp_path / "manual"
  _write_files(manual, _members(), flat=True)
  (manual / "1b_word_vocab.txt").write_text("the 3\n<S> 2\n")
  with pytest.raises(DataError, match="lacks the symbol <UNK>"):
    _load_lm1b(tmp_path, manual)


def test_build_vocab_rule():
  counts = {"b": 5, "a": 5, "<S>": 5, "c": 2, "d": 1, "<UNK>": 1, "e": 3}
  # c, d and the literal <UNK>: 2 + 1 + 1 = 4 for <UNK>; ties by code point.
  assert lm1b.build_lm1b_vocab(counts) == ["<S>", "a", "b", "<UNK>", "e"]
  assert lm1b.build_lm1b_vocab({"x": 1}) == ["<UNK>", "<S>"]
  # <S> and <UNK> (count 0) are always in.
  assert lm1b.build_lm1b_vocab({"x": 1}, min_freq=1) == ["x", "<S>", "<UNK>"]


def test_missing_files_fail_fast(tmp_path):
  manual = tmp_path / "manual"
  start = time.monotonic()
  with pytest.raises(DataError) as err:
    load_corpus("lm1b", data_dir=tmp_path / "tfds", manual_dir=manual, download=False)
  assert time.monotonic() - start < 5
  message = str(err.value)
  for piece in [
      "news.en-00001-of-00100",
      "news.en.heldout-00000-of-00050",
      str(manual),
      ARCHIVE,
      URL,
      "No published checksum",
      "training-monolingual.tokenized.shuffled",
      "1b_word_vocab.txt",
  ]:
    assert piece in message
  assert not (tmp_path / "tfds" / "txl_lm1b").exists()


def test_missing_heldout_shard(tmp_path):
  manual = tmp_path / "manual"
  _write_files(manual, _members(heldout=(1,)), flat=False)
  with pytest.raises(DataError, match=r"news\.en\.heldout-00000-of-00050 not found"):
    _load_lm1b(tmp_path, manual)


@pytest.mark.parametrize("as_archive", [False, True])
def test_verify_requires_all_99_training_shards(tmp_path, as_archive):
  manual = tmp_path / "manual"
  if as_archive:
    _tarball(manual / ARCHIVE, _members())
  else:
    _write_files(manual, _members(), flat=False)
  with pytest.raises(DataError) as err:
    _load_lm1b(tmp_path, manual, verify_checksums=True)
  message = str(err.value)
  assert "news.en-00004-of-00100" in message
  assert "(96 files)" in message  # 00004..00099 are missing
  assert not (tmp_path / "tfds" / "txl_lm1b").exists()


def test_verify_with_the_documented_structure(tmp_path):
  """All 99 training shards present: the structure check passes; a
  vocabulary file must then have the reference's 793,471 entries."""
  manual = tmp_path / "manual"
  _write_files(manual, _members(train=range(1, 100)), flat=False)
  corpus = _load_lm1b(tmp_path, manual, verify_checksums=True)
  md = lm1b.TxlLm1b(data_dir=tmp_path / "tfds").info.metadata
  assert md["checksums_verified"] is True
  assert len(md["train_shards"]) == 99
  assert corpus.sentence_offsets["train"].num_sentences == (
      sum(len(_lines(_TRAIN.get(i, "a b c\n"))) for i in range(1, 100))
  )
  (manual / "1b_word_vocab.txt").write_text("<S> 2\n<UNK> 1\nthe 1\n")
  with pytest.raises(DataError, match="793,471"):
    load_corpus(
        "lm1b",
        data_dir=tmp_path / "other",
        manual_dir=manual,
        download=False,
        verify_checksums=True,
    )


def test_prepared_dataset_loads_without_sources(tmp_path):
  manual = tmp_path / "manual"
  archive = _tarball(manual / ARCHIVE, _members())
  first = _load_lm1b(tmp_path, manual)
  archive.unlink()
  again = load_corpus("lm1b", data_dir=tmp_path / "tfds", download=False)
  assert again.vocab == first.vocab
  _check(again, *_expected())


def test_unreadable_archive(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / ARCHIVE).write_bytes(b"not a tar file at all" * 10)
  with pytest.raises(DataError, match="Cannot read the archive"):
    _load_lm1b(tmp_path, manual)
