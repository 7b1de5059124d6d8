"""The long-range synthetic tasks (data/synthetic.py) and their accuracy
(inference/evaluate.py): copy, reverse and associative retrieval of
Bulatov et al. 2022 (arXiv 2207.06881, Sec. 4), generated and laid out as
the authors' generate_data.py and train_synthetic.py do."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from transformer_xl import data, default_config, errors, sharding
from transformer_xl.data import example_corpus, synthetic
from transformer_xl.inference import eval_steps, evaluate
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.training import train

from helpers import REPO, run_main


def small(task, **changes):
  """Small splits of a task: copy and reverse of 5 symbols of 6 (ids 2..7),
  retrieval of 3 pairs."""
  s = synthetic.TaskSettings(
      task=task, seq_len=5, num_tokens=8, num_pairs=3, train_size=300, valid_size=40, test_size=50
  )
  return dataclasses.replace(s, **changes)


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_every_answer_is_the_copy_the_reverse_or_the_retrieved_value(task):
  s = small(task)
  corpus = synthetic.load(s)
  assert corpus.name == f"synthetic:{task}" and corpus.vocab_size == s.n_token
  for split, size in s.sizes.items():
    ex = corpus.examples[split]
    assert ex.shape == (size, s.sequence_len) and ex.dtype == np.int32
    assert 0 <= ex.min() and ex.max() < s.n_token
    np.testing.assert_array_equal(corpus.splits[split].read(0, ex.size), ex.reshape(-1))
    for row in ex:  # one example at a time, as the authors' generators build them
      if task in ("copy", "reverse"):
        x, marker, answer = row[: s.seq_len], row[s.seq_len], row[s.seq_len + 1 :]
        assert marker == 1 and x.min() >= 2 and x.max() < s.num_tokens
        expected = [*x, *x] if task == "copy" else x[::-1]
        np.testing.assert_array_equal(answer, expected)
        assert len(answer) == s.answer_len
      elif task == "passkey":  # the digits are the key's only: twice in the prompt, then the answer
        (at,) = np.nonzero(row < 10)
        assert len(at) == 3 * s.passkey_digits
        np.testing.assert_array_equal(row[at].reshape(3, -1), [row[-s.passkey_digits :]] * 3)
        assert at[-1] == s.sequence_len - 1
      elif task == synthetic.ARMT:  # k SEP v EOS per pair, k GEN v EOS, EOS (test_armt_retrieval)
        seg = row[:-1].reshape(s.num_pairs + 1, 4)
        assert dict(seg[:-1, [0, 2]].tolist())[seg[-1, 0]] == seg[-1, 2] == row[-3]
        assert len(set(seg[:-1, 0])) == s.num_pairs and row[-1] == 102
      else:
        k = s.num_pairs
        keys, values, query = row[0 : 2 * k : 2], row[1 : 2 * k : 2], row[2 * k]
        assert len(set(keys)) == k and all(11 <= c <= 36 for c in keys)
        assert len(set(values)) == k and all(0 <= v <= 9 for v in values)
        assert row[2 * k + 1] == 10  # the query marker
        assert row[2 * k + 2] == dict(zip(keys, values))[query]
  assert s.example_len == s.sequence_len - 1


AUTHORS = Path(__file__).parent / "fixtures" / "synthetic_authors.npz"


@pytest.mark.parametrize("task", synthetic.RMT_TASKS)
def test_the_authors_code_gives_the_same_answers_segments_and_loss_positions(task):
  """Against a batch of the authors' generators, data_loader and torch.chunk
  (scripts/synthetic_authors_fixture.py ran their code at their settings)."""
  f = np.load(AUTHORS)
  x, y = f[f"{task}_X"], f[f"{task}_y"]
  s = synthetic.TaskSettings(task=task)  # the defaults are the authors' settings
  assert x.shape[1] + y.shape[1] == s.sequence_len
  assert s.answer_len == int(f[f"{task}_answer_size"])
  assert max(x.max(), y.max()) < s.n_token
  np.testing.assert_array_equal(synthetic.marked_answer(s, x), y)  # same answers
  # Their examples through our training iterator: their segments, their loss positions.
  examples = np.concatenate([x, y], axis=1)
  corpus = example_corpus.ExampleCorpus(
      name=f"synthetic:{task}",
      unit="word",
      vocab=synthetic.vocabulary(s),
      boundary_id=0,
      splits={"train": data.ArraySource(examples.reshape(-1))},
      settings=s,
      examples={"train": examples},
  )
  inputs_CxTxB, targets_CxTxB = f[f"{task}_inputs"], f[f"{task}_targets"]
  n_chunks, tgt_len, batch = inputs_CxTxB.shape
  it = example_corpus.ExampleIterator(corpus, "train", batch, tgt_len)
  weights = []
  for c in range(n_chunks):
    b = next(it)
    np.testing.assert_array_equal(b["inputs"], inputs_CxTxB[c].T)
    np.testing.assert_array_equal(b["targets"], targets_CxTxB[c].T)
    weights.append(b["weights"])
  # train_synthetic.py: loss = torch.cat(losses)[-args.answer_size:]
  np.testing.assert_array_equal(
      np.concatenate(weights, axis=1),
      np.broadcast_to(
          np.arange(n_chunks * tgt_len) >= n_chunks * tgt_len - s.answer_len,
          (8, n_chunks * tgt_len),
      ),
  )


def test_splits_are_disjoint_deterministic_and_sized():
  # 2 symbols, 10 positions: 1,024 inputs for 600 examples, so duplicates are drawn.
  s = small("copy", seq_len=10, num_tokens=4, train_size=500, valid_size=40, test_size=60)
  a, b = synthetic.generate(s), synthetic.generate(s)
  for split in a:
    np.testing.assert_array_equal(a[split], b[split])  # the seed decides everything
    assert len(a[split]) == s.sizes[split]
  inputs = [tuple(x[: s.seq_len]) for split in a for x in a[split]]
  assert len(set(inputs)) == len(inputs) == 600  # no input twice, within or across splits
  other = synthetic.generate(dataclasses.replace(s, seed=1))
  assert not np.array_equal(other["train"], a["train"])
  # 3 x 600 draws of 1,024 inputs hold duplicates: removing them is what keeps splits apart.
  rng = np.random.default_rng(s.seed)
  x = synthetic._inputs(s, rng, 3 * 600)  # pylint: disable=protected-access
  assert len(np.unique(x, axis=0)) < 3 * 600


def test_too_few_distinct_inputs_are_refused():
  s = small("copy", seq_len=3, num_tokens=4)  # 8 inputs for 390 examples
  assert "has only 8 distinct inputs" in " ".join(synthetic.settings_problems(s))
  # 512 inputs, 500 examples: 1,500 draws find about 485 of them.
  s = small("copy", seq_len=9, num_tokens=4, train_size=480, valid_size=10, test_size=10)
  assert not synthetic.settings_problems(s)
  with pytest.raises(errors.DataError, match="distinct inputs, fewer than the 500 examples"):
    synthetic.generate(s)


def test_the_count_of_distinct_inputs_is_capped_not_computed_for_a_huge_seq_len(monkeypatch):
  """A typo'd seq_len (10**8) once froze the settings check computing
  6 ** seq_len exactly; counts beyond the cap are the cap, smaller ones exact,
  and what would not fit in memory is refused before it is generated."""
  monkeypatch.setattr(synthetic, "_memory_gib", lambda: 24.0)
  assert synthetic.settings_problems(small("copy", seq_len=10**6)) == []  # 4.4 GiB
  for seq_len in (10**6, 10**8, 10**9):
    s = small("copy", seq_len=seq_len)
    assert s.distinct_inputs() == 2**64 and s.distinct_inputs(at_most=7) == 7
  for seq_len in (10**8, 10**9):
    s = small("copy", seq_len=seq_len)
    # Refused up front for what it would take (390 examples of ~3 seq_len int32 tokens).
    (problem,) = synthetic.settings_problems(s)
    assert f"390 examples of {s.example_len:,} tokens" in problem, problem
    assert "GiB, more than half this machine's memory" in problem
  assert small("copy", seq_len=21).distinct_inputs() == 6**21  # just below 2**64
  assert small("copy", seq_len=25).distinct_inputs() == 2**64  # 6**25 > 2**64
  assert small("copy", num_tokens=3, seq_len=10**9).distinct_inputs() == 1  # one symbol
  assert small("associative_retrieval").distinct_inputs() == 26 * 25 * 24 * 10 * 9 * 8 * 3


def test_training_batches_are_the_authors_segments_with_the_answer_weighed():
  s = small("copy")  # example length 15: 3 segments of 5
  corpus = synthetic.load(s)
  ex, B, T = corpus.examples["train"], 4, 5
  it = example_corpus.ExampleIterator(corpus, "train", B, T)
  n_chunks = s.example_len // T
  for e in range(80):  # 80 batches of 4 wrap around the 300 examples
    seg = [next(it) for _ in range(n_chunks)]
    for r in range(B):
      k = (e * B + r) % len(ex)
      src, tgt = ex[k][:-1], ex[k][1:]  # train_synthetic.py: np.hstack((X, y)), then shift
      for c, (s_T, t_T) in enumerate(zip(np.split(src, n_chunks), np.split(tgt, n_chunks))):
        np.testing.assert_array_equal(seg[c]["inputs"][r], s_T)
        np.testing.assert_array_equal(seg[c]["targets"][r], t_T)
        assert seg[c]["reset"][r] == (c == 0)  # memory emptied at every example
      weights = np.concatenate([b["weights"][r] for b in seg])
      np.testing.assert_array_equal(weights, np.arange(15) >= 15 - s.answer_len)
  # Resumes exactly; rows of one process are those rows of the global batch.
  state = it.get_state()
  again = example_corpus.ExampleIterator(corpus, "train", B, T, row_ids=[1, 3])
  again.set_state(json.loads(json.dumps(state)))
  for _ in range(5):
    want, got = next(it), next(again)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key][[1, 3]])
  with pytest.raises(ValueError, match="num_examples"):
    other = synthetic.load(small("copy", train_size=200))
    example_corpus.ExampleIterator(other, "train", B, T).set_state(state)


def test_one_evaluation_pass_scores_every_answer_token_once():
  s = small("reverse")  # example length 10, answer 5; 40 valid examples in rows of 3
  corpus = synthetic.load(s)
  it = example_corpus.ExampleEvalIterator(corpus, "valid", 3, 5, corpus.boundary_id)
  assert len(it) == math.ceil(40 / 3) * 2
  seen = []
  for step, batch in enumerate(it):
    p = it.pairs(step)
    np.testing.assert_array_equal(batch["weights"] > 0, p >= 0)
    np.testing.assert_array_equal(batch["reset"], np.full(3, step % 2 == 0))
    tokens = corpus.splits["valid"].read(0, corpus.splits["valid"].num_tokens)
    np.testing.assert_array_equal(batch["targets"][p >= 0], tokens[p[p >= 0]])
    seen += list(p[p >= 0])
  answers = [
      k * s.sequence_len + j
      for k in range(40)
      for j in range(s.sequence_len - s.answer_len, s.sequence_len)
  ]
  assert sorted(seen) == answers  # each answer token once, nothing else


def test_answer_accuracies_equal_a_naive_count_on_a_hand_made_case():
  # Answers of 3 tokens; example 1 has one wrong token; example 2 is cut off
  # after 2 of its 3 answer tokens (max_steps); -1: not an answer position.
  example = np.array([[0, 0, 0, -1, 1, 1], [1, -1, -1, 2, 2, -1]])
  correct = np.array([[1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 1, 1]], bool)
  got = example_corpus.answer_scores(example, correct, np.full(8, 3))
  # Naive: example 0 right, example 1 wrong (one token), example 2 not whole.
  assert got["examples"] == 2 and got["answer_accuracy"] == 0.5
  assert got["answer_token_accuracy"] == 7 / 8  # the wrong token of example 1
  assert math.isnan(
      example_corpus.answer_scores(example[:, :0], correct[:, :0], np.full(8, 3))["answer_accuracy"]
  )


def tiny_config(cutoffs=()):
  config = default_config.get_config()
  config.data.dataset = "synthetic:copy"
  config.data.update(
      synthetic_seq_len=3,
      synthetic_num_tokens=8,
      synthetic_train_size=100,
      synthetic_valid_size=20,
      synthetic_test_size=20,
  )
  config.model.update(
      n_layer=2,
      d_model=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=3,
      mem_len=3,
      cutoffs=cutoffs,
      div_val=1,
      init_std=0.3,  # larger than the reference's, so the predictions differ
  )
  config.eval.update(tgt_len=3, mem_len=3, same_length=False, global_batch=3)
  config.train.global_batch = 8
  return config


@pytest.mark.parametrize(
    "cutoffs",
    [(), pytest.param((3,), marks=pytest.mark.slow)],  # ~20-30 s each on 2 busy cores
    ids=["softmax", "adaptive"],
)
def test_evaluation_accuracy_equals_a_naive_prediction_of_each_example(cutoffs):
  config = tiny_config(cutoffs)
  default_config.validate(config, jax.device_count(), training=False)
  corpus = data.load_configured(config.data.to_dict())
  s = corpus.settings  # 3 symbols of 6, answers of 6; 20 valid examples
  mcfg = default_config.model_config(config, corpus.vocab_size)
  model = models.TransformerXL(mcfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  if cutoffs:  # the tail cluster likelier, so that argmaxes lie in it (ids >= 3)
    params["crit"]["cluster_bias"] = params["crit"]["cluster_bias"] + 3.0
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)  # 8 rows: 3 + padding
  got = evaluate.Evaluator(config, mcfg, corpus, mesh).evaluate(params, "valid")
  # Naive: every example a row of its own, segment by segment from an empty
  # memory; the argmax of the full distribution (model.__call__ without targets).
  seqs = corpus.examples["valid"]
  step = jax.jit(lambda x, memory: model.apply({"params": params}, x, memory))
  memory, logp = memory_lib.init_memory(mcfg, len(seqs)), []
  for a in range(0, s.example_len, 3):
    logp_NxTxV, memory = step(seqs[:, a : a + 3], memory)
    logp.append(np.asarray(logp_NxTxV, np.float64))
  logp_NxAxV = np.concatenate(logp, axis=1)[:, -s.answer_len :]
  targets_NxA = seqs[:, 1:][:, -s.answer_len :]
  nll = -np.take_along_axis(logp_NxAxV, targets_NxA[..., None], -1)
  right = logp_NxAxV.argmax(-1) == targets_NxA
  if cutoffs:  # some right predictions lie in the adaptive softmax's tail cluster
    assert np.any(right & (targets_NxA >= 3)) and np.any(logp_NxAxV.argmax(-1) < 3)
  assert 0 < np.mean(right) < 1  # some right, some wrong: the comparison means something
  whole = right.all(axis=1)
  # The step's NLL equals the model's own NLL path (crit.nll, no [B, T, V] array).
  batch = {"inputs": seqs[:, :3], "targets": seqs[:, 1:4], "reset": np.ones(len(seqs), bool)}
  memory = memory_lib.init_memory(mcfg, len(seqs))
  plain, _ = jax.jit(lambda m, b: eval_steps.segment_nll(model, params, m, b))(memory, batch)
  nll_c, correct_c, _ = jax.jit(lambda m, b: eval_steps.segment_nll_correct(model, params, m, b))(
      memory, batch
  )
  np.testing.assert_allclose(nll_c, plain, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(correct_c, logp[0][:, :3].argmax(-1) == seqs[:, 1:4])
  assert got["tokens"] == 20 * s.answer_len and got["examples"] == 20
  assert got["answer_token_accuracy"] == np.mean(right)
  assert got["answer_accuracy"] == np.mean(whole)
  np.testing.assert_allclose(got["loss_nats"], np.mean(nll), rtol=1e-5)


def test_a_validation_that_scores_no_answer_token_reports_no_loss(tmp_path, reports):
  """A validation cut to its first segment (``train.eval_max_steps=1``) sees
  only inputs of the copy task, no answer token: its loss and ppl are null in
  metrics.jsonl (not 0 and 1, a perfect model), and the log says why."""
  config = tiny_config()
  config.train.update(num_steps=1, log_every=1, eval_every=1, eval_max_steps=1)
  config.checkpoint.every_steps = 1
  default_config.validate(config, 1)
  corpus = data.load_configured(config.data.to_dict())
  mesh = sharding.make_mesh((1, 1), config.mesh.axis_names, devices=jax.devices()[:1])
  train.train_and_evaluate(config, str(tmp_path), corpus, mesh)
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  (valid,) = [r for r in rows if "valid/tokens" in r]
  assert valid["valid/tokens"] == 0
  assert valid["valid/loss_nats"] is None and valid["valid/ppl"] is None
  (line,) = [l for l in reports.lines if "scored no token" in l]
  assert "train.eval_max_steps=1" in line and "loss and ppl null" in line


@pytest.mark.parametrize(
    "flags, flag, instead",
    [
        (["--mode=generate", "--prompt=abc"], "--prompt", "--mode=score --tokens=FILE.npy"),
        (["--mode=score", "--text={text}", "--out={out}"], "--text", "--tokens=FILE.npy"),
        (
            [
                "--mode=score",
                "--tokens={tokens}",
                "--out={out}",
                "--dynamic_stats={text}",
                "--config.eval.dynamic.lr=0.01",
            ],
            "--dynamic_stats",
            "--dynamic_stats=FILE.npy",
        ),
    ],
    ids=["generate", "score", "dynamic_stats"],
)
def test_text_input_for_a_synthetic_task_is_one_error_line(flags, flag, instead, tmp_path):
  """A synthetic task's corpus has no tokenizer: text given to a mode of its
  workdir (a copy-task workdir of tests/fixtures) is refused in one line that
  says what to give instead, before any checkpoint is read (was a ValueError
  traceback)."""
  workdir = tmp_path / "w"
  shutil.copytree(REPO / "tests" / "fixtures" / "legacy_workdirs" / "tokens", workdir)
  (tmp_path / "t.txt").write_text("a b c\n")
  np.save(tmp_path / "tokens.npy", np.full((1, 9), 3, np.int32))
  paths = dict(text=tmp_path / "t.txt", out=tmp_path / "o.npy", tokens=tmp_path / "tokens.npy")
  r = run_main([f"--workdir={workdir}", *(f.format(**paths) for f in flags)], devices=1)
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  line = r.stderr.strip().splitlines()[-1]
  assert line.startswith(f"error: {flag} gives text, but corpus synthetic:copy has no tokenizer")
  assert instead in line and not (tmp_path / "o.npy").exists(), line


MEMORIES = {  # model changes: each memory of the study
    "xl": {},
    "tokens": {"mem_len": 0, "tokens": {"num_mem_tokens": 2, "mem_at_end": True}},
    "compressive": {
        "memory": "compressive",
        "compressive": {"cmem_len": 2, "cmem_ratio": 3, "cmem_fn": "conv"},
    },
}


# Every memory in the fast tier (~15 s each): a mutant of the answer segment's
# decoding was caught by the compressive memory's case alone.
@pytest.mark.parametrize("memory", ["xl", "tokens", "compressive"])
def test_greedy_decoding_equals_decoding_each_answer_token_from_scratch(memory):
  config = tiny_config()
  config.model.update(MEMORIES[memory])
  config.eval.update(mem_len=config.model.mem_len)
  default_config.validate(config, jax.device_count(), training=False)
  corpus = data.load_configured(config.data.to_dict())
  s = corpus.settings  # copy of 3 symbols: [X, 1, X, X], answers of 6 over 2 segments of 3
  mcfg = default_config.model_config(config, corpus.vocab_size)
  model = models.TransformerXL(mcfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)  # 8 rows: 3 + padding
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh)
  seqs = corpus.examples["valid"]
  got = evaluator.decode_answers(params, seqs)
  # Naive: for each answer position j, the whole example from an empty memory, segment
  # by segment, with the model's own tokens as the inputs after the question.
  step = jax.jit(lambda x, memory: model.apply({"params": params}, x, memory))
  e, a = s.example_len, s.answer_len
  x_NxE, want = seqs[:, :-1].copy(), np.zeros((len(seqs), a), np.int32)
  for j in range(e - a, e):
    memory, logp = memory_lib.init_memory(mcfg, len(seqs)), []
    for lo in range(0, e, 3):
      logp_NxTxV, memory = step(x_NxE[:, lo : lo + 3], memory)
      logp.append(np.asarray(logp_NxTxV))
    want[:, j - (e - a)] = np.concatenate(logp, axis=1)[:, j].argmax(-1)
    if j + 1 < e:
      x_NxE[:, j + 1] = want[:, j - (e - a)]
  np.testing.assert_array_equal(got, want)
  # It means something: the answers are partly wrong, and decoding differs from teacher forcing.
  truth = seqs[:, -a:]
  assert 0 < np.mean(got == truth) < 1
  forced = evaluator.evaluate(params, "valid")
  res = evaluator.greedy_answers(params, "valid")
  assert res["greedy_token_accuracy"] == np.mean(got == truth) != forced["answer_token_accuracy"]
  assert res["greedy_accuracy"] == forced["answer_accuracy"]  # a whole answer: the same
  assert res["greedy_examples"] == len(seqs) == 20


def test_bad_settings_are_refused_before_anything_is_compiled():
  def problems(**changes):
    config = tiny_config()
    for key, value in changes.items():
      section, name = key.split("__")
      config[section][name] = value
    try:
      default_config.validate(config, jax.device_count())
    except default_config.ConfigError as err:
      return str(err)
    return ""

  assert problems() == ""
  assert "model.tgt_len=4 does not divide the synthetic:copy example length 9" in problems(
      model__tgt_len=4
  )
  assert "set --config.eval.tgt_len to one of [1, 3, 9]" in problems(eval__tgt_len=2)
  assert "eval.method='sliding' does not score" in problems(eval__method="sliding")
  assert "data.synthetic_num_pairs applies only to synthetic:associative_retrieval" in problems(
      data__synthetic_num_pairs=5
  )
  assert "use one of 'synthetic:copy'" in problems(data__dataset="synthetic:sort")
  assert "apply only to the synthetic tasks" in problems(data__dataset="ptb")


def test_a_segment_length_that_cuts_examples_is_one_error_line(tmp_path):
  r = run_main(
      [
          f"--config={REPO / 'configs' / 'copy_rmt.py'}:xl",
          f"--workdir={tmp_path / 'w'}",
          "--config.model.tgt_len=10",
      ]
  )
  # validate's usual block: "error: Invalid config:", then this one problem on one line.
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr[r.stderr.index("error:") :].strip().splitlines()
  assert lines[0] == "error: Invalid config:" and len(lines) == 2, lines
  assert "model.tgt_len=10 does not divide the synthetic:copy example length 72" in lines[1]
  assert "to one of [1, 2, 3, 4, 6, 8, 9, 12, 18, 24, 36, 72]" in lines[1]
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_short_copy_is_learned_and_eval_results_carry_the_accuracy(tmp_path):
  config = tiny_config()
  config.data.update(
      synthetic_seq_len=5,
      synthetic_num_tokens=7,
      synthetic_train_size=2000,
      synthetic_valid_size=100,
      synthetic_test_size=100,
  )
  config.model.update(
      d_model=64, n_head=4, d_head=16, d_inner=128, tgt_len=15, mem_len=0, init_std=0.02
  )
  config.train.update(
      global_batch=32,
      num_steps=300,
      learning_rate=1e-3,
      min_lr=1e-4,
      warmup_steps=50,
      log_every=100,
      eval_every=300,
      seed=0,
  )
  config.eval.update(tgt_len=15, mem_len=0, global_batch=32)
  config.checkpoint.every_steps = 300
  # One device (8 simulated ones on 2 busy cores can miss XLA's collective timeout).
  default_config.validate(config, 1)
  corpus = data.load_configured(config.data.to_dict())
  mesh = sharding.make_mesh((1, 1), config.mesh.axis_names, devices=jax.devices()[:1])
  workdir = tmp_path / "copy"
  train.train_and_evaluate(config, str(workdir), corpus, mesh)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  valid = [r for r in rows if "valid/answer_accuracy" in r]  # the validation at step 300
  assert [r["step"] for r in valid] == [300] and "valid/answer_token_accuracy" in valid[0]
  r = run_main([f"--workdir={workdir}", "--mode=eval"], devices=1)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "test: loss" in r.stdout and ", greedy_accuracy " in r.stdout, r.stdout[-2000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  for split in ("valid", "test"):
    res = results[split]
    assert res["examples"] == 100 and res["tokens"] == 100 * 10  # answers: 10 tokens each
    assert res["answer_accuracy"] >= 0.9 and res["answer_token_accuracy"] >= 0.98, res
    # Greedy decoding (the paper's copy accuracy): a whole answer right either way.
    assert res["greedy_examples"] == 100 and res["greedy_accuracy"] == res["answer_accuracy"]
    assert res["greedy_token_accuracy"] >= 0.9, res
