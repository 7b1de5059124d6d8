"""BABILong (data/babilong.py): samples equal to the authors' code, the
layout of examples, their weights, and the scoring.

The fixtures (tests/fixtures/babilong/) are bAbI-format files, background
documents and a tokenizer, and the samples the authors'
``babilong/babilong_utils.py`` built from them (``scripts/
make_babilong_fixtures.py``)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from transformer_xl import errors
from transformer_xl.data import (
    babilong,
    babilong_samples,
    babilong_sources,
    example_corpus,
    text_vocab,
)

from helpers import REPO
from helpers import babilong_data_cfg as _data_cfg

FIX = REPO / "tests" / "fixtures" / "babilong"
EXPECTED = json.loads((FIX / "expected.json").read_text())


@pytest.fixture(scope="module")
def tok():
  return text_vocab.load_pretrained(str(FIX / "tokenizer.json"), "babilong:test")


def _ours(case: dict, tok) -> tuple[list, int]:
  path = next(FIX.glob(f"{case['task']}_*_test.txt"))
  samples = babilong_samples.parse_task(path.read_text(), case["max_n_facts"] or 0)
  start, end = case["task_start_pct"], case["task_end_pct"]
  max_sentence_len = None if start is None else int((end - start) * 0.5 * case["sample_size"])
  docs = json.loads((FIX / "noise_test.json").read_text())
  sampler = babilong_samples.SentenceSampler(
      docs, tok.line_ids, max_sentence_len=max_sentence_len, shuffle=True, seed=case["seed"]
  )
  injection = babilong_samples.NoiseInjection(
      samples,
      sampler,
      tok.line_ids,
      case["sample_size"],
      start,
      end,
      case["mixed_length_ratio"],
      case["seed"],
  )
  return [injection.sample(i) for i in range(len(case["samples"]))], samples


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_samples_equal_the_authors_code(case, tok):
  """Every token of the context, question and answer and every fact position
  equal to what their TaskDataset + SentenceSampler + NoiseInjectionDataset
  made from the same files, tokenizer and seed, sample after sample (their
  sampler and generator carry state from one sample to the next)."""
  want = EXPECTED[case]
  got, samples = _ours(want, tok)
  assert len(samples) == want["len"]  # their __len__ (the last sample left out)
  for g, w, s in zip(got, want["samples"], samples):
    assert s.question == w["question"] and s.answer == w["answer"]
    assert list(s.facts) == w["facts"]
    assert g.fact_positions == w["fact_positions"]
    assert g.question_tokens == w["question_tokens"]
    assert g.target_tokens == w["target_tokens"]
    assert g.input_tokens == w["input_tokens"]


def test_the_fixtures_exercise_what_they_should():
  """Cut sentences, several facts at one position, placed facts, mixed
  lengths: otherwise the parity above would not test them."""
  qa1 = EXPECTED["qa1"]
  for s in qa1["samples"]:  # the context is exactly sample_size (the last sentence cut)
    assert len(s["input_tokens"]) == qa1["sample_size"]
  assert any(len(set(s["fact_positions"])) < len(s["fact_positions"]) for s in qa1["samples"])
  lengths = {len(s["input_tokens"]) for s in EXPECTED["qa1_curriculum"]["samples"]}
  assert len(lengths) >= 2 and lengths <= set(EXPECTED["qa1_curriculum"]["sample_size"])


def test_parse_task_splits_stories_into_questions():
  """A two-question story gives two samples: the second has every statement
  before it (the first question dropped); references by line number."""
  text = (
      "1 Mary moved to the bathroom.\n2 John went to the hallway.\n"
      "3 Where is Mary? \tbathroom\t1\n4 Daniel went back to the hallway.\n"
      "5 Where is Daniel? \thallway\t4\n1 Sandra went to the garden.\n"
      "2 Where is Sandra? \tgarden\t1\n1 X went to the office.\n2 Where is X? \toffice\t1\n"
  )
  s = babilong_samples.parse_task(text)
  assert len(s) == 3  # their __len__: the last of four samples is left out
  assert s[0].facts == ("Mary moved to the bathroom.", "John went to the hallway.")
  assert s[0].question == "Where is Mary? " and s[0].answer == "bathroom"
  assert s[1].facts == (
      "Mary moved to the bathroom.",
      "John went to the hallway.",
      "Daniel went back to the hallway.",
  )
  assert s[1].references == ("Daniel went back to the hallway.",)
  assert babilong_samples.parse_task(text, max_n_facts=3)[0].answer == "bathroom"
  assert [x.answer for x in babilong_samples.parse_task(text, max_n_facts=3)] == [
      "bathroom",
      "garden",
  ]
  with pytest.raises(errors.DataError, match="line 1"):
    babilong_samples.parse_task("Mary moved.\n")


def test_compare_answers_is_theirs():
  assert babilong_samples.compare_answers("bathroom", "The Bathroom. no kitchen")
  assert not babilong_samples.compare_answers("kitchen", "bathroom. kitchen")
  assert not babilong_samples.compare_answers("garden", "x <example> garden")
  assert babilong_samples.compare_answers("Bill", "bill")


def test_the_leaderboard_rule_is_theirs():
  """Their babilong/metrics.py compare_answers on outputs that reach each of
  its branches (scripts/make_babilong_leaderboard_fixtures.py ran it), and
  their labels."""
  fix = json.loads((FIX / "leaderboard_rule.json").read_text())
  assert {k: sorted(v) for k, v in fix["task_labels"].items()} == {
      k: sorted(v) for k, v in babilong_samples.TASK_LABELS.items()
  }
  for c in fix["cases"]:
    got = babilong_samples.leaderboard_answers(c["target"], c["output"], c["question"], c["task"])
    assert got == c["right"], c
    if c["right"]:  # stricter: what it takes, the training scripts' rule takes too
      assert babilong_samples.compare_answers(c["target"].split(",")[0], c["output"]), c
  assert sum(c["right"] for c in fix["cases"]) not in (0, len(fix["cases"]))


def test_layout_puts_the_answer_region_last():
  g = babilong_samples.Tokens([5, 6, 7], [8, 9], [3, 4], [0])
  ex, counts = babilong.layout_examples([g], gen_id=2, eos_id=0, sequence_len=12, answer_len=4)
  assert ex.tolist() == [[0, 0, 5, 6, 7, 8, 9, 2, 3, 4, 0, 0]]
  assert counts.tolist() == [3]  # the answer's two tokens and its eos
  with pytest.raises(errors.DataError, match="babilong_qa_margin"):
    babilong.layout_examples([g], 2, 0, sequence_len=9, answer_len=4)


def test_weights_cover_each_answer_and_its_eos_only():
  """Iterators weigh the first ``count`` positions of the answer region: an
  example with a shorter answer weighs fewer; the teacher-forced accuracy
  counts an example whole when all of its own positions are scored."""
  layout = babilong.Layout("qa1", sequence_len=9, answer_len=3)
  counts = np.array([3, 2])
  w = example_corpus.weighed(layout, counts, np.arange(8))
  assert w.astype(int).tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 0]]
  example = np.array([[0, 0, 0, 1, 1]])
  correct = np.array([[1, 1, 0, 1, 1]], bool)
  got = example_corpus.answer_scores(example, correct, counts)
  assert got["examples"] == 2 and got["answer_accuracy"] == 0.5
  assert math.isclose(got["answer_token_accuracy"], 4 / 5)


def test_the_corpus_lays_out_whole_examples(tmp_path):
  """load: every split's examples are S = sample_size + 1 tokens; each ends
  with its answer and eos; the text of the answer tokens is the answer; the
  test split is the authors' construction (the first samples of the test
  file with the noise of the test files, seed 42)."""
  from transformer_xl import data

  corpus = data.load_configured(_data_cfg(tmp_path))
  s = corpus.settings
  assert s.sequence_len == 161 and s.example_len == 160
  eos = corpus.boundary_id
  for split in ("train", "valid", "test"):
    ex = corpus.examples[split]
    counts = corpus.counts(split)
    assert ex.shape[1] == 161 and len(counts) == ex.shape[0] == len(corpus.answers[split])
    for row, c, answer in zip(ex, counts, corpus.answers[split]):
      region = row[-s.answer_len :].tolist()
      assert region[c - 1] == eos and all(t == eos for t in region[c:])
      assert corpus.decode(region[: c - 1]) == answer
  assert corpus.examples["valid"].shape[0] == 10
  assert corpus.examples["test"].shape[0] == len(
      babilong_samples.parse_task(next((tmp_path / "babi").glob("*_test.txt")).read_text(), 8)
  )


def test_the_test_split_is_the_authors_construction(tmp_path):
  """Loaded through the config, the test split's first examples hold the
  fixture's samples (context, question, GEN, answer, eos): the same
  construction as their test set (the test file in order, seed 42)."""
  from transformer_xl import data

  docs = json.loads((FIX / "noise_test.json").read_text())
  names = []
  for i, d in enumerate(docs):  # file names in the documents' order (the glob sorts them)
    (tmp_path / f"t{i:02d}.txt").write_text(d)
    names.append(str(tmp_path / f"t{i:02d}.txt"))
  want = EXPECTED["qa1"]
  cfg = _data_cfg(
      tmp_path,
      manual_dir=str(FIX),
      test_files=",".join(names),
      babilong_sample_size=want["sample_size"] + 20,
      babilong_max_n_facts=0,
  )
  corpus = data.load_configured(cfg)
  ex = corpus.examples["test"]
  s, eos = corpus.settings, corpus.boundary_id
  gen = corpus.tokenizer.line_ids("GEN")[0]
  for row, c, w in zip(ex, corpus.counts("test"), want["samples"]):
    prompt = w["input_tokens"] + w["question_tokens"] + [gen]
    end = s.sequence_len - s.answer_len
    assert row[end - len(prompt) : end].tolist() == prompt
    assert row[end : end + c].tolist() == w["target_tokens"] + [eos]


def test_missing_babi_files_name_the_files_and_where_they_go(tmp_path):
  from transformer_xl import data

  cfg = _data_cfg(tmp_path, manual_dir=str(tmp_path / "empty"))
  with pytest.raises(errors.DataError) as err:
    data.load_configured(cfg)
  msg = str(err.value)
  assert "qa1_single-supporting-fact_train.txt" in msg and str(tmp_path / "empty") in msg
  assert babilong_sources.ARCHIVE in msg and babilong_sources.URL in msg


def test_the_babi_archive_is_downloaded_when_absent(tmp_path, monkeypatch):
  """No files in the manual dir: the archive is fetched from its URL (a local
  server here) and the task's files read from it."""
  import io
  import tarfile

  from http_server import FileServer

  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:gz") as tf:
    for path in sorted(FIX.glob("qa1_*.txt")):
      data = path.read_bytes()
      info = tarfile.TarInfo(f"{babilong_sources.MEMBER_DIR}/{path.name}")
      info.size = len(data)
      tf.addfile(info, io.BytesIO(data))
  server = FileServer({"/babi.tar.gz": buf.getvalue()})
  try:
    monkeypatch.setattr(babilong_sources, "URL", server.url + "/babi.tar.gz")
    texts = babilong_sources.read_babi("qa1", str(tmp_path / "manual"), str(tmp_path / "tfds"))
  finally:
    server.close()
  assert texts["train"] == next(FIX.glob("qa1_*_train.txt")).read_text()
  assert texts["test"] == next(FIX.glob("qa1_*_test.txt")).read_text()
  assert (tmp_path / "tfds" / "downloads" / babilong_sources.ARCHIVE).is_file()


