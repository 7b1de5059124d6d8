"""scripts/reproduce_wt2.py --quick: the WikiText-2 study end to end on a tiny
WikiText-format sample (every part runs, every number lands in results.json,
the report and its plots are written); its numbers mean nothing."""

import json
import math
import subprocess
import sys

import pytest

from data_samples import _WIKI, _wiki_zip
from helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow  # end to end: the study script

_TEXTS = {"train": _WIKI["train"] * 4, "valid": _WIKI["valid"] * 3, "test": _WIKI["test"] * 3}


def test_quick_study_writes_every_part(tmp_path):
  _wiki_zip(tmp_path / "manual", "wikitext-2", _TEXTS)
  out = tmp_path / "out"
  env = subprocess_env(devices=1)  # one CPU device, XLA's backend optimisation off (conftest)
  r = subprocess.run(
      [
          sys.executable,
          "scripts/reproduce_wt2.py",
          "--quick",
          f"--out={out}",
          f"--workdirs={tmp_path / 'workdirs'}",
          f"--manual_dir={tmp_path / 'manual'}",
          f"--data_dir={tmp_path / 'tfds'}",
          "--verify_checksums=0",
      ],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=1200,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  assert list(res["table6"]) == [
      "xl",
      "shaw",
      "xl_half",
      "no_recurrence",
      "vaswani_half",
      "alrfou_half",
      "vanilla",
  ]
  for v, row in res["table6"].items():
    assert row["step"] == 3, v  # --quick trains 3 steps
    for key in ("ppl_init", "ppl_best"):
      assert all(math.isfinite(row[key][s]) and row[key][s] > 1 for s in ("valid", "test"))
    # "best" is the minimum over the workdir's own evaluation and the sweep.
    assert (
        row["ppl_best"]["valid"]
        <= min([row["ppl_init"]["valid"], *row["curve_valid"].values()]) + 5e-3
    )
  assert res["table6"]["vanilla"]["eval_method"] == "sliding"
  # Run-to-run noise: xl again with another seed, its PPL init beside the first run's.
  noise = res["noise"]
  assert noise["variant"] == "xl" and noise["seeds"][0] != noise["seeds"][1]
  assert noise["ppl_init"]["valid"][0] == res["table6"]["xl"]["ppl_init"]["valid"]
  assert all(math.isfinite(p) and p > 1 for p in noise["ppl_init"]["test"])
  # vanilla is alrfou_half's parameters evaluated with the sliding window.
  assert res["table6"]["alrfou_half"]["eval_method"] == "segments"
  assert set(res["recl"]["results"]) == {"0.1", "0.5", "1.0"}
  assert len(res["recl"]["results"]["0.1"]["recl"]) == 4  # xl, shaw, no_recurrence, vanilla
  assert res["speed"]["results"]["rows"] and "slowdown" in res["speed"]["results"]["rows"][0]
  assert res["best_model"] in ("xl", "xl_half", "shaw")
  assert len(res["samples"]["samples"]) == 2
  assert set(res["learning_curves"]) == {
      "xl",
      "xl_half",
      "shaw",
      "no_recurrence",
      "vaswani_half",
      "alrfou_half",
  }
  for png in (
      "learning_curves.png",
      "table6_attention_length.png",
      "recl/fig3_relative_gains.png",
      "recl/fig4_perplexity.png",
      "attention/average_attention.png",
  ):
    assert (out / png).read_bytes()[:4] == b"\x89PNG", png
  report = (out / "REPORT.md").read_text()
  assert "Table 6" in report and "Table 8" in report and "Table 9" in report
  assert "Appendix E" in report and "Run-to-run noise" in report
  # --report_only rewrites the report from results.json alone, the same text.
  (out / "REPORT.md").unlink()
  r = subprocess.run(
      [sys.executable, "scripts/reproduce_wt2.py", "--report_only", f"--out={out}"],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert (out / "REPORT.md").read_text() == report


def test_report_only_without_a_finished_run_says_so(tmp_path):
  r = subprocess.run(
      [sys.executable, "scripts/reproduce_wt2.py", "--report_only", f"--out={tmp_path}"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert r.returncode == 1
  assert "--report_only needs" in r.stderr and "Traceback" not in r.stderr
