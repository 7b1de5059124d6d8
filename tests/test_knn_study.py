"""scripts/knn_memory.py --quick: the kNN memory study end to end (a tiny
model, 3 steps, stores of 16 and 32 entries) on a tiny WikiText-format
sample and on the passkey task: every run trains (the fine-tunes from the
base's parameters), is scored by --mode=eval (the kNN models also without
their store and with a larger one), and lands in results.json and REPORT.md;
a second run reuses every result.  Its numbers mean nothing."""

import json
import math

import pytest

from data_samples import _WIKI, _wiki_zip
from helpers import run_python

SCRIPT = "scripts/knn_memory.py"
_TEXTS = {"train": _WIKI["train"] * 4, "valid": _WIKI["valid"] * 3, "test": _WIKI["test"] * 3}


def _run(*args, timeout=1200):
  """scripts/knn_memory.py ARGS, on one CPU device (and the processes it starts)."""
  return run_python([SCRIPT, *args], devices=1, timeout=timeout)


def _finite_ppl(x) -> bool:
  return isinstance(x, float) and math.isfinite(x) and x > 1


@pytest.mark.slow  # ~25 subprocesses (4 + 2 trainings, their evaluations): 3-6 min on 2 shared cores
def test_quick_study_trains_fine_tunes_and_evaluates_every_run(tmp_path):
  _wiki_zip(tmp_path / "manual", "wikitext-2", _TEXTS)
  out, workdirs = tmp_path / "out", (tmp_path / "workdirs").resolve()  # as the script has it
  args = [
      "--quick",
      f"--out={out}",
      f"--workdirs={workdirs}",
      f"--manual_dir={tmp_path / 'manual'}",
      f"--data_dir={tmp_path / 'tfds'}",
      "--verify_checksums=0",
  ]
  r = _run(*args)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  assert res["quick"] is True and list(res["parts"]) == ["wt2", "passkey"]

  # -- wt2: the base, the control and a store, each fine-tuned from the base ------------------------
  wt2 = res["parts"]["wt2"]
  runs = wt2["runs"]
  assert list(runs) == ["base", "ft_xl", "ft_knn_s32"]
  for name, run in runs.items():
    config = json.loads((workdirs / name / "config.json").read_text())
    model = json.loads((workdirs / name / "model_config.json").read_text())["model"]
    assert config["train"]["num_steps"] == 3, name
    if name == "base":
      assert config["train"]["init_from"] == ""
    else:  # every fine-tune starts from the base's parameters, with its own memory
      assert config["train"]["init_from"] == str(workdirs / "base"), name
      assert "--config.train.init_from=" in run["train_command"], name
    assert model["memory"] == run["memory"] == ("knn" if name.startswith("ft_knn") else "xl")
    if run["memory"] == "knn":
      assert model["knn"]["memory_size"] == run["store"] == int(name.rsplit("_s", 1)[1])
      assert model["knn"]["num_neighbors"] == wt2["neighbors"] == 4
      assert list(run["evals"]) == ["as_trained", "no_store", "store_x4"]
      # The store each evaluation used, as eval_results.json records it.
      assert run["evals"]["as_trained"]["knn"]["memory_size"] == run["store"]
      assert run["evals"]["no_store"]["knn"]["memory_size"] == 0
      assert run["evals"]["store_x4"]["knn"]["memory_size"] == 4 * run["store"]
      gate = run["gate"]
      assert gate["layers"] == [0] and gate["step"] == 3  # (-2,) of 2 layers
      assert all(0 < g < 1 for g in gate["gate"][0]) and len(gate["gate"][0]) == 2
    else:
      assert list(run["evals"]) == ["as_trained"]
    for tag, ev in run["evals"].items():
      assert "refused" not in ev, (name, tag, ev)
      assert _finite_ppl(ev["valid_ppl"]) and _finite_ppl(ev["test_ppl"]), (name, tag)
    assert run["train_loss"] and all(math.isfinite(l) for _, l in run["train_loss"]), name
    assert run["n_params"] > 0
  # The evaluation kept for each eval (the workdir's file is overwritten by the next one).
  kept = json.loads((out / "logs" / "eval_ft_knn_s32_store_x4.json").read_text())
  assert kept["eval"]["knn"]["memory_size"] == 128

  # -- passkey: XL and kNN from scratch, evaluated at fixed depths -------------------------------
  pk = res["parts"]["passkey"]
  assert list(pk["runs"]) == ["pk_xl", "pk_knn"]
  for name, run in pk["runs"].items():
    assert run["workdir"] == str(workdirs / f"{name}_b3")  # one per length of training
    config = json.loads((workdirs / f"{name}_b3" / "config.json").read_text())
    assert config["data"]["dataset"] == "synthetic:passkey"
    assert config["data"]["synthetic_passkey_depth"] == -1  # trained at random depths
    assert run["num_steps"] == 3 * 96 // 16  # batches x segments of an example
    tags = list(run["evals"])
    assert tags[0] == "random" and len(tags) >= 3
    distances = [run["evals"][t]["distance"] for t in tags[1:]]
    assert distances == sorted(distances) and distances[0] > 0  # deeper: closer to the question
    for tag, ev in run["evals"].items():
      assert "refused" not in ev, (name, tag, ev)
      for split, n in (("test", 8), ("valid", 8)):
        acc = ev[split]
        assert acc["examples"] == n, (name, tag, split)
        assert 0 <= acc["answer_accuracy"] <= acc["answer_token_accuracy"] <= 1, (name, tag)
    assert all(math.isfinite(l) for _, l in run["train_loss"]), name
  assert pk["runs"]["pk_knn"]["gate"]["layers"] == [1]

  report = (out / "REPORT.md").read_text()
  assert "--quick run: the numbers mean nothing" in report
  assert "## WikiText-2: fine-tuned with and without a store" in report
  assert "## Passkey retrieval: accuracy by distance" in report
  for name in [*runs, *pk["runs"]]:
    assert f"| {name} |" in report

  # -- a second run reuses every training and evaluation (nothing is run again) -----------------
  r = _run(*args, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  again = json.loads((out / "results.json").read_text())
  assert again["parts"] == res["parts"]
  assert [i["command"] for i in again["invocations"]] == [res["invocations"][0]["command"]] * 2
  assert again["invocations"][1]["wall_s"] < 60

  # -- --report_only rewrites the same report from results.json -----------------------------------
  report = (out / "REPORT.md").read_text()
  (out / "REPORT.md").unlink()
  assert _run("--report_only", f"--out={out}", timeout=120).returncode == 0
  assert (out / "REPORT.md").read_text() == report


def test_an_unknown_part_is_one_error_line(tmp_path):
  r = _run("--parts=wt2,lstm", f"--out={tmp_path}", timeout=120)
  assert r.returncode == 1
  assert r.stderr.strip().splitlines() == [
      "error: --parts='wt2,lstm': choose from ['wt2', 'passkey']."
  ]
  assert not (tmp_path / "results.json").exists()