def test_greedy_scores_read_the_first_sentence_up_to_eos(tmp_path):
  """babilong_accuracy: the decoded text before the first eos, the answer in
  its first sentence; greedy_accuracy: the answer's tokens and eos exact."""
  from transformer_xl import data

  corpus = data.load_configured(_data_cfg(tmp_path, babilong_test_size=3))
  ex = corpus.examples["test"][:3]
  a_len = corpus.settings.answer_len
  preds = ex[:, -a_len:].copy()  # all right
  eos = corpus.boundary_id
  tok = corpus.tokenizer
  answer1 = corpus.answers["test"][1]
  wrong = tok.line_ids(". " + answer1)  # the answer after the first sentence: wrong
  preds[1, :] = eos
  preds[1, : min(len(wrong), a_len)] = wrong[:a_len]
  preds[2, corpus.counts("test")[2] - 1 :] = tok.line_ids("x")[0]  # no eos: not exact, still found
  got = corpus.greedy_scores("test", ex, preds)
  assert got["greedy_examples"] == 3
  assert math.isclose(got["greedy_accuracy"], 1 / 3)
  assert math.isclose(got["babilong_accuracy"], 2 / 3)


def _config(**data):
  from transformer_xl import default_config

  c = default_config.get_config()
  train = {k.split(".")[1]: data.pop(k) for k in list(data) if k.startswith("train.")}
  c.data.update(
      {
          "dataset": "babilong:qa2",
          "tokenizer": "pretrained:tok.json",
          "babilong_sample_size": 256,
          **data,
      }
  )
  c.model.memory = "armt" if train.get("mem_backprop_depth") else "xl"
  c.model.update(tgt_len=64, mem_len=64)
  c.eval.update(tgt_len=64, mem_len=64)
  c.train.update(global_batch=8, **train)
  c.eval.update(global_batch=8)
  return c


