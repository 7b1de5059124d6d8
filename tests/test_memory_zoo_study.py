"""scripts/memory_zoo.py --quick: the five memories (and no memory) at equal
budget, end to end on BABILong qa1 with bAbI-format stand-in files and the
test's own background text (one distance, one seed, 3 batches): every run
trains, is scored by --mode=eval and lands in results.json and REPORT.md;
--report_only rewrites the same report; a rerun reuses every finished run.
Its numbers mean nothing."""

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import run_python

SCRIPT = "scripts/memory_zoo.py"
REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "babilong"
MEMORIES = ("xl", "compressive", "tokens", "knn", "armt", "none")


def _script():
  """scripts/memory_zoo.py as a module (no subprocess)."""
  spec = importlib.util.spec_from_file_location("memory_zoo_study", REPO / SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(*args, timeout=600):
  return run_python([SCRIPT, *args], devices=1, timeout=timeout)


def _noise(tmp_path) -> list[str]:
  """--noise_* flags: the BABILong fixtures' background documents as files."""
  docs = json.loads((FIX / "noise_train.json").read_text())
  docs += json.loads((FIX / "noise_test.json").read_text())
  folder = tmp_path / "noise"
  folder.mkdir()
  for i, d in enumerate(docs):
    (folder / f"n{i:02d}.txt").write_text(d)
  return [
      f"--noise_train={folder}/n0[0-5].txt",
      f"--noise_valid={folder}/n0[67].txt",
      f"--noise_test={folder}/n0[89].txt,{folder}/n1*.txt",
  ]


@pytest.mark.slow  # 12 subprocesses, two at a time: about 60 s on 2 shared cores
def test_quick_study_runs_every_memory_at_equal_budget_and_reuses_runs(tmp_path):
  out, wd = tmp_path / "out", tmp_path / "workdirs"
  args = ["--quick", "--jobs=2", f"--out={out}", f"--workdirs={wd}", *_noise(tmp_path)]
  r = _run(*args)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  runs = res["runs"]
  assert list(runs) == [f"qa1_last_{m}_s1" for m in MEMORIES]
  assert not res["failed"]
  budget = res["budget"]
  xl_bytes = budget["xl_bytes"]
  assert xl_bytes == 2 * 4 * 64 * 4  # L M D float32: XL's cache
  for name, run in runs.items():
    memory = run["memory"]
    acc = run["evals"]["last"]["test"]
    assert 0 < acc["examples"] <= 8, name  # the stand-in test file: 8 stories
    for key in ("babilong_accuracy", "greedy_accuracy", "answer_accuracy"):
      assert 0.0 <= acc[key] <= 1.0, (name, key)
    config = json.loads((wd / name / "config.json").read_text())
    assert config["data"]["dataset"] == "babilong:qa1"
    assert config["data"]["babilong_task_start_pct"] == 0.75  # distance "last"
    assert config["model"]["memory"] == {"tokens": "xl", "none": "xl"}.get(memory, memory)
    # Equal optimizer steps: every memory a step per batch of whole examples (4 segments).
    assert config["train"]["mem_backprop_depth"] == 3 and config["train"]["bptt_bp"]
    assert run["num_steps"] == 3  # the same 3 batches of examples, as many steps
    assert run["n_params"] > 0
    if memory == "none":
      continue
    # Every memory at XL's budget (within budget's tolerance), and the arrays the training
    # run holds (its log's checkpoint line, 4 significant digits) say the same bytes.
    planned = budget["bytes"][memory]
    assert abs(planned - xl_bytes) <= budget["tolerance"][memory], memory
    assert run["state_bytes_per_row_from_log"] == pytest.approx(planned + 4, rel=2e-3), memory
  params = {r["memory"]: r["n_params"] for r in runs.values()}
  for memory in ("compressive", "tokens", "knn"):  # ARMT's W_v alone is D^2 per layer
    assert abs(params[memory] / params["xl"] - 1) < 0.01, memory
  report = (out / "REPORT.md").read_text()
  assert "--quick run: the numbers mean nothing" in report
  assert "stand-in files" in report
  for name in runs:
    assert f"| {name} |" in report
  for memory in MEMORIES:
    assert f"\n| {memory} | " in report  # the budget table and the task's table
  # --report_only rewrites the same report from results.json.
  (out / "REPORT.md").unlink()
  assert _run("--report_only", f"--out={out}").returncode == 0
  assert (out / "REPORT.md").read_text() == report
  # A rerun trains and evaluates nothing: every run reused, its files untouched.
  stamps = {p: p.stat().st_mtime_ns for p in wd.glob("qa1_*/zoo_*.json")}
  stamps.update({p: p.stat().st_mtime_ns for p in wd.glob("qa1_*/eval_results.json")})
  assert len(stamps) == 3 * len(MEMORIES)
  r = _run(*args)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  again = json.loads((out / "results.json").read_text())["runs"]
  assert list(again) == list(runs)
  assert all(run["reused"] for run in again.values())
  assert not any(run["reused"] for run in runs.values())
  assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
  assert [r["evals"] for r in again.values()] == [r["evals"] for r in runs.values()]


def test_runs_are_configured_as_documented():
  z = _script()
  b = z.sizes(4)
  # The memories' sizes come from the benchmark's budget: N = L M tokens, S entries at one
  # layer holding L M D floats of keys and values, ARMT's smallest d_mem.
  assert (b["num_mem_tokens"], b["memory_size"], b["d_mem"], b["d_key"]) == (8, 4, 1, 6)
  flags = z.train_flags("passkey", "mixed", "armt", 2, 10, 4)
  for f in (
      "--config.model.memory=armt",
      "--config.model.tgt_len=32",
      "--config.model.mem_len=0",
      "--config.train.mem_backprop_depth=3",  # through the 4 segments of an example
      "--config.train.bptt_bp=True",
      "--config.train.num_steps=10",
      "--config.train.seed=2",
  ):
    assert f in flags, f
  knn = z.train_flags("copy", "two", "knn", 1, 10, 4)
  assert "--config.model.knn.memory_size=4" in knn
  # Equal optimizer steps: every memory a step per batch of examples (copy at tgt_len 4:
  # 6 segments per example), unless --steps=segment (the earlier studies').
  assert "--config.train.num_steps=10" in knn
  assert "--config.train.mem_backprop_depth=5" in knn and "--config.train.bptt_bp=True" in knn
  knn = z.train_flags("copy", "two", "knn", 1, 10, 4, per_example=False)
  assert "--config.train.num_steps=60" in knn
  assert not any("mem_backprop_depth" in f for f in knn)
  assert "--config.model.mem_len=2" in z.train_flags("retrieval", "pair", "compressive", 1, 1, 4)
  # An example of one segment (retrieval "whole"): no earlier segment to train through.
  whole = z.train_flags("retrieval", "whole", "armt", 1, 10, 4)
  assert "--config.train.mem_backprop_depth=0" in whole
  assert "--config.train.bptt_bp=False" in whole  # configs/copy_rmt.py:rmt's True, undone
  assert "--config.train.num_steps=10" in whole
  assert z.eval_flags("passkey", "two_back") == ["--config.data.synthetic_passkey_depth=0"]
  # Every task's first seed before any second; no memory at the first seed only.
  specs = z.plan(["copy", "passkey"], ["xl", "none"], [1, 2], quick=False, batches=0)
  names = [z.run_name(s["task"], s["key"], s["memory"], s["seed"]) for s in specs]
  assert names == [
      "copy_one_xl_s1",
      "copy_one_none_s1",
      "copy_two_xl_s1",
      "copy_two_none_s1",
      "passkey_mixed_xl_s1",
      "passkey_mixed_none_s1",
      "copy_one_xl_s2",
      "copy_two_xl_s2",
      "passkey_mixed_xl_s2",
  ]
  assert specs[4]["distances"] == ["same", "one_back", "two_back"]


def test_babilong_without_noise_is_one_error_line(tmp_path):
  r = _run("--tasks=qa2", f"--out={tmp_path / 'out'}", f"--workdirs={tmp_path}", timeout=120)
  assert r.returncode == 1
  assert r.stderr.strip().splitlines()[-1].startswith("error: BABILong needs background text")
  assert not (tmp_path / "out" / "results.json").exists()
