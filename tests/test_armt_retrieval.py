"""Associative retrieval as the ARMT authors train it (data/armt_retrieval.py,
``data.dataset="synthetic:armt_retrieval"``): their layout and loss positions
on samples drawn by their own code (tests/fixtures/armt_ar.npz, made by
scripts/make_ar_fixtures.py), their draws' invariants, the corpus and its scoring."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.data import armt_retrieval as ar
from transformer_xl.data import example_corpus, synthetic
from transformer_xl.inference import evaluate
from transformer_xl.model import models

FIXTURE = np.load(Path(__file__).parent / "fixtures" / "armt_ar.npz")
CASES = sorted({name.split("_")[0] for name in FIXTURE.files})  # k1v1p1, ..., k3v2p4


def sizes(case):
  k, v, p = (int(x) for x in case[1:].replace("v", " ").replace("p", " ").split())
  return k, v, p


def settings(case, **changes):
  k, v, p = sizes(case)
  s = synthetic.TaskSettings(
      task="armt_retrieval", key_size=k, value_size=v, num_pairs=p, train_size=50,
      valid_size=20, test_size=10,
  )  # fmt: skip
  return dataclasses.replace(s, **changes)


@pytest.mark.parametrize("case", CASES)
def test_their_samples_are_laid_out_token_for_token_with_their_loss_positions(case):
  f = {name[len(case) + 1 :]: FIXTURE[name] for name in FIXTURE.files if name.startswith(case)}
  s = settings(case)
  seq_NxS = ar.layout(f["keys"], f["values"], f["target"])
  assert seq_NxS.shape[1] == s.sequence_len
  # The model reads seq[:-1]: their input_ids, in their segments of K + V + 2.
  np.testing.assert_array_equal(seq_NxS[:, :-1], f["input_ids"])
  assert (seq_NxS[:, -1] == ar.EOS).all()
  assert s.example_len % ar.segment_len(*sizes(case)[:2]) == 0
  # Weighed targets: position t predicts seq[t + 1]; theirs are labels_mask[:-1] (their shift).
  counts = np.full(len(seq_NxS), s.weighed_len)
  weighed = example_corpus.weighed(s, counts, np.arange(s.example_len))
  np.testing.assert_array_equal(weighed[:, :-1], f["labels_mask"][:, :-1].astype(bool))
  assert not weighed[:, -1].any()  # the appended EOS: read by nothing, predicted for nothing
  # Greedy decoding starts after GEN: the prompt is their input_ids_generate.
  start = s.example_len - s.answer_len  # the first answer target: read at GEN
  np.testing.assert_array_equal(seq_NxS[:, : start + 1], f["input_ids_generate"])
  # --vary_n_segments: their last n pairs, the queried pair drawn among them.
  n, p = int(f["vary_n"]), sizes(case)[2]
  keys, values, _ = ar.last_pairs(np.random.default_rng(0), f["keys"], f["values"], n)
  np.testing.assert_array_equal(keys, f["keys"][:, p - n :])
  varied = ar.layout(keys, values, f["vary_target"])
  np.testing.assert_array_equal(varied[:, :-1], f["vary_input_ids"])
  short = dataclasses.replace(s, num_pairs=n)
  weighed = example_corpus.weighed(short, counts, np.arange(short.example_len))
  np.testing.assert_array_equal(weighed[:, :-1], f["vary_labels_mask"][:, :-1].astype(bool))


@pytest.mark.parametrize("key_size, num_pairs", [(1, 1), (1, 16), (2, 7), (3, 40)])
def test_draws_have_distinct_keys_uniform_symbols_and_queries(key_size, num_pairs):
  n = 4000
  keys, values, target = ar.draw(np.random.default_rng(1), key_size, 2, num_pairs, n)
  assert keys.shape == (n, num_pairs, key_size) and values.shape == (n, num_pairs, 2)
  ints = (keys * ar.NUM_SYMBOLS ** np.arange(key_size)).sum(-1)  # least significant first
  assert all(len(set(row)) == num_pairs for row in ints)  # distinct within a sample
  for x in (keys, values):
    assert x.min() >= 0 and x.max() < ar.NUM_SYMBOLS
    freq = np.bincount(x.reshape(-1), minlength=16) / x.size
    assert np.abs(freq - 1 / 16).max() < 0.02  # uniform symbols
  freq = np.bincount(target, minlength=num_pairs) / n
  assert target.min() >= 0 and target.max() < num_pairs
  assert np.abs(freq - 1 / num_pairs).max() < 0.05  # the query uniform over the pairs
  # The first key is uniform over all 16**K values, not only small ones.
  assert ints[:, 0].max() >= 16**key_size * 0.9 and ints[:, 0].min() < 16**key_size * 0.1
  if num_pairs == 16**key_size:  # every key once: a permutation per sample
    assert (np.sort(ints, axis=1) == np.arange(num_pairs)).all()
  n_pairs = {
      int(ar.last_pairs(np.random.default_rng(i), keys, values)[0].shape[1]) for i in range(60)
  }
  assert (
      n_pairs == set(range(1, num_pairs + 1))
      if num_pairs <= 7
      else n_pairs <= set(range(1, num_pairs + 1))
  )


def test_the_corpus_splits_weights_and_settings():
  s = settings("k2v1p5")
  corpus = synthetic.load(s)
  assert corpus.name == "synthetic:armt_retrieval" and corpus.vocab_size == 103 == s.n_token
  assert corpus.vocab[ar.SEP] == "<sep>" and corpus.vocab[15] == "f"
  for split, size in s.sizes.items():
    ex = corpus.examples[split]
    assert ex.shape == (size, 6 * 5 + 1)
    assert (corpus.counts(split) == 2).all()  # the value and EOS, not the appended EOS
    seg = ex[:, :-1].reshape(size, 6, 5)  # key key SEP value EOS | ... | key key GEN value EOS
    assert (seg[:, :5, 2] == ar.SEP).all() and (seg[:, 5, 2] == ar.GEN).all()
    assert (seg[:, :, 4] == ar.EOS).all()
    for row in seg:
      pairs = {tuple(r[:2]): r[3] for r in row[:5]}
      assert pairs[tuple(row[5, :2])] == row[5, 3]  # the answer is the queried key's value
  # Independent draws from one seed: the same corpus twice, another with another seed.
  np.testing.assert_array_equal(synthetic.generate(s)["train"], corpus.examples["train"])
  assert not np.array_equal(synthetic.generate(dataclasses.replace(s, seed=1))["train"],
                            corpus.examples["train"])  # fmt: skip
  # Splits of the authors' size need no distinct inputs (theirs are drawn with repeats).
  assert not synthetic.settings_problems(settings("k1v1p1", train_size=100_000))
  problems = {
      "num_pairs=17": synthetic.settings_problems(settings("k1v1p1", num_pairs=17)),
      "key_size=0": synthetic.settings_problems(settings("k1v1p1", key_size=0)),
      "value_size=0": synthetic.settings_problems(settings("k1v1p1", value_size=0)),
  }
  assert "synthetic_num_pairs=17 must be in [1, 16]" in problems["num_pairs=17"][0]
  assert "data.synthetic_key_size" in problems["num_pairs=17"][0]
  assert "synthetic_key_size=0 must be in [1, 4]" in problems["key_size=0"][0]
  assert "synthetic_value_size=0 must be >= 1" in problems["value_size=0"][0]
  # Its settings apply to it only; the others' to the others.
  copy = synthetic.TaskSettings(task="copy", key_size=2)
  (line,) = synthetic.settings_problems(copy, synthetic.TaskSettings(task="copy"))
  assert "data.synthetic_key_size applies only to synthetic:armt_retrieval" in line


def test_evaluation_and_greedy_decoding_score_the_value_and_eos_only():
  """At a random initialisation: the teacher-forced accuracy counts the V + 1
  weighed tokens (not the appended EOS) of each example, and the greedy scores
  equal a naive count over the same tokens."""
  config = default_config.get_config()
  config.data.dataset = "synthetic:armt_retrieval"
  config.data.update(
      synthetic_num_pairs=3, synthetic_train_size=16, synthetic_valid_size=12,
      synthetic_test_size=4,
  )  # fmt: skip
  config.model.update(
      n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0,
      tgt_len=4, mem_len=4, init_std=0.3,
  )  # fmt: skip
  config.eval.update(tgt_len=4, mem_len=4, same_length=False, global_batch=4)
  config.train.global_batch = 8
  default_config.validate(config, jax.device_count(), training=False)
  corpus = data.load_configured(config.data.to_dict())
  mcfg = default_config.model_config(config, corpus.vocab_size)
  model = models.TransformerXL(mcfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  # Bias the value and EOS so that a share of answers is right.
  bias = np.zeros(103, np.float32)
  bias[[ar.EOS, *range(4)]] = 4.0
  params["crit"]["out_bias_0"] = params["crit"]["out_bias_0"] + bias
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh)
  seqs = corpus.examples["valid"]
  forced = evaluator.evaluate(params, "valid")
  assert forced["examples"] == 12 and forced["tokens"] == 12 * 2  # value + EOS per example
  got = evaluator.decode_answers(params, seqs)  # [12, 3]: value, EOS, appended EOS
  truth = seqs[:, -3:]
  right = got[:, :2] == truth[:, :2]
  res = evaluator.greedy_answers(params, "valid")
  assert 0 < right.mean() < 1, right  # some right, some wrong: the count means something
  assert res["greedy_token_accuracy"] == right.mean()
  assert res["greedy_accuracy"] == right.all(axis=1).mean() == forced["answer_accuracy"]


def test_vary_n_segments_batches_are_their_last_pairs_and_resume_the_same():
  """train.vary_n_segments's batches (armt_retrieval.VaryPairsWindows): per
  batch an n in 1..P, every example its last n pairs in its segments with a
  query among them, the value and EOS weighed; drawn from (seed, batch), so
  a moved iterator reads the same batches."""
  s = settings("k1v1p5", train_size=40)
  corpus = synthetic.load(s)
  base = example_corpus.ExampleIterator(corpus, "train", 4, 4)
  it = ar.VaryPairsWindows(base, 1, 1, seed=3)
  batches = [next(it) for _ in range(30)]
  seen = set()
  for i, b in enumerate(batches):
    n = b["reset"].shape[1] - 1  # pairs: the window's segments less the query's
    seen.add(n)
    assert 1 <= n <= 5 and b["inputs"].shape == (4, 4 * (n + 1))
    assert b["reset"][:, 0].all() and not b["reset"][:, 1:].any()
    rows = corpus.examples["train"][(i * 4 + np.arange(4)) % 40]
    keys, values = ar.split_pairs(rows, 1, 1)
    seg = b["inputs"].reshape(4, n + 1, 4)
    np.testing.assert_array_equal(seg[:, :n, 0], keys[:, 5 - n :, 0])  # the last n pairs
    np.testing.assert_array_equal(seg[:, :n, 2], values[:, 5 - n :, 0])
    pairs = [dict(zip(seg[r, :n, 0], seg[r, :n, 2])) for r in range(4)]
    assert all(pairs[r][seg[r, n, 0]] == seg[r, n, 2] for r in range(4))  # asked among them
    assert (seg[:, n, 1] == ar.GEN).all()
    np.testing.assert_array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
    w = b["weights"]
    assert w.sum() == 4 * 2 and w[:, -3:-1].all()  # the value and EOS after GEN
  assert len(seen) > 2  # n varies
  moved = ar.VaryPairsWindows(example_corpus.ExampleIterator(corpus, "train", 4, 4), 1, 1, 3)
  moved.set_state({**base.get_state(), "step": 17 * base.segments})
  again = next(moved)
  for k in ("inputs", "targets", "weights", "reset"):
    np.testing.assert_array_equal(again[k], batches[17][k])


@pytest.mark.slow
def test_training_with_vary_n_segments_runs_one_step_per_window_length(tmp_path):
  from helpers import read_metrics, run_main  # pylint: disable=import-outside-toplevel

  w = tmp_path / "w"
  r = run_main(
      [
          "--mode=train", f"--workdir={w}", "--config=configs/armt_retrieval.py:armt",
          "--config.data.synthetic_num_pairs=3", "--config.data.synthetic_train_size=64",
          "--config.data.synthetic_valid_size=8", "--config.data.synthetic_test_size=8",
          "--config.model.n_layer=1", "--config.model.d_model=16", "--config.model.n_head=2",
          "--config.model.d_head=8", "--config.model.d_inner=32", "--config.model.armt.d_mem=4",
          "--config.model.armt.num_mem_tokens=2", "--config.train.curriculum=()",
          "--config.train.num_steps=6", "--config.train.warmup_steps=0",
          "--config.train.schedule_steps=0", "--config.train.global_batch=4",
          "--config.train.mem_backprop_depth=3", "--config.train.vary_n_segments=True",
          "--config.train.log_every=1", "--config.train.eval_every=6",
          "--config.train.stop_metric=", "--config.train.stop_target=0",
          "--config.train.stop_patience=0", "--config.eval.global_batch=4",
      ],
      devices=1,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-3000:]
  rows = read_metrics(w)
  assert sorted(rows) == list(range(1, 7)) and all(
      np.isfinite(x["train/loss"]) for x in rows.values()
  )
  bad = run_main(
      ["--mode=train", f"--workdir={tmp_path / 'bad'}", "--config=configs/armt_retrieval.py:armt",
       "--config.train.vary_n_segments=True", "--config.train.mem_backprop_depth=0",
       "--config.train.bptt_bp=False", "--config.train.curriculum=()"],
      devices=1,
  )  # fmt: skip
  assert (
      bad.returncode == 1 and "set train.mem_backprop_depth=1 and train.bptt_bp=True" in bad.stderr
  )
