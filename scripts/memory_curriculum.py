r"""The memories at work: the ARMT authors' associative-retrieval curriculum at a CPU's scale.

    python scripts/memory_curriculum.py [--out=results/memory_curriculum] \
        [--workdirs=workdirs/memory_curriculum] [--runs=armt:1,tokens:1,...] \
        [--jobs=2] [--quick] [--report_only]

Each run is ``configs/armt_retrieval.py:<variant>`` (the authors' recipe of
``scripts/associative_retrieval/finetune_amt_ar-value_cur.sh`` in
RodkinIvan/associative-recurrent-memory-transformer on this package's
backbone: 4 layers, 4 heads, d_model 128; one key-value pair per segment
of 4 tokens; AdamW 3e-4, weight decay 1e-3, linear schedule with a tenth
warmup, gradient values clipped at 1; ``--vary_n_segments``; one optimizer
step per batch of 64 whole examples for every memory) trained through the
first four stages of their curriculum, 1, 2, 3 and 5 pairs (keys of one
symbol of 16; theirs go on to 10, 20, 40, 50 and 200), each stage from the
last one's weights with a fresh optimizer (``train.curriculum``), cut to a
CPU's budget:

* a stage's budget is ``STAGES``' (600 or 800 steps of 64 examples; theirs
  2,000 to 10,000 of 512), ended early once the validation's
  ``answer_accuracy`` (the value and the end token right, greedy) reaches
  0.9 (theirs 1.0) or after ``PATIENCE`` validations without a new best
  (theirs 30), a validation every 50 steps on 200 examples;
* 10,000 training examples per stage (theirs 1,000,000).

The variants (``--runs``: ``variant:seed``, seeds 1 and 2 for armt and
tokens by default): armt, tokens (RMT's 4 memory tokens, as many as ARMT's), tokens32 (their RMT
script's 32), xl (a cache of
one segment: it reaches the last pair only), xl_bytes (387 cached states
per layer, ARMT's state in numbers: it reaches every pair of these stages),
knn (a store of 1,024 per head at layer 3 beside a one-segment cache) and
none.

A run's training ends with the final model evaluated at every stage
(``W/eval_results.json``: the capacity curve); this script adds each
stage's best validation during its own training (``stages/NN/metrics.jsonl``)
and its compute (``stage_done.json``: steps, examples, seconds), then
writes ``results.json`` and ``REPORT.md`` into ``--out`` (a hand-written
``FINDINGS.md`` there is left alone and linked).  Finished runs are reused
(the curriculum skips finished stages and resumes a stopped one exactly):
run it again after an interruption.  ``--jobs`` runs at once (2: one per
core of a 2-core machine), each with one XLA thread (``THREADS``).  ``--quick``: two stages of 4 steps, for the
tests; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reproduce_wt2's helpers (machine, _run, _shown)
import reproduce_wt2 as study  # noqa: E402

_spec = importlib.util.spec_from_file_location("armt_retrieval", REPO / "configs/armt_retrieval.py")
recipe = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(recipe)  # type: ignore[union-attr]

CONFIG = "configs/armt_retrieval.py"
# (pairs, steps): the first four stages of their NUMS_PAIRS with a CPU's budgets.
STAGES = ((1, 600), (2, 600), (3, 600), (5, 800))
QUICK_STAGES = ((1, 4), (2, 4))
TARGET = 0.9
PATIENCE = 10
EVAL_EVERY = 50
VALUES = 16  # a value is one of 16 symbols: chance is 1/16 per answer
RUNS = (
    "armt:1",
    "tokens:1",
    "xl:1",
    "xl_bytes:1",
    "knn:1",
    "none:1",
    "tokens32:1",
    "armt:2",
    "tokens:2",
)
# What each variant keeps across segments (the report's column).
STATE = {
    "armt": "ARMT: 4 memory tokens, d_mem 64 (a 384 x 128 matrix + 384 normalisers per layer)",
    "tokens": "RMT: 4 memory tokens (4 x 128 per layer)",
    "tokens32": "RMT: 32 memory tokens (32 x 128 per layer; their RMT script's)",
    "xl": "XL cache of one segment (4 x 128 per layer): the last pair only",
    "xl_bytes": "XL cache of 387 states (387 x 128 per layer, ARMT's numbers): every pair here",
    "knn": "kNN store of 1,024 per head at layer 3 + a one-segment cache",
    "none": "nothing",
}


def run_flags(variant: str, seed: int, quick: bool) -> list[str]:
  """The overrides of one run (the curriculum and the study's budget)."""
  stages = QUICK_STAGES if quick else STAGES
  curriculum = tuple(recipe.stage(p, 1, n, variant) for p, n in stages)
  flags = [
      f"--config={CONFIG}:{variant}",
      f"--config.train.seed={seed}",
      f"--config.train.curriculum={curriculum!r}",
      f"--config.train.stop_target={TARGET}",
      f"--config.train.stop_patience={PATIENCE}",
      f"--config.train.eval_every={2 if quick else EVAL_EVERY}",
      f"--config.train.log_every={2 if quick else EVAL_EVERY}",
      f"--config.data.synthetic_valid_size={20 if quick else 200}",
      f"--config.data.synthetic_test_size={20 if quick else 500}",
  ]
  if quick:
    flags += ["--config.data.synthetic_train_size=200", "--config.train.global_batch=8"]
  return flags


def stage_history(stage_dir: Path) -> dict[str, Any]:
  """One stage's training: its validations, best accuracy and compute."""
  valid = []
  for line in (stage_dir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if "valid/answer_accuracy" in row:
      valid.append([row["step"], row["valid/answer_accuracy"]])
  done = json.loads((stage_dir / "stage_done.json").read_text())
  best = max(valid, key=lambda r: r[1]) if valid else [None, None]
  return {
      "valid_answer_accuracy": valid,
      "best_valid_answer_accuracy": best[1],
      "best_at_step": best[0],
      "steps": done["step"],
      "ended": done["ended"],
      "examples_seen": done["rows_seen"],
      "train_seconds": done["train_seconds_this_run"],
  }


# One XLA thread per run: runs side by side on a 2-core machine, not threads fighting.
THREADS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _run(cmd: list[str], log_path: Path) -> float:
  """``cmd`` (PYTHONPATH = the repository, one CPU device, ``THREADS``), its
  output into ``log_path``; the wall time in seconds.

  Raises:
    RuntimeError: a non-zero exit (the log's tail in the message).
  """
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.update(XLA_FLAGS=THREADS, JAX_PLATFORMS="cpu")  # a libtpu beside jax would be probed
  start = time.monotonic()
  with open(log_path, "w") as log:
    r = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  if r.returncode:
    tail = "".join(Path(log_path).read_text().splitlines(keepends=True)[-20:])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}); end of {log_path}:\n{tail}")
  return time.monotonic() - start


