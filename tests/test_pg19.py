"""PG-19 (``data.dataset="tfds:pg19"``) offline, over tfds's mock data.

The mock books come from ``tfds.testing.mock_data`` (``scripts/mock_tfds.py``:
every tfds dataset mocked but this package's own, so the preparation into
the tokenised corpus is the real one).  Each book is one document; its
tokens, bytes and whitespace words are counted here from the mock books
themselves; ``configs/pg19_small.py`` trains with the memory reset at book
boundaries and evaluates whole books, with word-level perplexity.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from transformer_xl import data

from helpers import REPO, load_config, mock_tfds_module, run_python

SCRIPT = REPO / "scripts" / "mock_tfds.py"
BOOKS = 48  # mock examples per split (about 780 bytes: enough rows for the config's batch)


def _mock_books(num_examples=BOOKS):
  """split -> the mock books' texts, read through tfds as the corpus reads them."""
  import tensorflow_datasets as tfds

  with mock_tfds_module().mock_tfds_but_ours(num_examples):
    builder = tfds.builder("pg19")
    return {
        ours: [ex["book_text"] for ex in builder.as_data_source(theirs)]
        for ours, theirs in (("train", "train"), ("valid", "validation"), ("test", "test"))
    }


@pytest.mark.smoke
def test_pg19_small_reads_each_book_as_a_document(tmp_path):
  config = load_config("pg19_small")
  config.data.data_dir = str(tmp_path / "tfds")
  with mock_tfds_module().mock_tfds_but_ours(BOOKS):
    corpus = data.load_configured(config.data.to_dict())
  books = _mock_books()
  assert corpus.unit == "byte"
  for split, texts in books.items():
    assert len(texts) == BOOKS and all(isinstance(t, str) and t for t in texts)
    n = corpus.documents[split].num_sentences
    assert n == BOOKS, split
    # Bytes: a book's lines, each with its line break (the byte tokenizer's end symbol).
    want = [sum(len(line.encode()) + 1 for line in t.splitlines()) for t in texts]
    assert np.diff(corpus.documents[split].read_offsets(0, n + 1)).tolist() == want
    assert corpus.document_bytes[split].read(0, n).tolist() == want
    assert corpus.document_words[split].read(0, n).tolist() == [len(t.split()) for t in texts]
    assert corpus.num_words[split] == len(" ".join(texts).split())
    assert corpus.num_bytes[split] == sum(want) == corpus.splits[split].num_tokens
  # Training with the config's data.documents="reset": every target's doc_pos is its
  # offset in its book (target j of row r is stream token r * row_len + step * T + k + 1).
  lengths = [sum(len(line.encode()) + 1 for line in t.splitlines()) for t in books["train"]]
  book_start = np.repeat(np.cumsum([0] + lengths[:-1]), lengths)
  b, t = config.train.global_batch, config.model.tgt_len
  it = data.make_train_iterator(corpus, "train", b, t, 0, documents=config.data.documents)
  for step in range(it.steps_per_epoch):
    batch = next(it)
    target = np.arange(b)[:, None] * it.row_len + step * t + np.arange(t)[None, :] + 1
    np.testing.assert_array_equal(batch["doc_pos"], target - book_start[target])


def _run(args, timeout=600):
  """scripts/mock_tfds.py (the command line over tfds's mock data) ARGS, on one CPU device."""
  return run_python([SCRIPT, f"--mock_examples={BOOKS}", *args], devices=1, timeout=timeout)


@pytest.mark.slow
def test_pg19_small_trains_and_evaluates_whole_books_offline(tmp_path):
  workdir, tfds_dir = tmp_path / "wd", tmp_path / "tfds"
  r = _run(
      [
          f"--config={REPO / 'configs' / 'pg19_small.py'}",
          f"--workdir={workdir}",
          f"--config.data.data_dir={tfds_dir}",
          "--config.train.num_steps=2",
          "--config.train.warmup_steps=0",
          "--config.train.eval_every=0",
          "--config.train.log_every=1",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "a document is a tfds example; data.documents=reset" in r.stdout, r.stdout[-3000:]
  r = _run([f"--workdir={workdir}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"eval test: {BOOKS}/{BOOKS} documents scored" in r.stdout, r.stdout[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["eval"]["documents"] == "whole"
  books = _mock_books()
  for split in ("valid", "test"):
    res, texts = results[split], books[split]
    words = len(" ".join(texts).split())
    total = res["loss_nats"] * res["tokens"]
    assert res["words"] == words and res["documents_scored"] == BOOKS
    assert res["word_ppl"] == pytest.approx(math.exp(total / words), rel=1e-9)
    per = res["per_document"]
    assert [d["words"] for d in per] == [len(t.split()) for t in texts]
    assert sum(d["tokens"] for d in per) == res["tokens"]
    np.testing.assert_allclose(sum(d["loss_nats"] * d["tokens"] for d in per), total, rtol=1e-9)
    for d in per:
      assert d["word_ppl"] == pytest.approx(
          math.exp(d["loss_nats"] * d["tokens"] / d["words"]), rel=1e-9
      )


@pytest.mark.slow
def test_compressive_pg19_config_starts_offline_at_tiny_shapes(tmp_path):
  """The paper-sized PG-19 config (configs/compressive_pg19.py) with its
  shapes shrunk: SentencePiece over the mock books, the compressive memory,
  the start-up line with the paper's result, two steps, whole-book eval."""
  workdir = tmp_path / "wd"
  tiny = {
      "model.n_layer": 2,
      "model.d_model": 32,
      "model.n_head": 2,
      "model.d_head": 16,
      "model.d_inner": 64,
      "model.tgt_len": 8,
      "model.mem_len": 8,
      "model.compressive.cmem_len": 4,
      "data.vocab_size": 400,  # the mock books have 269 characters
      "train.global_batch": 4,
      "train.num_steps": 2,
      "train.warmup_steps": 0,
      "train.eval_every": 0,
      "train.log_every": 1,
      "eval.tgt_len": 8,
      "eval.mem_len": 8,
      "eval.global_batch": 4,
  }
  r = _run(
      [
          f"--config={REPO / 'configs' / 'compressive_pg19.py'}",
          f"--workdir={workdir}",
          f"--config.data.data_dir={tmp_path / 'tfds'}",
          *(f"--config.{k}={v}" for k, v in tiny.items()),
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  line = next(l for l in r.stdout.splitlines() if l.startswith("Model:"))
  assert "paper: no parameter count reported, 33.6 word-level ppl (test)" in line, line
  r = _run([f"--workdir={workdir}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["eval"]["compressive"] == {"cmem_len": 4}
  assert results["eval"]["documents"] == "whole"
  assert results["test"]["documents_scored"] == BOOKS and results["test"]["word_ppl"] > 1
