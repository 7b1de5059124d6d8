"""Smoke test of benchmarks/memory_variants.py: every memory against XL at an equal budget."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: the benchmarks (10 compilations: about 40 s of CPU time)

SCRIPT = REPO / "benchmarks" / "memory_variants.py"
# --smoke: 2 layers, d_model 16, 2x8 heads, d_inner 32, a 64-word tied softmax; T 8, batch 2;
# XL M 12; compressive 6 + 6 slots at c 2, max_pool; kNN k 4 at layer -2 (layer 0); ARMT 2
# tokens; the memory tokens and ARMT at depth 1.
L, D, H, DH, T, B, M, K, N_ARMT = 2, 16, 2, 8, 8, 2, 12, 4, 2


def _run(*args):
  """The benchmark script with ARGS, on one CPU device (not the suite's simulated ones)."""
  return run_python([SCRIPT, *args], devices=1, timeout=900)


def test_memory_variants_smoke_equal_budget_every_variant_timed(tmp_path):
  """Every variant's train and eval steps timed (tokens/s positive, the
  ratios their quotients against XL's); each variant's state, counted from
  its arrays, is the hand count of the size the budget gives it, within the
  stated tolerance of XL's (and as near as its size setting allows: the
  next size either way is farther); the parameters are counted by hand;
  XLA's arguments hold at least the parameters, Adam's moments and the
  state.  No speed is checked."""
  out_json = tmp_path / "mv.json"
  proc = _run("--smoke", "--warmup=0", "--min_repeat_s=1e-6", f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "| variant | depth | params | params vs XL | within 1% | state bytes/row | held |" in (
      proc.stdout
  )
  res = json.loads(out_json.read_text())
  assert set(res) == {
      "args",
      "machine",
      "budget",
      "variants",
      "ratios",
      "device_peak_mib",
      "table",
  }
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  variants = {v["key"]: v for v in res["variants"]}
  assert list(variants) == ["xl", "compressive", "knn", "tokens", "armt"]

  # The budget: XL's cache, M x D float32 in each of the L layers, per row.
  xl_bytes = L * M * D * 4
  # kNN: an entry is keys and values over the heads, 2 H Dh float32 (128 bytes): 12 entries
  # (3 groups of k) hold the budget at the one layer, plus the int32 write index.
  entry = 2 * H * DH * 4
  s = xl_bytes // entry
  assert s % K == 0
  # Memory tokens: one set of N x D float32 for the whole model, N = L M, and a bool.
  n_tokens = L * M
  # ARMT: per layer A (d_key x D) and z (d_key) float32 and a bool; d_key = 6 d_mem: d_mem 2
  # (d_key 12, 817 bytes a layer) is nearest to M D 4 = 768 (d_mem 1: 409, d_mem 3: 1,225).
  armt_layer = lambda d_key: d_key * (D + 1) * 4 + 1
  assert [armt_layer(6 * d) for d in (1, 2, 3)] == [409, 817, 1225]
  d_mem, d_key = 2, 12
  mems = lambda slots: {"mems_LxBxMxD": {"shape": [L, B, slots, D], "dtype": "float32"}}
  # key -> (model.memory, mem_len, depth, leaves {name: (shape, dtype)}, bytes per row, the
  # stated tolerance: half a step of its size setting plus its flags and indices).
  want = {
      "xl": ("xl", M, 0, mems(M), xl_bytes, 0),
      "compressive": ("compressive", M // 2, 0, mems(M), xl_bytes, 0),
      "knn": (
          "knn",
          0,
          0,
          {
              **mems(0),
              "knn_keys_NxBxHxSxDh": {"shape": [1, B, H, s, DH], "dtype": "float32"},
              "knn_values_NxBxHxSxDh": {"shape": [1, B, H, s, DH], "dtype": "float32"},
              "knn_index_NxB": {"shape": [1, B], "dtype": "int32"},
          },
          s * entry + 4,
          K // 2 * entry + 4,
      ),
      "tokens": (
          "xl",
          0,
          1,
          {
              **mems(0),
              "mem_tokens_BxNxD": {"shape": [B, n_tokens, D], "dtype": "float32"},
              "mem_tokens_fresh_B": {"shape": [B], "dtype": "bool"},
          },
          n_tokens * D * 4 + 1,
          1,
      ),
      "armt": (
          "armt",
          0,
          1,
          {
              **mems(0),
              "armt_A_LxBxKxD": {"shape": [L, B, d_key, D], "dtype": "float32"},
              "armt_z_LxBxK": {"shape": [L, B, d_key], "dtype": "float32"},
              "armt_first_LxB": {"shape": [L, B], "dtype": "bool"},
          },
          L * armt_layer(d_key),
          L * (3 * (D + 1) * 4 + 1),
      ),
  }
  # The next size either way is farther from the budget: N +- 1 token, S +- k entries.
  assert abs(L * armt_layer(d_key) - xl_bytes) < abs(L * armt_layer(d_key + 6) - xl_bytes)
  assert abs(L * armt_layer(d_key) - xl_bytes) < abs(L * armt_layer(d_key - 6) - xl_bytes)
  assert res["budget"] == {
      "xl_bytes": xl_bytes,
      "num_mem_tokens": n_tokens,
      "memory_size": s,
      "d_mem": d_mem,
      "d_key": d_key,
  }
  # Embedding 64 x 16 and softmax bias 64; u and v 2 x 2 x 8 (shared by the layers); per layer:
  # q, k, v 16 x 48; output and r_net 16 x 16 each; feed-forward 16 x 32 + 32 + 32 x 16 + 16;
  # two layer norms 2 x 32.  Beyond it: max_pool nothing; kNN the gate bias and scale per head
  # in every layer; the memory tokens N x D; ARMT its tokens, per layer W_q, W_k D x d_mem,
  # W_v D x D and the gate D + 1.
  xl_params = 1024 + 64 + 32 + L * (768 + 2 * 256 + 1072 + 64)
  extra = {
      "xl": 0,
      "compressive": 0,
      "knn": 2 * H * L,
      "tokens": n_tokens * D,
      "armt": N_ARMT * D + L * (2 * D * d_mem + D * D + D + 1),
  }
  for key, (memory, mem_len, depth, leaves, state, tolerance) in want.items():
    v = variants[key]
    assert v["label"] in proc.stdout, key
    assert (v["memory"], v["mem_len"], v["mem_backprop_depth"]) == (memory, mem_len, depth), key
    assert {
        k: {"shape": x["shape"], "dtype": x["dtype"]} for k, x in v["state_leaves"].items()
    } == (leaves), key
    assert v["state_bytes_per_row"] == state == v["eval_state_bytes_per_row"], key
    assert v["state_bytes_per_row"] == v["planned_bytes_per_row"], key  # the formula's
    assert v["budget_tolerance_bytes"] == tolerance, key
    assert abs(state - xl_bytes) <= tolerance, key
    assert v["state_vs_xl"] == pytest.approx(state / xl_bytes - 1), key
    assert v["state_bytes_per_row_per_layer"] == pytest.approx(state / L), key
    assert v["n_params"] == xl_params + extra[key], key
    assert v["params_vs_xl"] == pytest.approx(extra[key] / xl_params), key
    assert v["params_within_1pct"] == (extra[key] <= 0.01 * xl_params), key
    for phase in ("train", "eval"):
      r = v[phase]
      assert r["tokens_per_step"] == B * T and len(r["s_per_token"]) == 3, (key, phase)
      assert r["steps_per_repeat"] == 1, (key, phase)
      assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, phase)
      assert r["cpu_tokens_per_sec"] > 0, (key, phase)
      ratio, ref = res["ratios"][phase][key], variants["xl"][phase]
      assert ratio["tokens_per_sec"] == pytest.approx(r["tokens_per_sec"] / ref["tokens_per_sec"])
      assert ratio["cpu_tokens_per_sec"] == pytest.approx(
          r["cpu_tokens_per_sec"] / ref["cpu_tokens_per_sec"]
      )
      assert ratio["temp_mib"] == pytest.approx(r["temp_mib"] / ref["temp_mib"])
      assert ratio["state_bytes_per_row"] == pytest.approx(state / xl_bytes)
      assert r["empty_slots_after"] == (0 if key == "knn" else None), (key, phase)
    assert math.isfinite(v["train"]["last_loss"]), key
    # The train step's arguments: parameters, Adam's mu and nu (float32), the memory and the
    # batch (inputs, targets, weights of depth + 1 segments).
    batch = B * (depth + 1) * T * 12
    assert v["train"]["argument_mib"] * 2**20 >= 12 * v["n_params"] + B * state + batch, key
    assert v["eval"]["argument_mib"] * 2**20 >= 4 * v["n_params"] + B * state, key


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--cmem_len=12", "error: --cmem_len=12: the compressive memory's M=12 slots are"),
        ("--mem_backprop_depth=0", "error: --mem_backprop_depth=0: the memory tokens and ARMT"),
    ],
)
def test_memory_variants_bad_flags_are_one_error_line(flag, message):
  proc = _run("--smoke", flag)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err
