"""scripts/memory_tasks.py --quick: the memory study end to end on copy at
distance two (every memory, one seed, 3 batches of examples): every run
trains with its memory and the same examples, is scored by --mode=eval, and
lands in results.json and REPORT.md; its numbers mean nothing."""

import json

import pytest

from helpers import run_python

SCRIPT = "scripts/memory_tasks.py"


def _run(*args, timeout=900):
  """scripts/memory_tasks.py ARGS, on one CPU device (and the processes it starts)."""
  return run_python([SCRIPT, *args], devices=1, timeout=timeout)


@pytest.mark.slow  # 8 subprocesses (train and eval of 4 memories): 82-220 s on 2 shared cores
def test_quick_study_runs_every_memory_at_equal_size_and_examples(tmp_path):
  out = tmp_path / "out"
  r = _run("--quick", f"--out={out}", f"--workdirs={tmp_path / 'workdirs'}")
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  runs = res["runs"]
  assert list(runs) == [f"copy_two_{m}_s1" for m in ("xl", "tokens", "compressive", "none")]
  # Copy of S = 8 at tgt_len 4: 24 positions, 6 segments; memory of 4 vectors each.
  want = {  # memory -> (mem_len, cmem_len, num_mem_tokens, mem_backprop_depth, steps)
      "xl": (4, 0, 0, 0, 3 * 6),
      "tokens": (0, 0, 4, 5, 3),  # one step per batch of whole examples
      "compressive": (2, 2, 0, 0, 3 * 6),
      "none": (0, 0, 0, 0, 3 * 6),
  }
  for name, run in runs.items():
    assert (run["tgt_len"], run["segments"]) == (4, 6), name
    got = (
        run["mem_len"],
        run["cmem_len"],
        run["num_mem_tokens"],
        run["mem_backprop_depth"],
        run["num_steps"],
    )
    assert got == want[run["memory"]], name
    # The workdir's own config says the same (what was trained, not what was asked).
    config = json.loads((tmp_path / "workdirs" / name / "config.json").read_text())
    assert config["model"]["mem_len"] == run["mem_len"]
    assert config["eval"]["mem_len"] == run["mem_len"]  # evaluated as trained
    assert config["eval"]["tgt_len"] == 4
    assert config["model"]["memory"] == ("compressive" if run["memory"] == "compressive" else "xl")
    assert config["data"]["dataset"] == "synthetic:copy"
    assert config["train"]["bptt_bp"] is (run["memory"] == "tokens")
    # --mode=eval scored every test example once.
    for split, n in (("test", 16), ("valid", 16)):
      acc = run[split]
      assert acc["examples"] == n, (name, split)
      assert 0 <= acc["answer_accuracy"] <= acc["answer_token_accuracy"] <= 1, (name, split)
      assert 0 <= acc["greedy_token_accuracy"] <= 1, (name, split)  # the paper's measure
    assert run["train_command"].startswith("python -m transformer_xl.main --config=configs/")
    assert run["eval_command"] == run["train_command"] + " --mode=eval"
  report = (out / "REPORT.md").read_text()
  assert "--quick run: the numbers mean nothing" in report
  assert "| exact acc | greedy acc |" in report
  for name in runs:
    assert f"| {name} |" in report
  assert "| copy | 6 (12) | 6 | 0.657, 0.298, 0.355, 0.856 | 1, 1, 1, 1 |" in report
  # --report_only rewrites the same report from results.json.
  (out / "REPORT.md").unlink()
  assert _run("--report_only", f"--out={out}").returncode == 0
  assert (out / "REPORT.md").read_text() == report


def test_an_unknown_memory_is_one_error_line(tmp_path):
  r = _run("--memories=xl,lstm", f"--out={tmp_path}", timeout=120)
  assert r.returncode == 1
  assert r.stderr.strip().splitlines() == [
      "error: --memories='xl,lstm': choose from ['xl', 'tokens', 'compressive', 'none']."
  ]
  assert not (tmp_path / "results.json").exists()