@pytest.mark.parametrize(
    "where, words",
    [
        ({"babilong_task_start_pct": 0.2}, "set together"),
        ({"babilong_task_start_pct": 0.7, "babilong_task_end_pct": 0.3}, "0 <= start < end"),
        ({"babilong_qa_margin": 256}, "leaves no context"),
        ({"babilong_train_sample_sizes": "64,512"}, "at most data.babilong_sample_size"),
        ({"babilong_train_sample_sizes": "a,b"}, "comma-separated"),
        ({"babilong_noise": "hf:pg19"}, "'tfds:pg19'"),
        ({"babilong_noise": "text"}, "data.train_files"),
        ({"tokenizer": "word"}, "pretrained tokenizer"),
        ({"synthetic_seq_len": 3}, "do not apply"),
        ({"dataset": "babilong:qa21"}, "babilong:qa20"),
        ({"dataset": "ptb", "babilong_sample_size": 512, "tokenizer": "word"}, "only to BABILong"),
        ({"babilong_sample_size": 200}, "does not divide"),
        ({"babilong_sample_size": 512, "train.mem_backprop_depth": 1}, "mem_backprop_depth=7"),
    ],
)
def test_bad_settings_are_refused_before_loading(where, words):
  from transformer_xl import default_config

  with pytest.raises(default_config.ConfigError, match=re.escape(words)):
    default_config.validate(_config(**where), 8)


