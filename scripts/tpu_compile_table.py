"""The report of ``results/tpu_compile/*.json`` (``python -m transformer_xl.compile``'s output).

    bash scripts/tpu_compile_table.sh          # compiles what is missing (hours on 2 cores)
    python scripts/tpu_compile_table.py results/tpu_compile > results/tpu_compile/REPORT.md

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
  names = {
      os.path.splitext(os.path.basename(f))[0]
      for f in glob.glob(os.path.join(folder, "*.log")) + glob.glob(os.path.join(folder, "*.json"))
  }
  for name in sorted(names):
    log, path = os.path.join(folder, name + ".log"), os.path.join(folder, name + ".json")
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


HEADER = """# Every config compiled for its slice by the TPU compiler, on a CPU machine

What `python -m transformer_xl.compile` says of each config's train and eval
steps (the real steps, the config's mesh and shardings, nothing executed, no
accelerator): on its slice preset and on one v5e and one v5p slice of a
similar size (v5e-256 and v5p-128 for the 24-layer and large models,
v5e-8/v5e-4 and v5p-8 for those of a v4-8, v5e-32 and v5p-32 for
compressive_enwik8, v5e-256 and v5p-256 for lm1b_large; the preset rule's
mesh for their device count, `presets.shard_over`), and the paper's on H100s;
the XLA attention and the fused Pallas kernel side by side (the Pallas rows
with `model.dropatt=0`: the kernel has no dropatt, and a training step with
dropatt > 0 takes the XLA path).  Made by `scripts/tpu_compile_table.sh`
(the commands, one JSON and one log per row here) and
`scripts/tpu_compile_table.py` (this page).

- Compiled with {compilers}; jax {jax}; on {machine} ({date}).  Compile
  times are those of a 2-core CPU VM running two or three compiles at once:
  minutes per large config.
- GiB per device: XLA's buffer assignment (arguments + outputs - aliased +
  temporaries + code) against the chip's HBM (`transformer_xl/compile/chips.py`);
  FITS below 90%.  A step the TPU compiler refused as larger than HBM shows
  ">=": its temporaries from the compiler's message plus the arguments.
- TFLOP per device and bytes (behind the ceiling): counted in the compiled
  program, every loop body as often as it runs (XLA's own cost analysis
  counts the scan over layers once); the Pallas kernels' FLOPs are those
  they declare (`pl.CostEstimate`).
- Ceiling: the roofline bound max(FLOPs / peak, bytes / HBM bandwidth) per
  device and the MFU it allows (model FLOPs, `compile/flops.py`).  **A
  ceiling, not a measurement**: no step here has run on a TPU or a GPU.
- Not compiled: the rows the table lists as such, with the last line of
  their log (a config a variant refuses, e.g. memory tokens with the fused
  kernel, or a run not finished when this page was made).

"""


def header(folder: str) -> str:
  """The page's preamble, with the compilers, versions, machine and date of the runs."""
  runs = []
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    with open(path, encoding="utf-8") as f:
      runs.append(json.load(f))
  compilers = sorted(
      {
          f"libtpu {r['versions'].get('libtpu')}" if r["chip"].get("platform", "tpu") == "tpu"
          else "XLA:GPU (jax's CUDA 12 plugin)"
          for r in runs
      }
  )  # fmt: skip
  dates = sorted(r["date"][:10] for r in runs)
  return HEADER.format(
      compilers=", ".join(compilers) or "-",
      jax=runs[0]["versions"]["jax"] if runs else "-",
      machine=(
          f"{runs[-1]['machine'].get('cpu', 'a CPU VM')}, {runs[-1]['machine']['cpu_count']} CPUs"
          if runs
          else "-"
      ),
      date=f"{dates[0]} to {dates[-1]}" if dates else "-",
  )


def pending(folder: str) -> list[str]:
  """The runs of ``scripts/tpu_compile_table.sh`` with neither a JSON nor a log here."""
  import re  # noqa: PLC0415

  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tpu_compile_table.sh")
  with open(script, encoding="utf-8") as f:
    names = re.findall(r'run "([^"]+)"', f.read())
  out = []
  for name in names:
    for impl in ("xla", "pallas") if "$impl" in name else ("",):
      n = name.replace("$impl", impl)
      if not any(os.path.exists(os.path.join(folder, n + ext)) for ext in (".json", ".log")):
        out.append(n)
  return out


if __name__ == "__main__":
  folder = sys.argv[1] if len(sys.argv) > 1 else "results/tpu_compile"
  todo = pending(folder)
  print(header(folder) + "\n".join(rows(folder)))
  if todo:
    print(
        "\nNot compiled yet (the script compiles what is missing when run again): "
        + ", ".join(f"`{n}`" for n in todo)
        + "."
    )
