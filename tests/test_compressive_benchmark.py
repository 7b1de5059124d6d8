"""Smoke test of benchmarks/compressive_memory.py: the compressive memory's cost against XL."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: the benchmarks (10 compilations: 1 min of CPU time)

SCRIPT = REPO / "benchmarks" / "compressive_memory.py"
# --smoke: 1 layer, d_model 16, 2x8 heads, d_inner 32, a 64-word tied softmax; T 8, batch 2;
# M 8, Nc 4, c 2.
L, D, T, B, M, NC, C = 1, 16, 8, 2, 8, 4, 2


def _run(*args):
  """The benchmark script with ARGS, on one CPU device (not the suite's simulated ones)."""
  return run_python([SCRIPT, *args], devices=1, timeout=600)


def test_compressive_memory_smoke_times_every_variant(tmp_path):
  """Every variant's train and eval steps timed (tokens/s positive, the ratios
  their quotients against XL's); each variant's memory and parameters are
  what its label says, counted by hand; the timed training step carries
  the reconstruction loss exactly where there is a compressed memory; XLA's
  arguments of the train step hold at least the parameters and Adam's two
  moments.  No speed is checked."""
  out_json = tmp_path / "cm.json"
  proc = _run("--smoke", f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "| variant | slots Nc+M | range | params | state KiB/row | train tokens/s |" in proc.stdout
  res = json.loads(out_json.read_text())
  assert set(res) == {"args", "machine", "variants", "ratios", "device_peak_mib", "table"}
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  assert len(res["machine"]["loadavg_end"]) == 3
  variants = {v["key"]: v for v in res["variants"]}
  # key -> (memory slots Nc + M, parameters beyond XL's): the conv adds c D x D + D per layer.
  want = {
      "xl": (M, 0),
      "cmem_c2": (NC + M, L * (C * D * D + D)),
      "cmem_c2_max_pool": (NC + M, 0),
      "xl_range_c2": (M + C * NC, 0),
      "xl_keys": (M + NC, 0),
  }
  assert list(variants) == list(want)
  # Embedding 64 x 16 and softmax bias 64; q, k, v 16 x 48; output and r_net 16 x 16 each;
  # u and v 2 x 2 x 8; feed-forward 16 x 32 + 32 + 32 x 16 + 16; two layer norms 2 x 32.
  xl_params = 1024 + 64 + 768 + 2 * 256 + 32 + 1072 + 64
  for key, (slots, extra) in want.items():
    v = variants[key]
    assert v["label"] in proc.stdout, key
    assert v["state_shape_LxBxMxD"] == [L, B, slots, D], key
    assert v["state_bytes_per_row"] == L * slots * D * 4, key
    assert v["n_params"] == xl_params + extra, key
    for phase in ("train", "eval"):
      r = v[phase]
      assert r["tokens_per_step"] == B * T and len(r["s_per_token"]) == 3, (key, phase)
      assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, phase)
      ratio = res["ratios"][phase][key]
      assert ratio["tokens_per_sec"] == pytest.approx(
          r["tokens_per_sec"] / variants["xl"][phase]["tokens_per_sec"]
      )
      assert ratio["state_bytes_per_row"] == pytest.approx(slots / M)
      assert len(r["repeat_cpu_seconds"]) == 3 and r["cpu_tokens_per_sec"] > 0, (key, phase)
      assert ratio["cpu_tokens_per_sec"] == pytest.approx(
          r["cpu_tokens_per_sec"] / variants["xl"][phase]["cpu_tokens_per_sec"]
      )
    assert math.isfinite(v["train"]["last_loss"])
    if v["memory"] == "compressive":  # the memory is full after the warm-up: slots compressed
      assert v["train"]["last_recon"] > 0, key
    else:
      assert v["train"]["last_recon"] is None, key
    # XLA:CPU gives a memory analysis; the train step's arguments: parameters, Adam's mu and
    # nu (float32), the memory and the batch.
    assert v["train"]["argument_mib"] * 2**20 >= 3 * 4 * v["n_params"] + B * slots * D * 4, key
    assert v["eval"]["argument_mib"] * 2**20 >= 4 * v["n_params"] + B * slots * D * 4, key
    assert v["train"]["temp_mib"] > 0, key


def test_compressive_memory_bad_rates_are_one_error_line():
  proc = _run("--smoke", "--ratios=3")
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --ratios=3: give compression rates"), err