def test_good_settings_pass():
  from transformer_xl import default_config

  default_config.validate(_config(babilong_task_start_pct=0.1, babilong_task_end_pct=0.9), 8)


@pytest.mark.parametrize(
    "variant, memory, n_params",
    [("armt", "armt", 139_019_101), ("tokens", "xl", 130_752_337), ("xl", "xl", 130_744_657)],
)
def test_the_babilong_config_validates_and_holds_its_docstrings_counts(variant, memory, n_params):
  """configs/babilong.py: each variant passes validation (two segments,
  backpropagation through both for the memories) and has the parameters
  its docstring states (GPT-2's vocabulary)."""
  import functools
  import importlib.util

  import jax
  from flax.core import meta

  from transformer_xl import default_config
  from transformer_xl.model import models

  path = REPO / "configs" / "babilong.py"
  spec = importlib.util.spec_from_file_location("babilong_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(variant)
  default_config.validate(c, 1)
  assert c.model.memory == memory
  mc = default_config.model_config(c, 50257)
  init = functools.partial(models.init_params, models.TransformerXL(mc))
  shapes = meta.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
  count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
  assert count == n_params
  assert f"{n_params:,}" in path.read_text()


def test_a_split_is_generated_only_when_read(tmp_path):
  """Evaluating never generates the training split: the corpus knows every
  split's length and answers before generating any."""
  from transformer_xl import data

  corpus = data.load_configured(_data_cfg(tmp_path))
  assert not any(corpus.examples.made(s) for s in ("train", "valid", "test"))
  n_test = corpus.splits["test"].num_tokens // corpus.settings.sequence_len
  assert n_test == len(corpus.answers["test"])
  tokens = corpus.splits["test"].read(0, corpus.settings.sequence_len)
  assert corpus.examples.made("test") and not corpus.examples.made("train")
  np.testing.assert_array_equal(tokens, corpus.examples["test"][0])


def test_the_pg19_background_is_read_book_by_book(tmp_path):
  """data.babilong_noise="tfds:pg19" (the authors'): each split's documents
  are the tfds split's books (tfds's mock data, offline), and a feature it
  lacks is named with PG-19's."""
  import tensorflow_datasets as tfds

  from helpers import mock_tfds_module

  s = babilong.BabilongSettings(task="qa1", text_key="book_text", tokenizer="pretrained:x")
  with mock_tfds_module().mock_tfds_but_ours(5):
    docs = babilong.noise_documents(s, data_dir=str(tmp_path / "tfds"))
    builder = tfds.builder("pg19", data_dir=str(tmp_path / "tfds"))
    for split, theirs in (("train", "train"), ("valid", "validation"), ("test", "test")):
      want = [ex["book_text"] for ex in builder.as_data_source(theirs)]
      assert len(docs[split]) == len(want) == 5
      assert [docs[split][i] for i in range(5)] == [
          w.decode() if isinstance(w, bytes) else w for w in want
      ]
    bad = babilong.BabilongSettings(task="qa1", text_key="text", tokenizer="pretrained:x")
    with pytest.raises(errors.DataError, match="text_key=book_text"):
      babilong.noise_documents(bad, data_dir=str(tmp_path / "tfds"))
