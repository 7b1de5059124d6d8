"""Smoke tests of the memory benchmarks (benchmarks/memory_variants.py,
knn_memory.py, armt_memory.py, compressive_memory.py): one run each in
``--smoke`` (2 layers or 1, d_model 16, 2x8 heads, d_inner 32, a 64-word
tied softmax; T 8, batch 2) on one CPU device.

Every script, every variant: its train and eval steps timed (tokens/s
positive, the ratios their quotients against XL's), its loss finite, XLA's
arguments of the train step holding at least the parameters, Adam's two
moments, the memory and the batch; then what each variant's label says,
counted by hand (state, parameters; memory_variants.py: the equal state
budget).  No speed is checked.  Bad flags are one error line, exit 2.
"""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: four benchmarks (44 compilations: 4-8 min of CPU time)

T, B, D, H, DH = 8, 2, 16, 2, 8  # every --smoke: segment, batch, d_model, heads x d_head
# Embedding 64 x 16 and softmax bias 64; u and v 2 x 2 x 8 (shared by the layers); per layer:
# q, k, v 16 x 48; output and r_net 16 x 16 each; feed-forward 16 x 32 + 32 + 32 x 16 + 16;
# two layer norms 2 x 32.
XL_PARAMS = lambda n_layer: 1024 + 64 + 32 + n_layer * (768 + 2 * 256 + 1072 + 64)


def _run(script: str, *args):
  """benchmarks/SCRIPT.py with ARGS, on one CPU device (not the suite's simulated ones)."""
  return run_python([REPO / "benchmarks" / f"{script}.py", *args], devices=1, timeout=900)


def _memory_variants(res, proc):
  """Every memory against XL at an equal budget: each variant's state,
  counted from its arrays, is the hand count of the size the budget gives
  it, within the stated tolerance of XL's (and as near as its size setting
  allows: the next size either way is farther); the parameters by hand."""
  # XL M 12; compressive 6 + 6 slots at c 2, max_pool; kNN k 4 at layer -2 (layer 0); ARMT 2
  # tokens; the memory tokens and ARMT at depth 1.
  L, M, K, N_ARMT = 2, 12, 4, 2
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
  # Beyond XL_PARAMS: max_pool nothing; kNN the gate bias and scale per head
  # in every layer; the memory tokens N x D; ARMT its tokens, per layer W_q, W_k D x d_mem,
  # W_v D x D and the gate D + 1.
  xl_params = XL_PARAMS(L)
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
      assert v[phase]["steps_per_repeat"] == 1, (key, phase)
      assert v[phase]["empty_slots_after"] == (0 if key == "knn" else None), (key, phase)


def _knn_memory(res, proc):
  """The kNN memory's stores: each variant's state and parameters are what
  its label says; the stores are full after timing, which with one step per
  repeat and no warm-up (7 segments of 8: 56 entries written) only the
  filling before the warm-up makes true of the 64-entry store."""
  # M 8; stores of 16 and 64 entries at layer -2 (layer 0), k 4.
  L, M, SMALL, LARGE = 2, 8, 16, 64
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
  xl_params = XL_PARAMS(L)
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
      assert v[phase]["empty_slots_after"] == (0 if s else None), (key, phase)


def _armt_memory(res, proc):
  """ARMT against XL and the memory tokens: each variant's state and
  parameters are what its label says; the k = 1 train step's arguments
  hold the window of two segments (the common check), its eval model is its
  k = 0 twin's."""
  # XL M 8; N 2 memory tokens; ARMT d_mem 2 and 4 (d_key 12 and 24); k 1.
  L, M, N = 2, 8, 2
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
  xl_params = XL_PARAMS(L)
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
  for key in (f"tokens_n{N}", f"armt_n{N}_d4"):
    assert variants[key + "_k1"]["eval"]["argument_mib"] == variants[key]["eval"]["argument_mib"]


def _compressive_memory(res, proc):
  """The compressive memory against XL: each variant's memory and parameters
  are what its label says; the timed training step carries the
  reconstruction loss exactly where there is a compressed memory."""
  # 1 layer; M 8, Nc 4, c 2.
  L, M, NC, C = 1, 8, 4, 2
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
  xl_params = XL_PARAMS(L)
  for key, (slots, extra) in want.items():
    v = variants[key]
    assert v["label"] in proc.stdout, key
    assert v["state_shape_LxBxMxD"] == [L, B, slots, D], key
    assert v["state_bytes_per_row"] == L * slots * D * 4, key
    assert v["n_params"] == xl_params + extra, key
    if v["memory"] == "compressive":  # the memory is full after the warm-up: slots compressed
      assert v["train"]["last_recon"] > 0, key
    else:
      assert v["train"]["last_recon"] is None, key


