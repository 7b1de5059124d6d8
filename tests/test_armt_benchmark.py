"""Smoke test of benchmarks/armt_memory.py: ARMT's cost against XL and the memory tokens."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: the benchmarks (14 compilations: 2-4 min of CPU time)

SCRIPT = REPO / "benchmarks" / "armt_memory.py"
# --smoke: 2 layers, d_model 16, 2x8 heads, d_inner 32, a 64-word tied softmax; T 8, batch 2;
# XL M 8; N 2 memory tokens; ARMT d_mem 2 and 4 (d_key 12 and 24); k 1.
L, D, T, B, M, N = 2, 16, 8, 2, 8, 2


def _run(*args):
  """The benchmark script with ARGS, on one CPU device (not the suite's simulated ones)."""
  return run_python([SCRIPT, *args], devices=1, timeout=900)


def test_armt_memory_smoke_times_every_variant(tmp_path):
  """Every variant's train and eval steps timed (tokens/s positive, the
  ratios their quotients against XL's); each variant's state and parameters
  are what its label says, counted by hand; XLA's arguments of the train
  step hold at least the parameters, Adam's two moments and the state, and
  those of the k = 1 train step the window of two segments.  No speed is
  checked."""
  out_json = tmp_path / "armt.json"
  proc = _run("--smoke", "--warmup=0", "--min_repeat_s=1e-6", f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "| variant | M | N | d_mem | k | params | state KiB/row | state vs XL |" in proc.stdout
  res = json.loads(out_json.read_text())
  assert set(res) == {"args", "machine", "variants", "ratios", "device_peak_mib", "table"}
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  assert len(res["machine"]["loadavg_end"]) == 3
  variants = {v["key"]: v for v in res["variants"]}
  # key -> (memory, XL slots, memory tokens N, d_mem, mem_backprop_depth).
  want = {
      "xl": ("xl", M, 0, 0, 0),
      "xl_m0": ("xl", 0, 0, 0, 0),
      f"tokens_n{N}": ("xl", 0, N, 0, 0),
      f"armt_n{N}_d2": ("armt", 0, N, 2, 0),
      f"armt_n{N}_d4": ("armt", 0, N, 4, 0),
      f"tokens_n{N}_k1": ("xl", 0, N, 0, 1),
      f"armt_n{N}_d4_k1": ("armt", 0, N, 4, 1),
  }
  assert list(variants) == list(want)
  # Embedding 64 x 16 and softmax bias 64; u and v 2 x 2 x 8 (shared by the layers); per layer:
  # q, k, v 16 x 48; output and r_net 16 x 16 each; feed-forward 16 x 32 + 32 + 32 x 16 + 16;
  # two layer norms 2 x 32.
  xl_params = 1024 + 64 + 32 + L * (768 + 2 * 256 + 1072 + 64)
  cache = L * M * D * 4  # mems_LxBxMxD per row, float32
  for key, (memory, slots, n, d_mem, depth) in want.items():
    v = variants[key]
    assert v["label"] in proc.stdout, key
    assert (v["memory"], v["mem_len"], v["num_mem_tokens"], v["d_mem"]) == (
        memory,
        slots,
        n,
        d_mem,
    ), key
    assert v["mem_backprop_depth"] == depth, key
    k = 6 * d_mem  # d_key: DPFP with nu = 3
    xl_bytes = L * slots * D * 4
    if memory == "armt":
      # Per layer A (d_key x d_model) and z (d_key), float32, and the bool "first"; parameters:
      # the N tokens, per layer W_q and W_k D x d_mem, W_v D x D, the gate D + 1.
      own = L * (k * D * 4 + k * 4 + 1)
      extra = n * D + L * (2 * D * d_mem + D * D + D + 1)
      leaves = {
          "armt_A_LxBxKxD": [[L, B, k, D], "float32"],
          "armt_z_LxBxK": [[L, B, k], "float32"],
          "armt_first_LxB": [[L, B], "bool"],
      }
    elif n:  # the memory tokens N x d_model float32 and the bool "fresh"; the N initial tokens
      own, extra = n * D * 4 + 1, n * D
      leaves = {"mem_tokens_BxNxD": [[B, n, D], "float32"], "mem_tokens_fresh_B": [[B], "bool"]}
    else:
      own, extra, leaves = 0, 0, {}
    assert v["state_leaves"] == {"mems_LxBxMxD": [[L, B, slots, D], "float32"], **leaves}, key
    assert v["xl_cache_bytes_per_row"] == xl_bytes and v["variant_bytes_per_row"] == own, key
    assert v["state_bytes_per_row"] == xl_bytes + own, key
    assert v["n_params"] == xl_params + extra, key
    for phase in ("train", "eval"):
      r = v[phase]
      assert r["tokens_per_step"] == B * T and len(r["s_per_token"]) == 3, (key, phase)
      assert r["steps_per_repeat"] == 1, (key, phase)
      assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, phase)
      ratio = res["ratios"][phase][key]
      assert ratio["tokens_per_sec"] == pytest.approx(
          r["tokens_per_sec"] / variants["xl"][phase]["tokens_per_sec"]
      )
      assert ratio["state_bytes_per_row"] == pytest.approx((xl_bytes + own) / cache)
      assert len(r["repeat_cpu_seconds"]) == 3 and r["cpu_tokens_per_sec"] > 0, (key, phase)
      assert ratio["cpu_tokens_per_sec"] == pytest.approx(
          r["cpu_tokens_per_sec"] / variants["xl"][phase]["cpu_tokens_per_sec"]
      )
      assert ratio["temp_mib"] == pytest.approx(r["temp_mib"] / variants["xl"][phase]["temp_mib"])
    assert math.isfinite(v["train"]["last_loss"])
    # XLA:CPU gives a memory analysis; the train step's arguments: parameters, Adam's mu and
    # nu (float32), the memory and the batch (inputs, targets, weights of k + 1 segments).
    batch = B * (depth + 1) * T * 12
    assert (
        v["train"]["argument_mib"] * 2**20 >= 3 * 4 * v["n_params"] + B * (xl_bytes + own) + batch
    ), key
    assert v["eval"]["argument_mib"] * 2**20 >= 4 * v["n_params"] + B * (xl_bytes + own), key
    assert v["train"]["temp_mib"] > 0, key
  # The k = 1 twin has its k = 0 twin's eval model: the same arguments.
  for key in (f"tokens_n{N}", f"armt_n{N}_d4"):
    assert variants[key + "_k1"]["eval"]["argument_mib"] == variants[key]["eval"]["argument_mib"]


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--d_mem=0,4", "error: --d_mem=0,4: give a comma list of integers >= 1."),
        ("--num_mem_tokens=", "error: --num_mem_tokens=: give a comma list of integers >= 1."),
        ("--mem_backprop_depth=-1", "error: --mem_backprop_depth=-1: must be >= 0"),
    ],
)
def test_armt_memory_bad_flags_are_one_error_line(flag, message):
  proc = _run("--smoke", flag)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err
