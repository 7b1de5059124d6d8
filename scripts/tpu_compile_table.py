"""The table of ``results/tpu_compile/*.json`` (``python -m transformer_xl.compile``'s output).

    python scripts/tpu_compile_table.py results/tpu_compile > results/tpu_compile/TABLE.md

One row per config, slice, attention and step: GiB per device and the
verdict, the setting that fits, collectives per step, FLOPs, the roofline
ceiling and the compile time; a run that did not finish is listed with the
last line of its log.
"""

from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from transformer_xl.compile import report  # noqa: E402


def rows(folder: str) -> list[str]:
  out = [
      "| run | slice (topology) | mesh | attention | step | GiB per device | verdict "
      "| what makes it fit | collectives per step | TFLOP per device | ceiling ms (bound) "
      "| MFU <= | compile s |",
      "|---|---|---|---|---|---:|---|---|---|---:|---:|---:|---:|",
  ]
  for log in sorted(glob.glob(os.path.join(folder, "*.log"))):
    name = os.path.basename(log)[: -len(".log")]
    path = os.path.join(folder, name + ".json")
    if not os.path.exists(path):
      with open(log, encoding="utf-8", errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith(("W0", "I0", "E0"))]
      last = lines[-1][:200].replace("|", "/") if lines else "(empty log)"
      out.append(f"| {name} | | | | | | not compiled | {last} | | | | | |")
      continue
    with open(path, encoding="utf-8") as f:
      r = json.load(f)
    mesh = "(" + ", ".join(f"{k} {v}" for k, v in r["mesh"].items()) + ")"
    hbm = r["chip"]["hbm_gib"]
    for step, s in r["steps"].items():
      rep, counts, ceil = s["as_configured"], s["as_configured"].get("counts"), s["roofline"]
      if counts is None:  # refused by the compiler as larger than HBM
        out.append(
            f"| {name} | {r['slice']} ({r['topology']}) | {mesh} | {r['attention_impl']} | {step} "
            f"| >= {rep['total_bytes'] / 2**30:.2f} of {hbm:g} | {s['verdict']} "
            f"| {report.fix_text(s, r['margin']).replace('|', '/')} | | | | | "
            f"{rep['compile_seconds']:.0f} |"
        )
        continue
      coll = ", ".join(
          f"{op} {int(c['count'])} ({c['bytes'] / 2**20:.0f} MiB)"
          for op, c in counts["collectives"].items()
          if c["count"]
      )
      mfu = f"{100 * s['max_mfu']:.0f}%" if "max_mfu" in s else ""
      out.append(
          f"| {name} | {r['slice']} ({r['topology']}) | {mesh} | {r['attention_impl']} | {step} "
          f"| {rep['total_bytes'] / 2**30:.2f} of {hbm:g} | {s['verdict']} "
          f"| {report.fix_text(s, r['margin']).replace('|', '/')} | {coll or 'none'} "
          f"| {counts['matmul_flops'] / 1e12:.3g} | {ceil['bound_seconds'] * 1e3:.3g} "
          f"({ceil['bound']}) | {mfu} | {rep['compile_seconds']:.0f} |"
      )
  return out


if __name__ == "__main__":
  print("\n".join(rows(sys.argv[1] if len(sys.argv) > 1 else "results/tpu_compile")))