# script -> (its table's header, its own checks, its smoke flags beyond --smoke and --json).
SCRIPTS = {
    "memory_variants": (
        "| variant | depth | params | params vs XL | within 1% | state bytes/row | held |",
        _memory_variants,
        ("--warmup=0", "--min_repeat_s=1e-6"),
    ),
    "knn_memory": (
        "| variant | store S | k | retrieval | params | state KiB/row | state vs XL |",
        _knn_memory,
        ("--warmup=0", "--min_repeat_s=1e-6"),
    ),
    "armt_memory": (
        "| variant | M | N | d_mem | k | params | state KiB/row | state vs XL |",
        _armt_memory,
        ("--warmup=0", "--min_repeat_s=1e-6"),
    ),
    "compressive_memory": (  # a warm-up fills the memory: the timed steps compress
        "| variant | slots Nc+M | range | params | state KiB/row | train tokens/s |",
        _compressive_memory,
        (),
    ),
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_every_variant_is_timed_and_is_what_its_label_says(script, tmp_path):
  header, own_checks, flags = SCRIPTS[script]
  out_json = tmp_path / "out.json"
  proc = _run(script, "--smoke", *flags, f"--json={out_json}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert header in proc.stdout
  res = json.loads(out_json.read_text())
  extra = {"budget"} if script == "memory_variants" else set()
  assert set(res) == {"args", "machine", "variants", "ratios", "device_peak_mib", "table", *extra}
  assert res["machine"]["platform"] == "cpu" and res["machine"]["commit"]
  assert len(res["machine"]["loadavg_end"]) == 3
  variants = {v["key"]: v for v in res["variants"]}
  xl = variants["xl"]
  for key, v in variants.items():
    assert v["label"] in proc.stdout, key
    state = v["state_bytes_per_row"]
    for phase in ("train", "eval"):
      r, ratio = v[phase], res["ratios"][phase][key]
      assert r["tokens_per_step"] == B * T and len(r["s_per_token"]) == 3, (key, phase)
      assert math.isfinite(r["tokens_per_sec"]) and r["tokens_per_sec"] > 0, (key, phase)
      assert len(r["repeat_cpu_seconds"]) == 3 and r["cpu_tokens_per_sec"] > 0, (key, phase)
      for name in ("tokens_per_sec", "cpu_tokens_per_sec", "temp_mib"):
        assert ratio[name] == pytest.approx(r[name] / xl[phase][name]), (key, phase, name)
      assert ratio["state_bytes_per_row"] == pytest.approx(state / xl["state_bytes_per_row"])
    assert math.isfinite(v["train"]["last_loss"]), key
    assert v["train"]["temp_mib"] > 0, key
    # XLA:CPU's memory analysis: the train step's arguments are the parameters, Adam's mu and
    # nu (float32), the memory and the batch (inputs, targets, weights of depth + 1 segments).
    batch = B * (v.get("mem_backprop_depth", 0) + 1) * T * 12
    assert v["train"]["argument_mib"] * 2**20 >= 12 * v["n_params"] + B * state + batch, key
    assert v["eval"]["argument_mib"] * 2**20 >= 4 * v["n_params"] + B * state, key
  own_checks(res, proc)


@pytest.mark.parametrize(
    "script, flag, message",
    [
        ("memory_variants", "--cmem_len=12", "error: --cmem_len=12: the compressive memory's M=12"),
        (
            "memory_variants",
            "--mem_backprop_depth=0",
            "error: --mem_backprop_depth=0: the memory tokens and ARMT",
        ),
        ("knn_memory", "--memory_sizes=16,30", "error: --memory_sizes=16,30: give store sizes S"),
        ("knn_memory", "--knn_layer=2", "error: --knn_layer=2 is not one of the 2 layers"),
        ("armt_memory", "--d_mem=0,4", "error: --d_mem=0,4: give a comma list of integers >= 1."),
        ("armt_memory", "--num_mem_tokens=", "error: --num_mem_tokens=: give a comma list"),
        ("armt_memory", "--mem_backprop_depth=-1", "error: --mem_backprop_depth=-1: must be >= 0"),
        ("compressive_memory", "--ratios=3", "error: --ratios=3: give compression rates"),
    ],
)
def test_bad_flags_are_one_error_line(script, flag, message):
  proc = _run(script, "--smoke", flag)
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err