def run_one(spec: str, quick: bool, workdirs: Path, logs: Path) -> dict:
  """Trains (resuming) one ``variant:seed`` run; its numbers."""
  variant, seed = spec.split(":")
  name = f"{variant}_s{seed}"
  workdir = workdirs / name
  cmd = [sys.executable, "-m", "transformer_xl.main", f"--workdir={workdir}"]
  cmd += run_flags(variant, int(seed), quick)
  wall = _run(cmd, logs / f"train_{name}.log")
  final = json.loads((workdir / "eval_results.json").read_text())["stages"]
  stages = []
  for i, res in enumerate(final):
    stages.append(
        {
            "pairs": res["overrides"]["data.synthetic_num_pairs"],
            **stage_history(workdir / "stages" / f"{i:02d}"),
            "final_model_test_answer_accuracy": res["test"]["answer_accuracy"],
            "final_model_valid_answer_accuracy": res["valid"]["answer_accuracy"],
        }
    )
  return {
      "name": name,
      "variant": variant,
      "seed": int(seed),
      "state": STATE[variant],
      "stages": stages,
      "solved_pairs": solved(stages),
      "command": study._shown(cmd),
      "wall_s_this_run": wall,
  }


def solved(stages: list[dict]) -> int:
  """The most pairs of a stage reached at ``TARGET`` during its training, the
  stages before it reached too (0: none)."""
  most = 0
  for s in stages:
    if (s["best_valid_answer_accuracy"] or 0) < TARGET:
      break
    most = s["pairs"]
  return most


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{100 * x:.0f}%"


