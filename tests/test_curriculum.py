"""Curriculum training (training/curriculum.py) and early stopping
(training/early_stop.py) from the command line: stages advance on their
target or budget, each starts from the last one's parameters, a kill -9
mid-stage resumes exactly, and the console and metrics.jsonl name the stage."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from transformer_xl import default_config
from transformer_xl.run import train_checks
from transformer_xl.training import early_stop

from helpers import read_metrics, run_main, start_main

STAGES = (
    "data.synthetic_num_pairs=1 train.num_steps=4 train.stop_metric=loss_nats "
    "train.stop_target=100",  # any loss is below 100: stops at its first validation (step 2)
    "data.synthetic_num_pairs=2 train.num_steps=6",  # its whole budget
)
FLAGS = [
    "--config=configs/armt_retrieval.py:xl",  # the authors' recipe, made tiny
    "--config.train.stop_metric=",
    "--config.train.stop_target=0",
    "--config.train.stop_patience=0",
    "--config.train.vary_n_segments=False",  # a step per segment: the XL cache's own
    "--config.train.bptt_bp=False",
    "--config.train.mem_backprop_depth=0",
    "--config.data.synthetic_train_size=64",
    "--config.data.synthetic_valid_size=8",
    "--config.data.synthetic_test_size=8",
    "--config.model.n_layer=2",
    "--config.model.d_model=16",
    "--config.model.n_head=2",
    "--config.model.d_head=8",
    "--config.model.d_inner=32",
    "--config.model.tgt_len=4",
    "--config.model.mem_len=4",
    "--config.eval.tgt_len=4",
    "--config.eval.mem_len=4",
    "--config.eval.global_batch=4",
    "--config.train.global_batch=4",
    "--config.train.learning_rate=1e-3",
    "--config.train.warmup_steps=0",
    "--config.train.log_every=1",
    "--config.train.eval_every=2",
    "--config.checkpoint.every_steps=1",
    f"--config.train.curriculum={STAGES!r}",
]


def curriculum_run(workdir, *extra, **kwargs):
  return run_main(
      ["--mode=train", f"--workdir={workdir}", *FLAGS, *extra], devices=1, timeout=600, **kwargs
  )


def test_stages_advance_on_target_or_budget_each_from_the_last_and_name_themselves(tmp_path):
  w = tmp_path / "w"
  r = curriculum_run(w)
  assert r.returncode == 0, r.stderr[-3000:]
  s0, s1 = w / "stages" / "00", w / "stages" / "01"
  # Stage 1 stopped at its first validation (the target), stage 2 ran its budget.
  assert json.loads((s0 / early_stop.MARKER).read_text())["step"] == 2
  assert not (s1 / early_stop.MARKER).exists()
  done0, done1 = (json.loads((d / "stage_done.json").read_text()) for d in (s0, s1))
  assert done0["step"] == 2 and "train.stop_target=100" in done0["ended"]
  assert done1["step"] == 6 and done1["ended"] == "train.num_steps=6"
  assert sorted(read_metrics(s0)) == [1, 2] and sorted(read_metrics(s1)) == list(range(1, 7))
  # Every metrics row names its stage; the console lines too.
  for i, d in enumerate((s0, s1)):
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(row["curriculum/stage"] == i for row in rows)
  out = r.stdout + r.stderr
  assert "[stage 1/2 data.synthetic_num_pairs=1" in out and "Stopping early at step 2" in out
  assert "[stage 2/2 data.synthetic_num_pairs=2 train.num_steps=6] step 6:" in out
  # Stage 2 started from stage 1's parameters (a fresh optimizer), on its own data.
  assert f"Starting from {s0} (step 2)" in out and "the optimizer starts afresh" in out
  assert json.loads((s1 / "config.json").read_text())["data"]["synthetic_num_pairs"] == 2
  # The final model at every stage's length: 8 valid and 8 test examples each.
  results = json.loads((w / "eval_results.json").read_text())["stages"]
  assert [x["overrides"]["data.synthetic_num_pairs"] for x in results] == [1, 2]
  for x in results:
    assert x["valid"]["examples"] == x["test"]["examples"] == 8
    assert x["valid"]["tokens"] == 8 * 2  # the value and EOS of each example
    assert 0 <= x["valid"]["answer_accuracy"] <= 1
  assert results[1]["step"] == 6 and results[0]["ended"] == done0["ended"]
  # Evaluating the curriculum's workdir names the stages' workdirs instead.
  ev = run_main(["--mode=eval", f"--workdir={w}"], devices=1)
  assert ev.returncode == 1 and f"--workdir={w}/stages/NN" in ev.stderr, ev.stderr[-2000:]
  assert "Traceback" not in ev.stderr
  # The same command again: nothing to train, the stages are skipped.
  again = curriculum_run(w)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "done earlier: step 2" in again.stdout + again.stderr
  assert sorted(read_metrics(s1)) == list(range(1, 7))
  # Other stages in the same workdir: one error line, nothing trained.
  other = run_main(
      ["--mode=train", f"--workdir={w}", *FLAGS[:-1], f"--config.train.curriculum={STAGES[:1]!r}"],
      devices=1,
  )
  assert other.returncode == 1 and "differs from the curriculum" in other.stderr
  assert "Traceback" not in other.stderr


def _wait_for_checkpoint(path: Path, proc, step: int, timeout: float = 400) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if (path / "checkpoints" / str(step)).exists():
      return
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    time.sleep(0.2)
  raise AssertionError(f"no checkpoint {step} in {path}")


@pytest.mark.slow
def test_a_kill_9_in_the_middle_of_a_stage_resumes_exactly(tmp_path):
  whole, killed = tmp_path / "whole", tmp_path / "killed"
  r = curriculum_run(whole)
  assert r.returncode == 0, r.stderr[-3000:]
  proc = start_main(["--mode=train", f"--workdir={killed}", *FLAGS], devices=1)
  _wait_for_checkpoint(killed / "stages" / "01", proc, 3)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / "stages" / "01" / "stage_done.json").exists()
  r = curriculum_run(killed)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "done earlier: step 2" in r.stdout + r.stderr  # stage 1 not trained again
  for stage in ("00", "01"):
    a, b = read_metrics(whole / "stages" / stage), read_metrics(killed / "stages" / stage)
    assert sorted(a) == sorted(b)
    for step in a:
      assert a[step]["train/loss"] == b[step]["train/loss"], (stage, step)
  res = [json.loads((d / "eval_results.json").read_text())["stages"] for d in (whole, killed)]
  for x, y in zip(*res):
    assert x["valid"]["loss_nats"] == y["valid"]["loss_nats"]
    assert x["test"]["answer_accuracy"] == y["test"]["answer_accuracy"]


def test_bad_stages_and_stop_settings_are_one_error_line_before_any_training(tmp_path):
  cases = {
      '("data.synthetic_num_pairs=1", "model.d_model=32")': "differ",  # not a free field
      '("data.synthetic_num_pairs=1", "data.synthetic_num_pairs")': "is not KEY=VALUE",
      '("data.synthetic_nm_pairs=1",)': "data.synthetic_nm_pairs is not a config key",
      '("data.synthetic_num_pairs=17",)': "synthetic_num_pairs=17 must be in [1, 16]",
  }
  for value, message in cases.items():
    w = tmp_path / str(len(list(tmp_path.iterdir())))
    r = run_main(
        ["--mode=train", f"--workdir={w}", *FLAGS[:-1], f"--config.train.curriculum={value}"],
        devices=1,
    )
    assert r.returncode == 1 and message in r.stderr, (value, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and not (w / "stages").exists()
  config = default_config.get_config()
  problems = {
      "answer_accuracy": train_checks.stop_problems(
          {"stop_metric": "answer_accuracy", "stop_target": 0.9}, example_corpus=False
      ),
      "no target": train_checks.stop_problems({"stop_metric": "ppl"}, example_corpus=False),
      "no metric": train_checks.stop_problems({"stop_target": 0.9}, example_corpus=True),
      "accuracy > 1": train_checks.stop_problems(
          {"stop_metric": "answer_accuracy", "stop_target": 90}, example_corpus=True
      ),
  }
  assert "measured on tasks with answers" in problems["answer_accuracy"][0]
  assert "needs train.stop_target or train.stop_patience" in problems["no target"][0]
  assert "need train.stop_metric" in problems["no metric"][0]
  assert "use a value in [0, 1]" in problems["accuracy > 1"][0]
  assert not train_checks.stop_problems(config.train, example_corpus=False)


def test_early_stop_decides_on_target_and_patience_and_replays_the_same():
  stop = early_stop.EarlyStop("answer_accuracy", 0.9, 2)
  assert [stop.update(v) for v in (0.5, 0.6, 0.6)] == [None, None, None]
  assert "not improved" in stop.update(0.55)  # two validations without a new best
  loss = early_stop.EarlyStop("loss_nats", 1.0, 0)
  assert loss.update(1.5) is None and "reached" in loss.update(0.99)
  rows = [{"step": 2 * i, "valid/answer_accuracy": v} for i, v in enumerate((0.5, 0.6, 0.6), 1)]
  again = early_stop.EarlyStop("answer_accuracy", 0.9, 2)
  again.replay(rows + [{"step": 8, "valid/answer_accuracy": 0.1}], up_to_step=6)
  assert (again.best, again.since_best) == (0.6, 1)  # the row after the checkpoint ignored
  assert "not improved" in again.update(0.55)
  assert early_stop.EarlyStop("answer_accuracy", 0.9, 0).update(0.95).startswith("valid answer")


def test_init_from_reads_an_unset_d_embed_as_d_model():
  """A converted workdir saves d_embed None, a config writes 0: the same model
  (the trajectory test's memory-tokens workdir was refused before)."""
  from transformer_xl.model import models  # pylint: disable=import-outside-toplevel
  from transformer_xl.training import init_from  # pylint: disable=import-outside-toplevel

  base = dict(n_token=32, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)
  cfg = lambda d: models.ModelConfig.from_dict({**base, "d_embed": d})
  assert init_from.model_problems(cfg(None), cfg(0)) == []
  assert init_from.model_problems(cfg(None), cfg(16)) == []
  (problem,) = init_from.model_problems(cfg(None), cfg(8))
  assert "model.d_embed=8 differs from the train.init_from model's 16" in problem


def test_a_stop_metric_the_corpus_does_not_report_is_refused():
  assert early_stop.corpus_problem("bpc", "word", False).startswith(
      "train.stop_metric='bpc': this corpus's validation reports ppl"
  )
  assert "reports bpc" in early_stop.corpus_problem("ppl", "byte", False)
  assert "needs a task with answers" in early_stop.corpus_problem("answer_accuracy", "word", False)
  assert early_stop.corpus_problem("ppl", "word", False) is None
  assert early_stop.corpus_problem("answer_accuracy", "word", True) is None
  assert early_stop.corpus_problem("", "byte", False) is None
