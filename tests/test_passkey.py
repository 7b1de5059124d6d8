"""The passkey retrieval task (data/passkey.py, ``data.dataset="synthetic:passkey"``):
Landmark Attention's prompt (Mohtashami & Jaggi 2023) in word tokens."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from transformer_xl import data, default_config
from transformer_xl.data import example_corpus, passkey, synthetic

from helpers import CONFIGS, run_main, tiny_flags

# The authors' strings (llama/run_test.py, generate_prompt), written out again here.
TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
GARBAGE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)


def naive_prompt(key: int, prefix: int, suffix: int) -> list[str]:
  """The authors' prompt as text, line by line, its filler cut at a word
  (``prefix``, ``suffix`` tokens) rather than a character; a line end is
  ``<eos>``, every digit its own token; the key after the question."""
  garbage_tokens = re.findall(r"\w+|[^\w\s]", " ".join([GARBAGE] * 100))
  lines = [
      TASK,
      " ".join(garbage_tokens[:prefix]),
      f"The pass key is {key}. Remember it. {key} is the pass key.",
      " ".join(garbage_tokens[:suffix]),
      f"What is the pass key? The pass key is {key}",
  ]
  out = []
  for line in lines:
    out += re.findall(r"\d|\w+|[^\w\s]", line) + ["<eos>"]
  return out[:-1]


@pytest.mark.parametrize("length,digits,depth", [(96, 5, 0), (96, 5, 21), (128, 3, 7), (80, 1, 0)])
def test_an_example_is_the_authors_prompt_with_the_key_as_answer(length, digits, depth):
  vocab = passkey.vocabulary()
  assert len(vocab) == len(set(vocab)) == 54 and vocab[:11] == [*"0123456789", "<eos>"]
  f = passkey.filler_len(length, digits)
  ex = passkey.examples(length, digits, depth, np.random.default_rng(depth), 20)
  assert ex.shape == (20, length + 1) and ex.dtype == np.int32
  for row in ex:
    key = int("".join(vocab[i] for i in row[-digits:]))
    assert 10 ** (digits - 1) <= key < 10**digits
    assert [vocab[i] for i in row] == naive_prompt(key, depth, f - depth)
    # The distance the docstring defines, found by hand: the key's second mention's last digit.
    last = np.nonzero(row[:-digits] < 10)[0][-1]
    assert passkey.key_distance(length, digits, depth) == (length - digits) - last
  np.testing.assert_array_equal(passkey.answers(ex[:, :-digits], digits), ex[:, -digits:])


def test_a_drawn_depth_covers_every_place_of_the_filler():
  s = synthetic.TaskSettings(task="passkey", passkey_len=96, passkey_digits=2)
  f = passkey.filler_len(96, 2)
  ex = passkey.examples(96, 2, -1, np.random.default_rng(0), 3000)
  eos = passkey.vocabulary().index("<eos>")
  depth = np.argmax(ex == eos, axis=1)  # the first line end: after the description
  depth = np.array([np.nonzero(r == eos)[0][1] for r in ex]) - depth - 1
  assert depth.min() == 0 and depth.max() == f and set(depth) == set(range(f + 1))
  assert s.distinct_inputs() == 90 * (f + 1) and s.answer_len == 2 and s.example_len == 96


def test_the_corpus_splits_score_only_the_key():
  s = synthetic.TaskSettings(
      task="passkey", passkey_len=96, train_size=200, valid_size=30, test_size=30
  )
  corpus = synthetic.load(s)
  assert corpus.vocab_size == s.n_token == 54 and corpus.vocab[corpus.boundary_id] == "<eos>"
  it = example_corpus.ExampleEvalIterator(corpus, "valid", 4, 32)
  targets, weights = [], []
  for b in it:
    targets.append(b["targets"]), weights.append(b["weights"])
  # Three segments per example; the weights mark the answer's five digits, nothing else.
  w = np.concatenate(weights[:3], axis=1)
  assert (w[0] > 0).sum() == 5 and np.all(np.concatenate(targets[:3], axis=1)[0][w[0] > 0] < 10)


def _problems(**data_fields):
  config = default_config.get_config()
  config.data.dataset = "synthetic:passkey"
  config.data.update({"synthetic_passkey_len": 96, **data_fields})
  config.model.update(tgt_len=32, mem_len=32)
  config.eval.update(tgt_len=32, mem_len=32)
  try:
    default_config.validate(config, jax.device_count(), training=False)
  except default_config.ConfigError as err:
    return str(err)
  return ""


def test_bad_passkey_settings_are_one_message_each():
  assert _problems() == ""
  assert "synthetic_passkey_len=40 is shorter than the prompt without filler (70" in _problems(
      synthetic_passkey_len=40
  )
  assert "synthetic_passkey_depth=99 must be -1 (drawn per example) or in [0, 26]" in _problems(
      synthetic_passkey_depth=99
  )
  assert "synthetic_passkey_digits=12 must be in [1, 9]" in _problems(synthetic_passkey_digits=12)
  assert "model.tgt_len=32 does not divide the synthetic:passkey example length 100" in (
      _problems(synthetic_passkey_len=100)
  )
  assert "data.synthetic_seq_len applies only to synthetic:copy" in _problems(synthetic_seq_len=5)
  config = default_config.get_config()
  config.data.update(dataset="synthetic:copy", synthetic_passkey_depth=3)
  with pytest.raises(default_config.ConfigError, match="passkey_depth applies only to synthetic"):
    default_config.validate(config, jax.device_count(), training=False)


@pytest.mark.slow  # two commands: ~40 s on 2 shared cores
def test_train_then_eval_at_a_chosen_depth_reports_the_answer_accuracy(tmp_path):
  """A few steps from the command line, then ``--mode=eval`` with the key
  at a fixed depth (a data setting the saved workdir lets an evaluation
  change): eval results carry the examples and their accuracies."""
  workdir = tmp_path / "pk"
  flags = [
      f"--config={CONFIGS / 'quickstart.py'}",
      f"--workdir={workdir}",
      "--config.data.dataset=synthetic:passkey",
      "--config.data.synthetic_passkey_len=96",
      "--config.data.synthetic_train_size=64",
      "--config.data.synthetic_valid_size=8",
      "--config.data.synthetic_test_size=8",
      *tiny_flags(
          model__tgt_len=32,
          model__mem_len=32,
          model__cutoffs="()",
          eval__tgt_len=32,
          eval__mem_len=32,
          eval__global_batch=8,
          train__num_steps=3,
      ),
  ]
  r = run_main(flags, devices=1)
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_main([*flags, "--mode=eval", "--config.data.synthetic_passkey_depth=0"], devices=1)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  for split in ("valid", "test"):
    res = results[split]
    assert res["examples"] == 8 and res["tokens"] == 8 * 5, res
    assert 0 <= res["answer_accuracy"] <= res["answer_token_accuracy"] <= 1, res
  corpus = data.load_configured(
      {
          **default_config.get_config().data.to_dict(),
          "dataset": "synthetic:passkey",
          "synthetic_passkey_len": 96,
          "synthetic_passkey_depth": 0,
      }
  )
  assert corpus.settings.passkey_depth == 0
