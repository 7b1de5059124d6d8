"""scripts/memory_curriculum.py: the curriculum study's bookkeeping (capacity,
per-stage history and compute) and, slow, its --quick run end to end."""

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import run_python

SCRIPT = "scripts/memory_curriculum.py"
REPO = Path(__file__).resolve().parents[1]


def _script():
  spec = importlib.util.spec_from_file_location("memory_curriculum_study", REPO / SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_solved_counts_pairs_up_to_the_first_stage_below_target():
  m = _script()

  def stages(*best):
    return [{"pairs": p, "best_valid_answer_accuracy": b} for p, b in zip((1, 2, 3, 5, 10), best)]

  assert m.solved(stages(0.95, 0.9, 0.5, 0.99, 0.2)) == 2  # 5 pairs after a failed 3: not solved
  assert m.solved(stages(0.95, 0.91, 0.93, 0.9, 0.97)) == 10
  assert m.solved(stages(0.89, 0.95)) == 0
  assert m.solved(stages(None, 0.95)) == 0  # a stage without a validation


def test_stage_history_reads_validations_and_compute(tmp_path):
  m = _script()
  rows = [
      {"step": 50, "curriculum/stage": 2, "train/loss": 1.0},
      {"step": 50, "curriculum/stage": 2, "valid/answer_accuracy": 0.4},
      {"step": 100, "curriculum/stage": 2, "valid/answer_accuracy": 0.93},
      {"step": 150, "curriculum/stage": 2, "valid/answer_accuracy": 0.91},
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  done = {"step": 150, "ended": "early", "rows_seen": 9600, "train_seconds_this_run": 12.5}
  (tmp_path / "stage_done.json").write_text(json.dumps(done))
  h = m.stage_history(tmp_path)
  assert h["valid_answer_accuracy"] == [[50, 0.4], [100, 0.93], [150, 0.91]]
  assert (h["best_valid_answer_accuracy"], h["best_at_step"]) == (0.93, 100)
  assert (h["steps"], h["examples_seen"], h["train_seconds"]) == (150, 9600, 12.5)


def test_every_run_is_the_recipe_with_the_studys_curriculum():
  m = _script()
  for variant in m.STATE:
    flags = m.run_flags(variant, 2, quick=False)
    assert flags[0] == f"--config=configs/armt_retrieval.py:{variant}"
    assert "--config.train.seed=2" in flags
    (curriculum,) = [f for f in flags if f.startswith("--config.train.curriculum=")]
    stages = eval(curriculum.split("=", 1)[1])  # noqa: S307 (our own repr)
    assert [s.split()[0] for s in stages] == [f"data.synthetic_num_pairs={p}" for p, _ in m.STAGES]
    # Whole examples per step at every stage, for every memory (equal optimizer steps).
    for s, (p, n) in zip(stages, m.STAGES):
      assert f"train.mem_backprop_depth={p}" in s and f"train.num_steps={n}" in s


@pytest.mark.slow  # 2 curricula of 2 stages (compiles per window length): ~2-4 min on 2 cores
def test_quick_study_trains_curricula_and_reports_each_stage(tmp_path):
  out, work = tmp_path / "out", tmp_path / "w"
  r = run_python(
      [SCRIPT, "--quick", f"--out={out}", f"--workdirs={work}", "--runs=armt:1,none:1"],
      devices=1,
      timeout=900,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  assert [r["name"] for r in res["runs"]] == ["armt_s1", "none_s1"]
  for run in res["runs"]:
    assert [s["pairs"] for s in run["stages"]] == [1, 2]
    for s in run["stages"]:
      assert (s["steps"], s["examples_seen"]) == (4, 32)  # 4 steps of 8 whole examples
      assert [v[0] for v in s["valid_answer_accuracy"]] == [2, 4]
      assert 0 <= s["final_model_test_answer_accuracy"] <= 1
    # The stages chained: stage 2 started from stage 1's checkpoint.
    cfg = json.loads((work / run["name"] / "stages/01/config.json").read_text())
    assert cfg["train"]["init_from"].endswith(f"{run['name']}/stages/00")
  text = (out / "REPORT.md").read_text()
  assert "| armt_s1 |" in text and "| none_s1 |" in text
  # A second invocation naming one run keeps the other's numbers (reused, not retrained).
  r = run_python(
      [SCRIPT, "--quick", f"--out={out}", f"--workdirs={work}", "--runs=none:1"],
      devices=1,
      timeout=900,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  again = json.loads((out / "results.json").read_text())
  assert [r["name"] for r in again["runs"]] == ["armt_s1", "none_s1"]
  assert again["runs"][1]["stages"][0]["steps"] == 4
