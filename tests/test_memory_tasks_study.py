"""scripts/memory_tasks.py --quick: the memory study end to end on copy at
distance two (every memory, one seed, 3 batches of examples): every run
trains with its memory and the same examples, is scored by --mode=eval, and
lands in results.json and REPORT.md; its numbers mean nothing."""

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import run_python

SCRIPT = "scripts/memory_tasks.py"
REPO = Path(__file__).resolve().parents[1]


def _script():
  """scripts/memory_tasks.py as a module (no subprocess)."""
  spec = importlib.util.spec_from_file_location("memory_tasks_study", REPO / SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


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
  # Equal optimizer steps (--steps=example): every memory one step per batch of whole examples.
  want = {  # memory -> (mem_len, cmem_len, num_mem_tokens, mem_backprop_depth, steps)
      "xl": (4, 0, 0, 5, 3),
      "tokens": (0, 0, 4, 5, 3),
      "compressive": (2, 2, 0, 5, 3),
      "none": (0, 0, 0, 5, 3),
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
    assert config["train"]["bptt_bp"] is True
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
      "error: --memories='xl,lstm': choose from ['xl', 'tokens', 'compressive', 'none', 'armt']."
  ]
  assert not (tmp_path / "results.json").exists()


def test_armt_and_retrieval_runs_are_configured_as_documented():
  mt = _script()
  # Associative retrieval of K = 4: 10 positions, one pair per segment, the query alone last.
  assert (mt.example_len("retrieval_k4"), mt.segments("retrieval_k4", "pair")) == (10, 5)
  flags = mt.run_flags("retrieval_k4", "pair", "armt", 1, 7)
  for f in (
      "--config.data.dataset=synthetic:associative_retrieval",
      "--config.model.memory=armt",
      "--config.model.armt.num_mem_tokens=4",
      "--config.model.armt.d_mem=1",
      "--config.model.tgt_len=2",
      "--config.model.mem_len=0",
      "--config.eval.mem_len=0",
      "--config.train.mem_backprop_depth=4",  # through the whole example
      "--config.train.bptt_bp=True",
      "--config.train.num_steps=7",  # one step per batch of whole examples
  ):
    assert f in flags, f
  # Equal optimizer steps: the XL cache too a step per batch of whole examples, unless
  # per_example=False (--steps=segment, the earlier studies': a step per segment).
  xl = mt.run_flags("retrieval_k4", "pair", "xl", 1, 7)
  assert "--config.train.num_steps=7" in xl and "--config.train.mem_backprop_depth=4" in xl
  assert "--config.train.num_steps=35" in mt.run_flags("retrieval_k4", "pair", "xl", 1, 7, False)
  data = mt.data_flags("retrieval_k4", quick=False)
  assert "--config.data.synthetic_num_pairs=4" in data
  assert not any("seq_len" in f or "num_tokens" in f for f in data)  # copy's keys refused there
  # State per layer: ARMT's d_key x d_model + d_key (d_key = 6 d_mem), the others' M x d_model.
  assert (mt.state_floats("armt"), mt.state_floats("xl"), mt.state_floats("none")) == (390, 256, 0)
  assert mt.run_name("retrieval_k8", "two", "tokens", 2) == "retrieval_k8_pair_tokens_s2"


def test_an_odd_memory_size_is_refused(tmp_path, capsys):
  assert _script().main(["--mem=3", f"--out={tmp_path}"]) == 1
  assert "--mem=3: an even number >= 2" in capsys.readouterr().err
  assert not (tmp_path / "results.json").exists()


@pytest.mark.slow  # 4 subprocesses: about 4 min on 2 shared cores
def test_quick_study_runs_armt_and_associative_retrieval(tmp_path):
  out = tmp_path / "out"
  r = _run(
      "--quick",
      "--tasks=associative_retrieval",
      "--pairs=2",
      "--memories=armt,xl",
      f"--out={out}",
      f"--workdirs={tmp_path / 'workdirs'}",
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  runs = json.loads((out / "results.json").read_text())["runs"]
  assert list(runs) == ["retrieval_k2_pair_armt_s1", "retrieval_k2_pair_xl_s1"]
  for name, run in runs.items():
    config = json.loads((tmp_path / "workdirs" / name / "config.json").read_text())
    assert config["data"]["dataset"] == "synthetic:associative_retrieval"
    assert config["data"]["synthetic_num_pairs"] == 2
    assert (run["tgt_len"], run["segments"], run["pairs"]) == (2, 3, 2)
    assert config["model"]["memory"] == run["memory"]
    assert run["test"]["examples"] == 16
  armt = runs["retrieval_k2_pair_armt_s1"]
  assert (armt["num_mem_tokens"], armt["d_mem"], armt["mem_len"]) == (4, 1, 0)
  assert (armt["mem_backprop_depth"], armt["num_steps"], armt["state_floats_per_layer"]) == (
      2,
      3,
      390,
  )
  report = (out / "REPORT.md").read_text()
  assert "*armt* 390 floats = 1,560 bytes" in report
  assert "| retrieval_k2_pair_armt_s1 |" in report
