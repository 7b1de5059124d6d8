"""Smoke tests of the benchmark tools: benchmarks/vs_pytorch.py, benchmarks/fit.py,
benchmarks/generation.py, benchmarks/dynamic_eval.py and the accelerator and
attention-kernel tools.

vs_pytorch.py runs in a subprocess (it starts one subprocess per
implementation and phase itself) at --smoke sizes; the test checks that it
exits 0, prints the markdown table with tokens/s, ratio, % of the matmul
limit and peak RSS of both implementations, equal parameter counts, writes
its JSON and compares against an earlier one.  fit.py compiles a tiny
config on 4 simulated devices.  generation.py samples with both
implementations in every cell of its --smoke grid.  dynamic_eval.py times
static and dynamic evaluation's steps on a tiny model.  No test checks speed.  Needs torch and
transformers (in the ``test`` extra; required, not skipped).
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, tiny_flags, tiny_model_config

pytestmark = pytest.mark.slow  # tooling: the benchmarks

SCRIPT = REPO / "benchmarks" / "vs_pytorch.py"
FIT = REPO / "benchmarks" / "fit.py"
NUMBER = r"[\d,]+(\.\d+)?"


def _load(path: Path, name: str):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses look their module up while the class is built
  spec.loader.exec_module(module)
  return module


vs_pytorch = _load(SCRIPT, "benchmark_vs_pytorch")
fit = _load(FIT, "benchmark_fit")


def _cells(out: str, start: str) -> list[str]:
  row = next((line for line in out.splitlines() if line.startswith(start)), None)
  assert row is not None, (start, out)
  return [c.strip() for c in row.strip("|").split("|")]


# ---------------------------------------------------------------------------
# vs_pytorch.py
# ---------------------------------------------------------------------------


def _saved_run(tokens_per_sec: float, rss: float, eval_mem_len: int = 16) -> dict:
  """A minimal saved run in the JSON layout of vs_pytorch.py."""
  return {
      "args": {"eval_mem_len": eval_mem_len, "steps": 2},
      "machine": {"date": "2026-01-01T00:00:00", "cpu": "test CPU", "loadavg_start": [0.1]},
      "matmul": {"limit_gflops": 100.0},
      "results": {
          "ours": {
              "n_params": 10,
              "train": {"median_tokens_per_sec": tokens_per_sec, "peak_rss_mib": rss, "steps": 2},
          },
          "pytorch": {
              "n_params": 10,
              "train": {"median_tokens_per_sec": 1000.0, "peak_rss_mib": 500.0},
          },
      },
  }


def test_benchmark_runs_and_prints_table(tmp_path):
  out_json, old_json = tmp_path / "bench.json", tmp_path / "old.json"
  old_json.write_text(json.dumps(_saved_run(tokens_per_sec=1e12, rss=1.0)))
  proc = subprocess.run(
      [
          sys.executable,
          str(SCRIPT),
          "--smoke",
          "--phases=train,eval_long",
          f"--json={out_json}",
          f"--compare={old_json}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = proc.stdout
  assert (
      "| phase | ours tokens/s | PyTorch tokens/s | ratio ours/PyTorch "
      "| ours % of matmul limit | PyTorch % of matmul limit "
      "| ours peak RSS MiB | PyTorch peak RSS MiB |"
  ) in out, out
  for phase in ("train", "eval_long"):
    cells = _cells(out, f"| {phase} (")
    assert all(re.fullmatch(NUMBER, c) for c in cells[1:3] + cells[4:8]), cells
    assert re.fullmatch(r"\d+\.\d\dx", cells[3]), cells
  assert "| eval_long (B=2, tgt_len=8, mem_len=32) |" in out, out
  assert re.search(r"parameters: ours [\d,]+, pytorch [\d,]+ \(equal\)", out), out
  assert re.search(
      r"matmul limit \(float32, N=256, best of every worker\): numpy [\d,]+, "
      r"jax [\d,]+, torch [\d,]+ GFLOP/s; limit [\d,]+ GFLOP/s",
      out,
  ), out
  assert "ours: model.attn_block train " in out and "load average" in out

  res = json.loads(out_json.read_text())
  assert set(res["results"]) == {"ours", "pytorch"}
  assert res["matmul"]["limit_gflops"] > 0 and res["machine"]["cpu"]
  for w in ("ours", "pytorch"):
    for phase in ("train", "eval_long"):
      r = res["results"][w][phase]
      assert r["matmul"]["numpy_gflops"] <= res["matmul"]["limit_gflops"]
      assert r["median_tokens_per_sec"] > 0 and r["peak_rss_mib"] >= r["rss_after_imports_mib"] > 0
      batch, tgt_len, mem_len = vs_pytorch.phase_lengths(vs_pytorch.parse_args(["--smoke"]), phase)
      assert r["flops_per_token"] == vs_pytorch.model_flops_per_token(
          1, 32, 2, 16, 64, 32, batch, tgt_len, mem_len, train=phase == "train"
      )
      assert r["pct_of_matmul_limit"] == pytest.approx(
          100
          * r["flops_per_token"]
          * r["median_tokens_per_sec"]
          / (res["matmul"]["limit_gflops"] * 1e9)
      )
  assert res["machine"]["versions"]["transformers"] == "4.35.2"
  # --compare: the old run was "faster" and "smaller", so both are regressions.
  assert re.search(r"results\.ours\.train\.median_tokens_per_sec .* REGRESSION", out), out
  assert re.search(r"results\.ours\.train\.peak_rss_mib .* REGRESSION", out), out
  assert "settings that differ: " in out and "eval_mem_len" not in out.split("settings")[1][:80]


def test_compare_two_saved_runs(tmp_path):
  old, new = tmp_path / "old.json", tmp_path / "new.json"
  old.write_text(json.dumps(_saved_run(tokens_per_sec=2000.0, rss=800.0)))
  new.write_text(json.dumps(_saved_run(tokens_per_sec=1000.0, rss=600.0, eval_mem_len=2048)))
  proc = subprocess.run(
      [sys.executable, str(SCRIPT), f"--compare={old}", f"--new={new}"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
  assert re.search(
      r"2,000\s+1,000\s+-50\.0%\s+REGRESSION$", lines["results.ours.train.median_tokens_per_sec"]
  )
  assert re.search(r"800\s+600\s+-25\.0%\s+better$", lines["results.ours.train.peak_rss_mib"])
  assert re.search(r"2\s+1\s+-50\.0%\s+REGRESSION$", lines["ratio.train"])
  assert lines["results.pytorch.train.median_tokens_per_sec"].endswith("+0.0%")
  assert lines["results.ours.train.steps"].endswith("+0.0%")  # neutral: no verdict
  assert "settings that differ: eval_mem_len: 16 -> 2048" in proc.stdout
  assert "2 regression(s) beyond 5%" in proc.stdout


def test_compare_bad_file_is_one_error_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          str(SCRIPT),
          f"--compare={tmp_path / 'no.json'}",
          f"--new={tmp_path / 'no.json'}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert proc.returncode != 0
  assert proc.stderr.strip().startswith("error: cannot read") and proc.stderr.count("\n") == 1


def test_model_flops_per_token_by_hand():
  # One layer, d_model 4, one head of 4, d_inner 8, vocab 10, B=1, T=2, M=2 (K=4).
  # Multiply-adds per segment: q 2x4x4=32, k and v 4x4x8=128, r_net 4x4x4=64,
  # (a)+(c) 2x4x4=32, (b)+(d) 32, prob x v 32, o_net 2x4x4=32, feed-forward
  # 2x(2x4x8)=128, softmax 2x4x10=80: 560 over 2 tokens = 280 -> 560 FLOPs.
  assert vs_pytorch.model_flops_per_token(1, 4, 1, 4, 8, 10, 1, 2, 2, train=False) == 560
  assert vs_pytorch.model_flops_per_token(1, 4, 1, 4, 8, 10, 1, 2, 2, train=True) == 3 * 560
  # The default benchmark model: ~41 MFLOP per training token (the issue's ~40).
  flops = vs_pytorch.model_flops_per_token(6, 256, 8, 32, 1024, 256, 8, 128, 128, train=True)
  assert 40e6 < flops < 42e6


# ---------------------------------------------------------------------------
# fit.py
# ---------------------------------------------------------------------------

TINY_FIT = [
    "--config=configs/quickstart.py",
    "--devices=4",
    "--config.mesh.shape=(4, 1)",
    *tiny_flags(
        train=False,
        model__n_layer=1,
        model__tgt_len=None,
        model__mem_len=None,
        eval__global_batch=4,
    ),
]


def test_fit_smoke_fits_and_does_not_fit(tmp_path):
  """A tiny config on 4 simulated devices with 0.008 GiB each: the eval step
  (parameters and a few rows) fits, the train step (Adam moments, gradients
  and the [16/4, 32, 10000] logits) does not, nor does its most frugal
  setting, remat "full" (the logits are outside the layers; tgt_len 32
  leaves no smaller attention block to try)."""
  out_json = tmp_path / "fit.json"
  proc = subprocess.run(
      [sys.executable, str(FIT), *TINY_FIT, "--device_memory=0.008", f"--json={out_json}"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = proc.stdout
  assert "| config | slice | mesh | step | remat | attn_block |" in out, out
  train, ev = _cells(
      out, "| `configs/quickstart.py` | 4 x h100 | (data 4, model 1) | train"
  ), _cells(out, "| `configs/quickstart.py` | 4 x h100 | (data 4, model 1) | eval")
  assert train[13] == "DOES NOT FIT" and ev[13] == "FITS", out
  assert train[14].startswith("no remat / attn_block setting gets below 90% (remat=full"), out
  assert "not measured on the accelerator" in out
  res = json.loads(out_json.read_text())["results"][0]
  assert res["mesh"] == {"data": 4, "model": 1} and res["n_params"] > 0
  for step in ("train", "eval"):
    rep = res["steps"][step]["as_configured"]
    assert (
        rep["total_bytes"]
        == (
            rep["argument_bytes"]
            + rep["output_bytes"]
            - rep["alias_bytes"]
            + rep["temp_bytes"]
            + rep["generated_code_bytes"]
        )
        > 0
    )
    assert res["steps"][step]["verdict"] == fit.classify(rep["total_bytes"], 0.008 * 2**30, 0.1)
  assert res["steps"]["train"]["as_configured"]["alias_bytes"] > 0  # the state is donated
  assert [(t["remat"], t["attn_block"]) for t in res["steps"]["train"]["search"]["tried"]] == [
      ("full", 0)
  ]


@pytest.mark.parametrize(
    "spec, overrides, devices, kind, message",
    [
        ("configs/nope.py", [], None, None, "config file not found: configs/nope.py"),
        ("configs/enwik8_24l.py:v9-32", [], None, None, "Unknown TPU slice preset 'v9-32'"),
        ("configs/enwik8_12l.py:v3-8", [], None, None, "configs/enwik8_12l.py takes no argument"),
        (
            "configs/enwik8_24l.py:v3-32",
            [("model.bogus", "1")],
            None,
            None,
            "unknown config key --config.model.bogus",
        ),
        (
            "configs/enwik8_24l.py:v3-32",
            [("model.n_layer", "x")],
            None,
            None,
            "--config.model.n_layer='x': expected a value of type int",
        ),
        ("configs/enwik8_12l.py", [], None, "tpu", "--device_kind='tpu'"),
        (
            "configs/enwik8_12l.py",
            [],
            8,
            None,
            "configs/enwik8_12l.py on 8 device(s): Invalid config",
        ),
    ],
)
def test_fit_bad_input(spec, overrides, devices, kind, message):
  with pytest.raises(fit.FitError) as err:
    fit.make_job(spec, overrides, devices, kind, None, None, True, 8)
  assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_fit_bad_input_is_one_error_line():
  proc = subprocess.run(
      [sys.executable, str(FIT), "--config=configs/enwik8_24l.py:v9-32"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode == 1
  assert proc.stderr.startswith("error: Unknown TPU slice preset 'v9-32'")
  assert proc.stderr.count("\n") == 1, proc.stderr


def test_fit_overrides_and_jobs():
  rest, overrides = fit.split_overrides(
      ["--all", "--config.model.remat=full", "--config.mesh.shape", "(2, 4)"]
  )
  assert rest == ["--all"] and overrides == [("model.remat", "full"), ("mesh.shape", "(2, 4)")]
  job = fit.make_job(
      "configs/enwik8_24l.py:v3-32", [("model.attn_block", "128")], None, None, None, None, True, 8
  )
  assert (job.devices, job.device_kind, job.device_memory_gib, job.vocab) == (32, "v3", 16, 256)
  job = fit.make_job("configs/lm1b_base.py", [], None, None, 40.0, None, True, 8)
  assert (job.devices, job.device_kind, job.device_memory_gib, job.vocab) == (
      1,
      "h100",
      40.0,
      793_471,
  )
  config = fit.load_config("configs/wt103_large.py:v3-64")
  fit.apply_overrides(
      config,
      [
          ("model.remat", "save_proj"),
          ("model.cutoffs", "(10, 20)"),
          ("model.untie_r", "true"),
          ("train.clip", "0.5"),
      ],
  )
  assert (config.model.remat, config.model.cutoffs, config.model.untie_r, config.train.clip) == (
      "save_proj",
      (10, 20),
      True,
      0.5,
  )
  assert {spec.partition(":")[0] for spec, _ in fit.ALL_CONFIGS} == {
      f"configs/{n}.py"
      for n in (
          "enwik8_12l",
          "enwik8_24l",
          "text8_24l",
          "wt103_base",
          "wt103_large",
          "lm1b_base",
          "lm1b_large",
          "ptb",
      )
  }


def test_fit_search_order_and_verdicts():
  cands = fit.candidates("train", "none", 0, 128)
  # The most frugal first, then from the least recomputation up (blocks 64, 32 < 128).
  assert cands[:5] == [("full", 32), ("none", 64), ("none", 32), ("dots", 0), ("dots", 64)]
  assert len(cands) == 5 * 3 - 1 and ("none", 0) not in cands and cands[-1] == ("full", 64)
  assert fit.candidates("eval", "none", 0, 80) == [("none", 32), ("none", 64)]
  assert fit.candidates("eval", "none", 0, 32) == []  # no block below tgt_len, no remat
  assert fit.candidates("train", "full", 0, 32) == []  # the most frugal already
  assert fit.candidates("train", "full", 0, 64) == [("full", 32)] + [
      (r, b) for r in fit.REMAT_ORDER[:-1] for b in (0, 32)
  ]

  sizes = {("full", 32): 5, ("none", 64): 12, ("none", 32): 8, ("dots", 0): 7}
  calls = []

  def try_setting(remat, block):
    calls.append((remat, block))
    return {"remat": remat, "attn_block": block, "total_bytes": sizes.get((remat, block), 6)}

  quiet = lambda _: None
  # Nothing fits when the most frugal does not: one compilation.
  s = fit.search_fit(try_setting, "train", "none", 0, 128, 4, 8, quiet)
  assert s["fix"] is None and calls == [("full", 32)]
  # The first that fits in the order, after the frugal one.
  calls.clear()
  s = fit.search_fit(try_setting, "train", "none", 0, 128, 8.5, 8, quiet)
  assert (s["fix"]["remat"], s["fix"]["attn_block"], s["cheapest"]) == ("none", 32, True)
  assert calls == [("full", 32), ("none", 64), ("none", 32)]
  # max_tries cuts the search short: the frugal setting, marked as maybe not the cheapest.
  calls.clear()
  s = fit.search_fit(try_setting, "train", "none", 0, 128, 8.5, 2, quiet)
  assert (s["fix"]["remat"], s["fix"]["attn_block"], s["cheapest"]) == ("full", 32, False)

  assert [fit.classify(x, 100, 0.1) for x in (50, 90, 90.5, 100, 101)] == [
      "FITS",
      "FITS",
      "TIGHT",
      "TIGHT",
      "DOES NOT FIT",
  ]
  configured = {"remat": "none", "attn_block": 0, "total_bytes": 20 * 2**30}
  fix = {"remat": "none", "attn_block": 16, "total_bytes": 3 * 2**30}
  assert fit.verdict_text({"verdict": "FITS", "as_configured": configured}, 0.1) == ("FITS", "")
  assert fit.verdict_text(
      {
          "verdict": "TIGHT",
          "as_configured": configured,
          "search": {"fix": fix, "cheapest": True, "tried": [fix]},
      },
      0.1,
  ) == ("TIGHT", "`--config.model.attn_block=16` (3.00 GiB)")
  frugal = {"remat": "full", "attn_block": 16, "total_bytes": 17 * 2**30}
  verdict, text = fit.verdict_text(
      {
          "verdict": "DOES NOT FIT",
          "as_configured": configured,
          "search": {"fix": None, "cheapest": True, "tried": [frugal]},
      },
      0.1,
  )
  assert verdict == "DOES NOT FIT" and "remat=full, attn_block=16: 17.00 GiB" in text
  assert fit.verdict_text({"verdict": "DOES NOT FIT", "as_configured": configured}, 0.1)[
      1
  ].startswith("not searched")


# ---------------------------------------------------------------------------
# attention_kernel.py
# ---------------------------------------------------------------------------


def test_attention_kernel_smoke_writes_both_paths(tmp_path):
  """The kernel benchmark at --smoke sizes (interpret mode on CPU): both
  implementations timed for every length and the training step, a table
  and the JSON; no speed is checked."""
  out_json = tmp_path / "kernel.json"
  proc = subprocess.run(
      [
          sys.executable,
          str(REPO / "benchmarks" / "attention_kernel.py"),
          "--smoke",
          "--train_configs=enwik8_12l",
          f"--json={out_json}",
      ],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| T | K | fwd ms xla | fwd ms pallas |" in proc.stdout
  res = json.loads(out_json.read_text())
  assert [r["T"] for r in res["attention"]] == [8, 16]
  for r in res["attention"]:
    assert r["K"] == 2 * r["T"]
    for impl in ("xla", "pallas"):
      assert r[impl]["fwd_ms"] > 0 and r[impl]["fwd_bwd_ms"] > 0
  (train,) = res["train"]
  assert train["config"] == "enwik8_12l"
  assert train["xla"]["tokens_per_sec"] > 0 and train["pallas"]["tokens_per_sec"] > 0
  assert train["xla"]["mfu"] is None  # no peak FLOP/s known for a CPU


# ---------------------------------------------------------------------------
# accelerator.py
# ---------------------------------------------------------------------------


def _accelerator():
  spec = importlib.util.spec_from_file_location("bench_acc", REPO / "benchmarks" / "accelerator.py")
  acc = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(acc)
  return acc


def test_accelerator_smoke_trains_evaluates_and_compares(tmp_path):
  """The accelerator benchmark at --smoke sizes on CPU, EVERY default config
  (wt103_large's div_val 4 among them: HF's adaptive embedding, which fails
  under bf16 autocast, runs in float32): our train and eval steps, the
  PyTorch port with bf16 autocast (CPU in smoke mode), no failed part; the
  JSON, the summary table, and --compare on it.  About 2 minutes on 2 CPUs."""
  out_json = tmp_path / "acc.json"
  script = str(REPO / "benchmarks" / "accelerator.py")
  proc = subprocess.run(
      [sys.executable, script, "--smoke", f"--json={out_json}"],  # the default --configs
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  defaults = _accelerator().parse_args([]).configs.split(",")
  assert len(defaults) == 4 and "wt103_large" in defaults
  res = {r["config"]: r for r in json.loads(out_json.read_text())["results"]}
  assert list(res) == defaults
  for name, r in res.items():
    assert "error" not in json.dumps(r), r
    assert r["train"]["tokens_per_sec"] > 0 and r["eval"]["tokens_per_sec"] > 0
    assert r["train"]["flops_per_token"] > 0 and r["train"]["mfu"] is None  # CPU: no peak
    assert r["train"]["source"] in ("device", "xla_estimate")
    assert r["pytorch"]["tokens_per_sec"] > 0 and r["pytorch"]["device"] == "cpu"
    cells = _cells(proc.stdout, f"| {name} |")
    assert all(re.fullmatch(NUMBER, c) for c in cells[1:4]) and cells[4] == "", cells
  proc = subprocess.run(
      [sys.executable, script, f"--compare={out_json}", f"--new={out_json}"],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=120,
  )
  assert (
      proc.returncode == 0
      and "| wt103_large | train |" in proc.stdout
      and "| 1.00 |" in proc.stdout
  )


def _fake_ours(args, name, config, vocab):
  """Our measurement without running anything: a row as ``ours`` returns."""
  return {
      "config": name,
      "train": {"global_batch": 2, "tokens_per_sec": 100.0},
      "eval": {"tokens_per_sec": 200.0},
  }


def test_accelerator_failed_baseline_is_a_row_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
  """A PyTorch baseline that raises (here injected: HF's dtype error of the
  adaptive embedding under autocast) gives its config a row that says why,
  in one line, and the next config still runs; exit 0.  Our own measurement
  that raises gives the whole row an error; --compare shows it as failed."""
  acc = _accelerator()
  calls = []

  def failing_pytorch(args, config, vocab, batch):
    calls.append(config.model.div_val)
    if config.model.div_val > 1:
      raise RuntimeError(
          "index_copy_(): self and source expected to have the same dtype, but got (self) "
          "Float and (source) BFloat16\nsecond line"
      )
    return {"device": "cpu", "global_batch": batch, "tokens_per_sec": 50.0}

  def ours(args, name, config, vocab):
    if name == "enwik8_24l":
      raise ValueError("compile failed\n  details")
    return _fake_ours(args, name, config, vocab)

  monkeypatch.setattr(acc, "ours", ours)
  monkeypatch.setattr(acc, "pytorch", failing_pytorch)
  out_json = tmp_path / "acc.json"
  argv = ["--smoke", "--configs=wt103_large,enwik8_24l,enwik8_12l", f"--json={out_json}"]
  assert acc.main(argv) == 0
  out = capsys.readouterr().out
  assert calls == [4, 1]  # wt103_large's failed, enwik8_24l had no train step, enwik8_12l's ran
  res = {r["config"]: r for r in json.loads(out_json.read_text())["results"]}
  reason = (
      "RuntimeError: index_copy_(): self and source expected to have the same dtype, "
      "but got (self) Float and (source) BFloat16"
  )
  assert res["wt103_large"]["pytorch"] == {"error": reason}
  assert res["wt103_large"]["train"]["tokens_per_sec"] == 100.0
  assert res["enwik8_24l"] == {"config": "enwik8_24l", "error": "ValueError: compile failed"}
  assert res["enwik8_12l"]["pytorch"]["tokens_per_sec"] == 50.0
  assert _cells(out, "| wt103_large |") == [
      "wt103_large",
      "100",
      "200",
      "failed",
      f"pytorch: {reason}",
  ]
  assert _cells(out, "| enwik8_24l |") == [
      "enwik8_24l",
      "failed",
      "-",
      "-",
      "ours: ValueError: compile failed",
  ]
  assert _cells(out, "| enwik8_12l |") == ["enwik8_12l", "100", "200", "50", ""]
  assert acc.main([f"--compare={out_json}", f"--new={out_json}"]) == 0
  out = capsys.readouterr().out
  assert "| enwik8_24l | train | failed | failed | - |" in out
  assert "| wt103_large | eval | 200 | 200 | 1.00 |" in out


def test_accelerator_nothing_measured_exits_1(tmp_path, monkeypatch, capsys):
  """Where no config's train step could be measured the rows are still
  written, and the exit status is 1; an unknown config name stops the run
  before anything is measured."""
  acc = _accelerator()

  def ours(args, name, config, vocab):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")

  monkeypatch.setattr(acc, "ours", ours)
  out_json = tmp_path / "acc.json"
  assert acc.main(["--smoke", "--configs=enwik8_12l", "--no_pytorch", f"--json={out_json}"]) == 1
  assert json.loads(out_json.read_text())["results"] == [
      {"config": "enwik8_12l", "error": "RuntimeError: RESOURCE_EXHAUSTED: out of memory"}
  ]
  assert "nothing could be measured" in capsys.readouterr().err
  measured = []
  monkeypatch.setattr(acc, "ours", lambda *a: measured.append(a) or _fake_ours(*a))
  with pytest.raises(SystemExit, match="no config configs/nope.py"):
    acc.main(["--smoke", "--configs=enwik8_12l,nope", "--no_pytorch", f"--json={out_json}"])
  assert measured == []


def test_accelerator_softmax_flops_by_hand():
  """Adaptive softmax FLOPs as adaptive.py computes them: every cluster for
  every token (head: cutoffs[0] + clusters columns)."""
  acc = _accelerator()
  dense = tiny_model_config(n_token=100, d_model=8, d_head=4, d_inner=16)
  assert acc.softmax_flops_per_token(dense) == 2 * 8 * 100
  # d_embed 16 != d_model 8, div_val 2: cluster widths 16, 8, 4 each projected from 8
  adaptive = tiny_model_config(
      n_token=100, d_model=8, d_head=4, d_inner=16, cutoffs=(20, 50), div_val=2, d_embed=16
  )
  assert acc.softmax_flops_per_token(adaptive) == (
      (2 * 8 * 16 + 2 * 16 * 22) + (2 * 8 * 8 + 2 * 8 * 30) + (2 * 8 * 4 + 2 * 4 * 50)
  )


# ---------------------------------------------------------------------------
# generation.py
# ---------------------------------------------------------------------------


def test_generation_smoke_times_both_in_every_cell(tmp_path):
  """The sampling benchmark at --smoke sizes: ours (Generator) and HF's
  generate in every cell of the smoke grid (batch 1 and 2, mem_len 8 and
  16), tokens/s, first-token latencies and the ratio in the JSON and the
  table; then --compare of the file with itself.  No speed is checked."""
  out_json = tmp_path / "generation.json"
  script = str(REPO / "benchmarks" / "generation.py")
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join(
          [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
      ),
  )
  proc = subprocess.run(
      [sys.executable, script, "--smoke", f"--json={out_json}"],
      capture_output=True,
      text=True,
      cwd=REPO,
      env=env,
      timeout=900,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert (
      "| batch | mem_len | ours tokens/s | HF tokens/s | ours/HF | >= 2x "
      "| ours first token s | HF first token s | HF/ours first token "
      "| ours warm-up (compile) s |"
  ) in proc.stdout, proc.stdout
  res = json.loads(out_json.read_text())
  cells = [(1, 8), (2, 8), (1, 16), (2, 16)]
  assert [(c["batch"], c["mem_len"]) for c in res["settings"]["cells"]] == cells
  assert set(res["results"]) == {"ours", "pytorch"}
  assert res["machine"]["commit"] and res["machine"]["versions"]["transformers"] == "4.35.2"
  for batch, mem_len in cells:
    key = f"B{batch}_M{mem_len}"
    assert f"| {batch} | {mem_len} | " in proc.stdout
    for w in ("ours", "pytorch"):
      r = res["results"][w][key]
      assert (r["batch"], r["mem_len"], r["num_tokens"], r["prompt_len"]) == (batch, mem_len, 5, 8)
      assert len(r["tokens_per_sec"]) == 1 and r["median_tokens_per_sec"] > 0
      assert r["min_tokens_per_sec"] <= r["median_tokens_per_sec"] <= r["max_tokens_per_sec"]
      assert r["median_first_token_latency_s"] > 0 and r["warmup_seconds"] > 0
    assert res["results"]["pytorch"][key]["hf_mem_len"] == mem_len
    assert res["results"]["ours"][key]["compile_seconds"] > 0
    ratio = res["ratios"][key]
    assert ratio["tokens_per_sec"] == pytest.approx(
        res["results"]["ours"][key]["median_tokens_per_sec"]
        / res["results"]["pytorch"][key]["median_tokens_per_sec"]
    )
    assert ratio["first_token"] > 0 and isinstance(ratio["target_met"], bool)
  assert re.search(r"parameters: ours [\d,]+, HF [\d,]+", proc.stdout), proc.stdout
  proc = subprocess.run(
      [sys.executable, script, f"--compare={out_json}", f"--new={out_json}"],
      capture_output=True,
      text=True,
      cwd=REPO,
      env=env,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert re.search(r"ratio\.B2_M16 .* \+0\.0%", proc.stdout), proc.stdout
  assert "0 regression(s)" in proc.stdout


# ---------------------------------------------------------------------------
# dynamic_eval.py
# ---------------------------------------------------------------------------

DYNAMIC_EVAL = REPO / "benchmarks" / "dynamic_eval.py"
DYNAMIC_STEPS = ("static_b", "static_1", "update_1", "update_b", "stats_1")


def _run_dynamic_eval(*args):
  env = dict(os.environ, PYTHONPATH=str(REPO))  # one CPU device, not the suite's simulated ones
  env["XLA_FLAGS"] = " ".join(
      f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f
  )
  return subprocess.run(
      [sys.executable, str(DYNAMIC_EVAL), *args],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )


def test_dynamic_eval_smoke_times_static_and_dynamic(tmp_path):
  """The dynamic-evaluation cost benchmark at --smoke sizes: the five steps
  (static at B = 2 and 1, the dynamic update at 1 and 2, the statistics
  step at 1) timed, every tokens/s positive and finite, the ratios their
  quotients, the parameter count against one counted by hand and the
  dynamic state 4 x the float32 parameters; the table and the JSON.  No
  speed is checked."""
  out_json = tmp_path / "dynamic_eval.json"
  proc = _run_dynamic_eval("--smoke", f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert (
      "| step | rows | tokens/s | ms per segment | vs static, 1 row | vs static, 2 rows "
      "| temporaries MiB (XLA) |"
  ) in proc.stdout, proc.stdout
  for label in ("(a) static", "(b) static", "(c) dynamic update", "(d) dynamic update"):
    assert f"| {label} | " in proc.stdout, proc.stdout
  assert "(c)/(b)" in proc.stdout and "load average" in proc.stdout
  res = json.loads(out_json.read_text())
  assert set(res) == {
      "args",
      "machine",
      "model",
      "settings",
      "results",
      "ratios",
      "device_peak_mib",
      "table",
  }
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  assert len(res["machine"]["loadavg_start"]) == 3 and len(res["machine"]["loadavg_end"]) == 3
  assert set(res["results"]) == set(DYNAMIC_STEPS)
  for key, batch in zip(DYNAMIC_STEPS, (2, 1, 1, 2, 1)):
    r = res["results"][key]
    assert r["batch"] == batch and r["tokens_per_step"] == batch * 8, (key, r)
    assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, r)
    assert len(r["s_per_token"]) == 3 and all(s > 0 for s in r["s_per_token"]), (key, r)
    assert r.get("last_nll_finite", True), key
  assert set(res["ratios"]) == {
      "update_1/static_1",
      "update_b/static_b",
      "update_1/static_b",
      "stats_1/static_1",
  }
  for name, ratio in res["ratios"].items():
    num, den = name.split("/")
    assert ratio == pytest.approx(
        res["results"][num]["tokens_per_sec"] / res["results"][den]["tokens_per_sec"]
    )
  m = res["model"]
  # 1 layer, d_model 32, 2x16 heads, d_inner 64, a 64-word tied softmax: embedding 64 x 32,
  # softmax bias 64; q, k, v 32 x 96; output 32 x 32; r_net 32 x 32; u and v biases 2 x 2 x 16;
  # feed-forward 32 x 64 + 64 + 64 x 32 + 32; two layer norms 2 x 64.
  assert m["n_params"] == 2048 + 64 + 3072 + 1024 + 1024 + 64 + 4192 + 128
  assert m["param_bytes"] == 4 * m["n_params"] and m["dynamic_state_bytes"] == 4 * m["param_bytes"]
  assert (m["tgt_len"], m["mem_len"], m["same_length"]) == (8, 16, True)
  assert res["settings"]["global_batch"] == 1 and res["settings"]["rule"] == "rms"


def test_dynamic_eval_bad_input_is_one_error_line():
  proc = _run_dynamic_eval("--smoke", "--eps=0")
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --eps"), proc.stderr
