"""Smoke test of benchmarks/eval_speed.py (Dai et al. 2019, Table 9).

Runs the script with ``--smoke`` (a one-layer model, attention lengths 32
and 384) in a subprocess on one CPU device and checks that it prints the
slowdown table with the paper's column, writes --json, that the vanilla
sliding window is slower per token than Transformer-XL's state reuse, and
that the slowdown grows with the attention length (the vanilla model
recomputes a window of L per token, Transformer-XL attends to L cached
states).  Bad input is one error line.
"""

import json
import re

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # tooling: the benchmarks

SCRIPT = REPO / "benchmarks" / "eval_speed.py"


def _run(*args, timeout=180):
  """The benchmark script with ARGS, on one CPU device."""
  return run_python([SCRIPT, *args], devices=1, timeout=timeout)


def test_eval_speed_smoke_slowdown_grows_with_attention_length(tmp_path):
  out_json = tmp_path / "speed.json"
  r = _run("--smoke", f"--json={out_json}")
  assert r.returncode == 0, r.stdout + r.stderr
  assert (
      "| attn len L | Transformer-XL tokens/s" in r.stdout
      and "slowdown (paper, Table 9)" in r.stdout
  ), r.stdout
  table_rows = [l for l in r.stdout.splitlines() if re.match(r"\| [\d,]+ \|", l)]
  assert [row.split("|")[1].strip() for row in table_rows] == ["32", "384"], r.stdout
  assert "3,800: 1,874x" in r.stdout
  res = json.loads(out_json.read_text())
  rows = res["rows"]
  assert [row["attn_len"] for row in rows] == [32, 384]
  assert rows[1]["slowdown"] > 2 * rows[0]["slowdown"], [row["slowdown"] for row in rows]
  for row in rows:
    assert row["mem_len"] == row["attn_len"] - row["tgt_len"] and row["window"] == row["attn_len"]
    assert not row["same_length"]
    assert row["xl"]["tokens_per_step"] == 2 * 8 and row["vanilla"]["tokens_per_step"] == 2
    assert len(row["xl"]["s_per_token"]) == 3
    assert row["slowdown"] > 1.0, row
    assert row["slowdown"] == (
        row["vanilla"]["median_s_per_token"] / row["xl"]["median_s_per_token"]
    )
  assert res["machine"]["platform"] == "cpu"


def test_eval_speed_bad_input():
  r = _run("--smoke", "--attn_lens=8,64")  # the smoke tgt_len is 8: no memory at L = 8
  assert r.returncode == 2
  err = r.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "exceed --tgt_len=8" in err[0]
