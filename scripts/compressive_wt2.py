r"""Compressive memory (Rae et al. 2020) against Transformer-XL at small scale on WikiText-2.

    python scripts/compressive_wt2.py [--out=results/compressive_wt2] \
        [--workdirs=workdirs/compressive_wt2] [--manual_dir=DIR] [--data_dir=DIR] \
        [--quick] [--report_only]

Every variant is the ablation study's Transformer-XL (``configs/ablation_wt2.py:xl``:
4 layers, d_model 128, 2.4M parameters, tgt_len 32, 2,000 steps of batch 16,
the same seed) with another memory:

  xl_m32     Transformer-XL, mem_len 32 (the ablation's model)
  cmp_c2     mem_len 32 + 32 compressed slots at c = 2 (1D conv, attention-
             reconstruction loss): temporal range 32 + 2*32 = 96 per layer
  cmp_c4     the same at c = 4: range 32 + 4*32 = 160
  xl_m64     Transformer-XL with the compressive models' attention cost (64 keys of memory)
  xl_m96     Transformer-XL with cmp_c2's range
  xl_m160    Transformer-XL with cmp_c4's range
  cmp_c2_max cmp_c2 with max-pooling: no compression network, no
             reconstruction loss (what the learned compression adds or costs)

(Rae et al. 2020, Sec. 3.3: range l x (n_m + c n_cm) at the attention cost of
n_m + n_cm memory slots.)  Each is evaluated as trained (eval tgt_len 32, the
training memory, no same_length: every query sees the memory plus its own
causal prefix) on the valid and test splits.  The cost of each memory is
measured separately, as ratios in one run, by ``benchmarks/compressive_memory.py``.

Writes ``results.json`` (every number, the commands, wall times, the machine)
and ``REPORT.md`` into ``--out``; a hand-written ``FINDINGS.md`` there is left
alone and linked.  Trained workdirs are kept in ``--workdirs`` and reused (a
rerun resumes).  ``--quick``: a tiny model and a few steps, for the tests;
its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reproduce_wt2's helpers (machine, _run, _shown)
import reproduce_wt2 as study  # noqa: E402

CONFIG = REPO / "configs" / "ablation_wt2.py"

# variant -> (memory, mem_len, cmem_len, cmem_ratio, what it matches)
VARIANTS: dict[str, tuple[str, int, int, int, str]] = {
    "xl_m32": ("xl", 32, 0, 1, "the baseline"),
    "cmp_c2": ("compressive", 32, 32, 2, "range 96, 64 memory keys"),
    "cmp_c4": ("compressive", 32, 32, 4, "range 160, 64 memory keys"),
    "xl_m64": ("xl", 64, 0, 1, "the compressive models' 64 memory keys"),
    "xl_m96": ("xl", 96, 0, 1, "cmp_c2's range"),
    "xl_m160": ("xl", 160, 0, 1, "cmp_c4's range"),
    # No compression network (so no reconstruction-loss gradient): is the
    # learned compression, or the compressed slots themselves, what costs?
    "cmp_c2_max": ("compressive", 32, 32, 2, "cmp_c2 with max-pooling"),
}

QUICK = [
    "--config.model.n_layer=2",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.d_head=16",
    "--config.model.d_inner=32",
    "--config.model.cutoffs=(8, 16)",
    "--config.train.num_steps=3",
    "--config.train.warmup_steps=1",
    "--config.train.log_every=1",
    "--config.train.eval_every=0",
    "--config.train.global_batch=8",
    "--config.eval.global_batch=8",
]


def variant_flags(name: str) -> list[str]:
  """The config overrides of ``name`` on top of ablation_wt2.py:xl, its
  evaluation as trained included."""
  memory, mem_len, cmem_len, ratio, _ = VARIANTS[name]
  flags = [
      f"--config.model.mem_len={mem_len}",
      f"--config.eval.mem_len={mem_len}",
      "--config.eval.tgt_len=32",
      "--config.eval.same_length=False",
  ]
  if memory == "compressive":
    flags += [
        "--config.model.memory=compressive",
        f"--config.model.compressive.cmem_len={cmem_len}",
        f"--config.model.compressive.cmem_ratio={ratio}",
        f"--config.model.compressive.cmem_fn={'max_pool' if name.endswith('_max') else 'conv'}",
    ]
  return flags


def run_variant(name: str, workdirs: Path, data: list[str], extra: list[str], logs: Path) -> dict:
  """Trains (resuming) and evaluates one variant; its numbers."""
  workdir = workdirs / name
  base = [sys.executable, "-m", "transformer_xl.main", f"--config={CONFIG}:xl"]
  train = [*base, f"--workdir={workdir}", *data, *variant_flags(name), *extra]
  train_s = study._run(train, logs / f"train_{name}.log")
  evaluate = [*train, "--mode=eval"]
  eval_s = study._run(evaluate, logs / f"eval_{name}.log")
  results = json.loads((workdir / "eval_results.json").read_text())
  n_params = None
  for line in (logs / f"train_{name}.log").read_text().splitlines():
    if line.startswith("Model:"):
      n_params = int(line.split()[1].replace(",", ""))
  aux = []
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    rec = json.loads(line)
    if "train/aux_loss/attn_recon" in rec:
      aux.append([rec.get("step"), rec["train/aux_loss/attn_recon"]])
  memory, mem_len, cmem_len, ratio, matches = VARIANTS[name]
  return {
      "memory": memory,
      "mem_len": mem_len,
      "cmem_len": cmem_len,
      "cmem_ratio": ratio,
      "cmem_fn": "max_pool" if name.endswith("_max") else "conv",
      "range": mem_len + ratio * cmem_len,
      "memory_keys": mem_len + cmem_len,
      "matches": matches,
      "n_params": n_params,
      "valid_ppl": results["valid"]["ppl"],
      "test_ppl": results["test"]["ppl"],
      "attn_recon": aux,
      "train_command": study._shown(train),
      "eval_command": study._shown(evaluate),
      "train_wall_s": train_s,
      "eval_wall_s": eval_s,
  }


def report(res: dict[str, Any], out: Path) -> str:
  """REPORT.md from ``results.json``'s contents."""
  m = res["machine"]
  lines = [
      f"Measured on {res['date']} with `{res['command']}` on {m['cpu']} ({m['cores']} cores, "
      f"CPU only), jax {m['jax']}; total wall time {res['wall_s'] / 60:.0f} min.  Every number "
      "below is in `results.json`."
      + ("  **--quick run: the numbers mean nothing.**" if res["quick"] else ""),
      "",
      "Every model is `configs/ablation_wt2.py:xl` (4 layers, d_model 128, tgt_len 32, 2,000 "
      "steps of batch 16, seed 1111) with another memory; evaluated as trained (eval tgt_len "
      "32, the training memory, no same_length) on WikiText-2.  Range: how many past positions "
      "a layer can reach (Rae et al. 2020, Sec. 3.3: n_m + c n_cm); memory keys: what each "
      "query attends over besides its segment (the attention cost).",
      "",
      "| variant | memory | mem_len | cmem_len | c | cmem_fn | range | memory keys | parameters "
      "| valid ppl | test ppl | train wall | eval wall |",
      "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for name, r in res["variants"].items():
    lines.append(
        f"| {name} | {r['memory']} | {r['mem_len']} | {r['cmem_len']} | "
        f"{r['cmem_ratio'] if r['memory'] == 'compressive' else '-'} | "
        f"{r.get('cmem_fn', 'conv') if r['memory'] == 'compressive' else '-'} | {r['range']} | "
        f"{r['memory_keys']} | {r['n_params']:,} | {r['valid_ppl']:.2f} | {r['test_ppl']:.2f} | "
        f"{r['train_wall_s'] / 60:.1f} min | {r['eval_wall_s'] / 60:.1f} min |"
    )
  notes = [(name, r["note"]) for name, r in res["variants"].items() if r.get("note")]
  if notes:
    lines += [""] + [f"- {name}: {note}" for name, note in notes]
  lines += [
      "",
      "Wall times are of a machine shared with other jobs: they are not the cost of the "
      "memories (see `benchmarks/compressive_memory.py` and its section in "
      "`benchmarks/results/REPORT.md` for step times and memory as ratios in one run).",
      "",
      "Attention-reconstruction loss (summed over layers, logged every 100 steps) of the "
      "compressive models, first and last logged value:",
      "",
  ]
  for name, r in res["variants"].items():
    if r["attn_recon"]:
      (s0, a0), (s1, a1) = r["attn_recon"][0], r["attn_recon"][-1]
      lines.append(f"- {name}: {a0:.4g} at step {s0} -> {a1:.4g} at step {s1}")
  lines += ["", "Commands (each variant trained, then evaluated with `--mode=eval`):", ""]
  for name, r in res["variants"].items():
    lines.append(f"- {name}: `{r['train_command']}`")
  if (out / "FINDINGS.md").exists():
    lines += ["", "What this shows and what it does not, by hand: [FINDINGS.md](FINDINGS.md)."]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(REPO / "results" / "compressive_wt2"))
  p.add_argument("--workdirs", default=str(REPO / "workdirs" / "compressive_wt2"))
  p.add_argument("--manual_dir", default=str(REPO.parent / "shared" / "data" / "wikitext-2"))
  p.add_argument("--data_dir", default=None, help="tfds data dir (default: tfds's)")
  p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
  p.add_argument("--quick", action="store_true", help="a smoke run: tiny model, 3 steps")
  p.add_argument("--report_only", action="store_true", help="REPORT.md from results.json")
  p.add_argument(
      "--reuse", action="store_true", help="keep the variants already in --out's results.json"
  )
  a = p.parse_args(argv)
  out, workdirs = Path(a.out), Path(a.workdirs)
  out.mkdir(parents=True, exist_ok=True)
  if a.report_only:
    res = json.loads((out / "results.json").read_text())
    (out / "REPORT.md").write_text(report(res, out))
    return 0
  names = [n for n in a.variants.split(",") if n]
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    print(f"error: unknown variants {unknown}; choose from {list(VARIANTS)}.", file=sys.stderr)
    return 1
  logs = out / "logs"
  logs.mkdir(exist_ok=True)
  workdirs.mkdir(parents=True, exist_ok=True)
  data = [f"--config.data.manual_dir={a.manual_dir}"]
  if a.data_dir:
    data.append(f"--config.data.data_dir={a.data_dir}")
  t0 = study._now()
  res: dict[str, Any] = {
      "command": "python scripts/compressive_wt2.py " + " ".join(argv or sys.argv[1:]),
      "date": datetime.date.today().isoformat(),
      "quick": a.quick,
      "machine": study.machine(),
      "variants": {},
  }
  done = {}
  if a.reuse and (out / "results.json").exists():
    done = json.loads((out / "results.json").read_text())["variants"]
  for name in names:
    if name in done:  # --reuse: trained and evaluated by an earlier run of this script
      res["variants"][name] = done[name]
      continue
    res["variants"][name] = run_variant(name, workdirs, data, QUICK if a.quick else [], logs)
    res["wall_s"] = study._now() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"{name}: valid {res['variants'][name]['valid_ppl']:.2f}, "
        f"test {res['variants'][name]['test_ppl']:.2f}",
        flush=True,
    )
  (out / "REPORT.md").write_text(report(res, out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
