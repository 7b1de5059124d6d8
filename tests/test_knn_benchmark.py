"""Smoke test of benchmarks/knn_memory.py: the kNN memory's cost against XL."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: the benchmarks (10 compilations: 1-2 min of CPU time)

SCRIPT = REPO / "benchmarks" / "knn_memory.py"
# --smoke: 2 layers, d_model 16, 2x8 heads, d_inner 32, a 64-word tied softmax; T 8, batch 2;
# M 8; stores of 16 and 64 entries at layer -2 (layer 0), k 4.
L, D, H, DH, T, B, M, K = 2, 16, 2, 8, 8, 2, 8, 4
SMALL, LARGE = 16, 64


def _run(*args):
  """The benchmark script with ARGS, on one CPU device (not the suite's simulated ones)."""
  return run_python([SCRIPT, *args], devices=1, timeout=900)


def test_knn_memory_smoke_times_every_variant(tmp_path):
  """Every variant's train and eval steps timed (tokens/s positive, the
  ratios their quotients against XL's); each variant's state and parameters
  are what its label says, counted by hand; the stores are full after
  timing, which with one step per repeat and no warm-up (7 segments of 8:
  56 entries written) only the filling before the warm-up makes true of the
  64-entry store; XLA's arguments of the train step hold at least the
  parameters, Adam's two moments and the state.  No speed is checked."""
  out_json = tmp_path / "knn.json"
  proc = _run("--smoke", "--warmup=0", "--min_repeat_s=1e-6", f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "| variant | store S | k | retrieval | params | state KiB/row | state vs XL |" in (
      proc.stdout
  )
  res = json.loads(out_json.read_text())
  assert set(res) == {"args", "machine", "variants", "ratios", "device_peak_mib", "table"}
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  assert len(res["machine"]["loadavg_end"]) == 3
  variants = {v["key"]: v for v in res["variants"]}
  # key -> (store entries S, retrieval); XL has none.
  want = {
      "xl": (0, None),
      f"knn_s{SMALL}": (SMALL, "bucketed"),
      f"knn_s{LARGE}": (LARGE, "bucketed"),
      f"knn_s{LARGE}_exact": (LARGE, "exact"),
      f"knn_s{LARGE}_approx": (LARGE, "approx"),
  }
  assert list(variants) == list(want)
  # Embedding 64 x 16 and softmax bias 64; u and v 2 x 2 x 8 (shared by the layers); per layer:
  # q, k, v 16 x 48; output and r_net 16 x 16 each; feed-forward 16 x 32 + 32 + 32 x 16 + 16;
  # two layer norms 2 x 32.
  xl_params = 1024 + 64 + 32 + L * (768 + 2 * 256 + 1072 + 64)
  cache = L * M * D * 4  # mems_LxBxMxD per row, float32
  for key, (s, retrieval) in want.items():
    v = variants[key]
    assert v["label"] in proc.stdout, key
    assert v["retrieval"] == retrieval and v["memory_size"] == s, key
    # One memory layer: keys and values H x S x Dh float32, and the int32 write index; the gate
    # bias and the scale, one per head, in every layer (the layers are one scan).
    store = 2 * H * s * DH * 4 + 4 if s else 0
    assert v["state_shape_LxBxMxD"] == [L, B, M, D], key
    assert v["store_shape_NxBxHxSxDh"] == ([1, B, H, s, DH] if s else None), key
    assert v["xl_cache_bytes_per_row"] == cache and v["store_bytes_per_row"] == store, key
    assert v["state_bytes_per_row"] == cache + store, key
    assert v["n_params"] == xl_params + (2 * H * L if s else 0), key
    for phase in ("train", "eval"):
      r = v[phase]
      assert r["tokens_per_step"] == B * T and len(r["s_per_token"]) == 3, (key, phase)
      assert r["steps_per_repeat"] == 1, (key, phase)
      assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, phase)
      ratio = res["ratios"][phase][key]
      assert ratio["tokens_per_sec"] == pytest.approx(
          r["tokens_per_sec"] / variants["xl"][phase]["tokens_per_sec"]
      )
      assert ratio["state_bytes_per_row"] == pytest.approx((cache + store) / cache)
      assert len(r["repeat_cpu_seconds"]) == 3 and r["cpu_tokens_per_sec"] > 0, (key, phase)
      assert ratio["cpu_tokens_per_sec"] == pytest.approx(
          r["cpu_tokens_per_sec"] / variants["xl"][phase]["cpu_tokens_per_sec"]
      )
      assert r["empty_slots_after"] == (0 if s else None), (key, phase)
    assert math.isfinite(v["train"]["last_loss"])
    # XLA:CPU gives a memory analysis; the train step's arguments: parameters, Adam's mu and
    # nu (float32), the memory and the batch.
    assert v["train"]["argument_mib"] * 2**20 >= 3 * 4 * v["n_params"] + B * (cache + store), key
    assert v["eval"]["argument_mib"] * 2**20 >= 4 * v["n_params"] + B * (cache + store), key
    assert v["train"]["temp_mib"] > 0, key


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--memory_sizes=16,30", "error: --memory_sizes=16,30: give store sizes S that are"),
        ("--knn_layer=2", "error: --knn_layer=2 is not one of the 2 layers"),
    ],
)
def test_knn_memory_bad_flags_are_one_error_line(flag, message):
  proc = _run("--smoke", flag)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err
