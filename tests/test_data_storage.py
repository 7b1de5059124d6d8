"""Tests of transformer_xl.data.storage and .prepared, and load_corpus: chunk records,
reloading, names."""

from __future__ import annotations

import time

import numpy as np
import pytest

from transformer_xl.data import CORPUS_NAMES, ArraySource, DataError, load_corpus
from transformer_xl.data.builders import BUILDERS
from transformer_xl.data.prepared import ChunkedSource

from data_samples import CHUNK, _ptb_tgz


def test_prepared_dataset_loads_without_sources(tmp_path):
  manual = tmp_path / "manual"
  archive = _ptb_tgz(manual)
  first = load_corpus(
      "ptb", data_dir=tmp_path / "tfds", manual_dir=manual, verify_checksums=False, chunk_size=CHUNK
  )
  archive.unlink()
  start = time.monotonic()
  again = load_corpus(
      "ptb", data_dir=tmp_path / "tfds", download=False, chunk_size=4 * CHUNK
  )  # ignored: stored chunk size wins
  assert time.monotonic() - start < 10
  assert again.vocab == first.vocab
  assert again.splits["train"].chunk_size == CHUNK
  for split in ("train", "valid", "test"):
    n = first.splits[split].num_tokens
    np.testing.assert_array_equal(again.splits[split].read(0, n), first.splits[split].read(0, n))


def test_unknown_name():
  with pytest.raises(ValueError, match="valid names: enwik8, text8, ptb"):
    load_corpus("ptb_word")
  assert set(CORPUS_NAMES) == set(BUILDERS)
  assert {b.name for b in BUILDERS.values()} == {
      "txl_enwik8",
      "txl_text8",
      "txl_ptb",
      "txl_ptb_char",
      "txl_wikitext2",
      "txl_wikitext103",
      "txl_lm1b",
  }


def test_chunked_source_checks_records():
  records = [{"tokens": np.arange(4, dtype=np.int32)}, {"tokens": np.arange(3, dtype=np.int32)}]
  with pytest.raises(DataError, match="2 records stored, expected 3"):
    ChunkedSource(records, num_tokens=9, chunk_size=4)
  src = ChunkedSource(records, num_tokens=6, chunk_size=4)
  with pytest.raises(DataError, match="record 1 holds 3 tokens, expected 2"):
    src.read(0, 6)
  np.testing.assert_array_equal(src.read(1, 3), [1, 2])
  np.testing.assert_array_equal(ArraySource(np.arange(6)).read(2, 5), [2, 3, 4])


def test_record_keys_keep_the_order_and_spread_over_tfds_shuffle_buckets():
  """tfds's shuffler holds a whole bucket in memory: the keys of a split's
  records must keep their order and fill its 1000 buckets evenly."""
  from tensorflow_datasets.core import shuffle

  from transformer_xl.data.storage import key_stride

  for num_tokens, chunk in [(518_000_000, 65536), (1_000, 64), (65536 * 1000, 65536), (1, 8)]:
    records = -(-num_tokens // chunk)
    stride = key_stride(num_tokens, chunk)
    keys = [i * stride for i in range(records)]
    assert keys[-1] < 2**128
    buckets = [shuffle.get_bucket_number(k, shuffle.BUCKETS_NUMBER) for k in keys]
    assert buckets == sorted(buckets)
    assert max(np.bincount(buckets)) <= -(-records // shuffle.BUCKETS_NUMBER) + 1
  assert key_stride(None, 64) == 1
