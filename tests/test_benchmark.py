"""Smoke test of benchmarks/vs_pytorch.py: tiny sizes, both implementations, the table.

Runs the script in a subprocess (it starts one subprocess per
implementation itself) and checks that it exits 0, prints the markdown table
with both columns and a ratio, equal parameter counts, and writes --json.
It does not check speed.  Needs torch and transformers (in the ``test``
extra; required, not skipped).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "vs_pytorch.py"

TINY = ["--n_layer=1", "--d_model=32", "--n_head=2", "--d_head=16", "--d_inner=64",
        "--vocab=32", "--batch=2", "--tgt_len=8", "--mem_len=8", "--eval_tgt_len=8",
        "--eval_mem_len=16", "--steps=2", "--repeats=1", "--warmup=1"]


def test_benchmark_runs_and_prints_table(tmp_path):
  out_json = tmp_path / "bench.json"
  proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, f"--json={out_json}"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = proc.stdout
  assert "| phase | ours tokens/s | PyTorch tokens/s | ratio ours/PyTorch |" in out, out
  for phase in ("train", "eval"):
    row = next((line for line in out.splitlines() if line.startswith(f"| {phase} (")), None)
    assert row is not None, out
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert re.fullmatch(r"[\d,]+", cells[1]) and re.fullmatch(r"[\d,]+", cells[2]), row
    assert re.fullmatch(r"\d+\.\d\dx", cells[3]), row
  assert re.search(r"parameters: ours [\d,]+, pytorch [\d,]+ \(equal\)", out), out
  assert "load average" in out

  res = json.loads(out_json.read_text())
  assert set(res["results"]) == {"ours", "pytorch"}
  for w in ("ours", "pytorch"):
    for phase in ("train", "eval"):
      assert res["results"][w][phase]["median_tokens_per_sec"] > 0
  assert res["machine"]["versions"]["transformers"] == "4.35.2"