def report(res: dict[str, Any], out: Path) -> str:
  """REPORT.md: the capacity table, then each run's stages."""
  runs = res["runs"]
  pairs = [p for p, _ in res["stages"]]
  lines = [
      "# The memories at work: the ARMT authors' associative-retrieval curriculum on 2 CPU cores",
      "",
      f"Made by `python scripts/memory_curriculum.py` ({res['date']}); every number below is in "
      "`results.json`, the commands too. Machine: "
      f"{res['machine']['cpu']}, {res['machine']['cores']} cores, jax {res['machine']['jax']}.",
      "",
      "Their recipe (`configs/armt_retrieval.py`: 4 layers, 4 heads, d_model 128; one key-value "
      "pair per segment of 4 tokens; AdamW 3e-4, weight decay 1e-3, linear schedule, warmup a "
      "tenth, gradient values clipped at 1; `--vary_n_segments`; every memory one optimizer step "
      "per batch of whole examples), cut to a CPU's budget: batch 64 (theirs 512); 10,000 "
      "training examples per stage (theirs 1,000,000); the stages' budgets "
      + ", ".join(f"{p} pair{'s' if p > 1 else ''}: {n} steps" for p, n in res["stages"])
      + " (theirs 2,000 then 10,000 steps); a stage ends early once the validation's "
      f"`answer_accuracy` (value and end token, greedy; 200 examples every {EVAL_EVERY} steps) "
      f"reaches {TARGET} (theirs 1.0) or after {PATIENCE} validations without a new best "
      "(theirs 30). Each stage starts from the last one's weights with a fresh optimizer, as "
      "theirs. Chance: 1 in 16 values.",
      "",
      "## Capacity: the most pairs solved at >= 0.9 (each stage's best validation, the stages "
      "before it solved too)",
      "",
      "| run | what crosses segments | solved pairs | "
      + " | ".join(f"{p} pairs: best valid (step)" for p in pairs)
      + " |",
      "|---|---|---:|" + "---:|" * len(pairs),
  ]
  for r in runs:
    cells = [f"{_pct(s['best_valid_answer_accuracy'])} ({s['best_at_step']})" for s in r["stages"]]
    lines.append(
        f"| {r['name']} | {r['state']} | {r['solved_pairs']} | " + " | ".join(cells) + " |"
    )
  lines += [
      "",
      "## The final model (after the last stage) at every stage's pairs: test answer_accuracy "
      "(500 examples)",
      "",
      "| run | " + " | ".join(f"{p} pairs" for p in pairs) + " |",
      "|---|" + "---:|" * len(pairs),
  ]
  for r in runs:
    cells = [_pct(s["final_model_test_answer_accuracy"]) for s in r["stages"]]
    lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
  lines += [
      "",
      "## Compute per stage: optimizer steps, examples, seconds of training (the stage's last "
      "run), and why it ended",
      "",
      "| run | pairs | steps | examples | seconds | ended |",
      "|---|---:|---:|---:|---:|---|",
  ]
  for r in runs:
    for s in r["stages"]:
      lines.append(
          f"| {r['name']} | {s['pairs']} | {s['steps']} | {s['examples_seen']:,} | "
          f"{s['train_seconds']:.0f} | {s['ended']} |"
      )
  lines += ["", "## Commands", ""]
  lines += [f"- `{r['name']}`: `{r['command']}`" for r in runs]
  if (out / "FINDINGS.md").exists():
    lines += ["", "What these numbers say, and what was checked: [FINDINGS.md](FINDINGS.md)."]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(REPO / "results/memory_curriculum"))
  p.add_argument("--workdirs", default=str(REPO / "workdirs/memory_curriculum"))
  p.add_argument("--runs", default=",".join(RUNS), help="variant:seed,...")
  p.add_argument("--jobs", type=int, default=2)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--report_only", action="store_true")
  args = p.parse_args(argv)
  runs = [r.strip() for r in args.runs.split(",") if r.strip()]
  for r in runs:
    variant, _, seed = r.partition(":")
    if variant not in STATE or not seed.isdigit():
      p.error(f"--runs: {r!r} is not variant:seed with a variant of {', '.join(STATE)}")
  out, workdirs = Path(args.out), Path(args.workdirs)
  out.mkdir(parents=True, exist_ok=True)
  workdirs.mkdir(parents=True, exist_ok=True)
  logs = out / "logs"
  logs.mkdir(exist_ok=True)
  path = out / "results.json"
  if args.report_only:
    res = json.loads(path.read_text())
  else:
    res = {
        "date": datetime.date.today().isoformat(),
        "machine": study.machine(),
        "stages": [list(s) for s in (QUICK_STAGES if args.quick else STAGES)],
        "target": TARGET,
        "patience": PATIENCE,
    }
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      futures = [pool.submit(run_one, r, args.quick, workdirs, logs) for r in runs]
      done = [f.result() for f in futures]
    # Runs of an earlier invocation that this one did not name are kept.
    earlier = json.loads(path.read_text())["runs"] if path.exists() else []
    names = {r["name"] for r in done}
    res["runs"] = [r for r in earlier if r["name"] not in names] + done
    res["runs"].sort(
        key=lambda r: RUNS.index(f"{r['variant']}:{r['seed']}")
        if f"{r['variant']}:{r['seed']}" in RUNS
        else len(RUNS)
    )
    path.write_text(json.dumps(res, indent=2) + "\n")
  text = report(res, out)
  (out / "REPORT.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
