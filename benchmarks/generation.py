"""Sampling speed: our ``generate.Generator`` (the memory reused) against
HuggingFace's ``TransfoXLLMHeadModel.generate``, on the same machine in one run.

Run from the repository root::

  python benchmarks/generation.py [--num_tokens=200] [--repeats=3] [--threads=N]
                                  [--grid="128:1,8,32;1600:1,8"] [--json=FILE]
                                  [--compare=OLD.json]
  python benchmarks/generation.py --compare=OLD.json --new=NEW.json  # compare, run nothing
  python benchmarks/generation.py --smoke   # tiny sizes: checks the tool, numbers meaningless

The model (the same sizes and settings for both; default: the quick start's,
``configs/quickstart.py``): 4 layers, d_model 128, 4 heads of 32, d_inner
512, a vocabulary of 10,000 (PTB's) with a plain dense softmax tied to the
embedding (no cutoffs), shared u/v, no dropout, float32, relative
positions unclamped (clamp_len 0 = none, in both), ``same_length`` off.
Parameters are random (only speed is measured, so the two need not be
equal): ours from ``models.init_params`` with ``--seed``, HF's from its own
init.  Ours is the evaluation model of ``Generator`` with tgt_len
``--tgt_len`` (32: the prompt's segment length) and the cell's mem_len; HF's
config has ``mem_len`` = the cell's mem_len, ``same_length=False``,
``clamp_len=0``.

The grid (``--grid``, "MEM_LEN:BATCH,BATCH;..."): batch 1, 8 and 32 with
mem_len 128 (the quick start's evaluation memory) and batch 1 and 8 with
mem_len 1,600 (WikiText-103's evaluation memory).  Every row's prompt is
``--prompt_len`` (64) random token ids, the same for both; ``--num_tokens``
(200) new tokens are drawn with top-k 40 sampling at temperature 1.

How each implementation decodes: ours reads the prompt in segments of
tgt_len that fill the memory, then one pass of length 1 per new token
against the cached memory and the decoding cache (the memory's projected
keys and values), 32 passes per compiled on-device loop
(``generate.Generator``; its module docstring).
HF's ``generate`` reads the whole prompt in one forward pass (its memory
starts as mem_len zero states), then passes the last token with the
previous step's ``mems`` (``prepare_inputs_for_generation`` in
``transformers/models/transfo_xl/modeling_transfo_xl.py``): also one
position per new token against the cached memory.  HF is called with
``do_sample=True, top_k=40, temperature=1.0, max_new_tokens=N,
min_new_tokens=N, pad_token_id=0, eos_token_id=0`` under
``torch.no_grad()`` (so it never stops early; every call's output is
checked to hold N new tokens per row).

Measured per (implementation, batch, mem_len), in this order: one untimed
warm-up call with the same shapes (ours: compilation; its wall seconds are
reported as **warm-up (compile) s**, compilation + one call), one untimed
first-token call, then ``--repeats`` (3) rounds of

* **tokens/s** = batch * num_tokens / wall seconds of one whole call:
  ``Generator.generate(params, prompt, N, SamplingSettings(top_k=40), seed)``
  (returns numpy token ids on the host), and ``model.generate(...)`` as
  above; the prompt's processing is part of the call;
* **first-token latency** (seconds) from the call to the first new token on
  the host: ours, the first item of ``Generator.stream(params, prompt, 1,
  ...)`` (num_tokens 1, so nothing else is queued behind it); HF, the whole
  call ``generate(max_new_tokens=1, min_new_tokens=1)``, timed separately
  (no streamer or stopping criterion).  Both: the prompt's forward pass and
  the first sample.

The median over the repeats is reported (every repeat, min and max go to
the JSON), with each timed call's CPU seconds per wall second (how many
cores it got) and the peak RSS of the cell's subprocess.  The printed table
gives per cell both tokens/s, **ours/HF** tokens/s, whether ours reaches the
target, both first-token latencies and HF/ours (how many times faster ours
gives its first token), and our warm-up (compile) seconds.

The target: ours >= 2x HF's tokens/s at batch 1, 8 and 32 with
mem_len 128 and at batch 1 and 8 with mem_len 1,600, on the same CPU.

Fairness (as ``vs_pytorch.py``): every (implementation, cell) runs in its
own subprocess, so the JAX/XLA and torch thread pools never coexist and
each gets the whole machine; cells run in turn, within a cell ours first
unless ``--order=pytorch_first``; the parent imports neither library.  Both
use ``--threads`` (default: all CPUs this process may run on,
``len(os.sched_getaffinity(0))``): torch via ``torch.set_num_threads``,
XLA:CPU by the CPUs its process may use (below the core count every
subprocess is pinned to the same N CPUs).  Ours runs on one CPU device
(``JAX_PLATFORMS=cpu``), with ``XLA_FLAGS`` = the caller's minus the test
suite's simulated device count, plus ``--xla_flags``, and glibc's huge
pages (``--malloc_hugepages=1``) as ``python -m transformer_xl.main`` sets
them; PyTorch runs in the caller's environment (``--pytorch_malloc_hugepages=1``
gives it the tunable too).

Output: the table, the machine (CPU model, cores, memory, load average
before and after every subprocess), the commit (``git rev-parse HEAD`` and
the files that differ from it) and library versions; a JSON with all of it
and every cell's numbers, by default
``benchmarks/results/generation_<date>_<time>_<host>.json`` (``--smoke``:
a temporary directory).  ``--compare=OLD.json`` prints every number beside
an earlier run's with its change and flags REGRESSION beyond
``--tolerance`` percent (``vs_pytorch_compare.py``); with ``--new=NEW.json``
it compares two saved runs and runs nothing.

Numbers belong in ``benchmarks/results/REPORT.md`` with the command that
produced them, measured on a quiet machine, never estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py and the parts below, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
from vs_pytorch_compare import compare_runs, load_json  # noqa: E402

import common  # noqa: E402
import generation_workers as workers  # noqa: E402  (nothing heavy at import)

REPO = common.REPO
IMPLEMENTATIONS = ("ours", "pytorch")  # "pytorch": HuggingFace's TransfoXLLMHeadModel
LABELS = {"ours": "ours", "pytorch": "HF"}
PACKAGES = ("jax", "jaxlib", "flax", "torch", "transformers", "numpy")  # versions saved
DEFAULT_GRID = "128:1,8,32;1600:1,8"
TARGET_RATIO = 2.0  # the target: ours >= 2x HF's tokens/s in every cell

# --smoke: tiny sizes (explicit flags still win), so the whole tool runs in seconds.
SMOKE = dict(
    n_layer=2,
    d_model=32,
    n_head=2,
    d_head=16,
    d_inner=64,
    vocab=50,
    tgt_len=4,
    prompt_len=8,
    num_tokens=5,
    repeats=1,
    grid="8:1,2;16:1,2",
)


def parse_grid(text: str) -> list[tuple[int, int]]:
  """ "128:1,8,32;1600:1,8" -> [(batch, mem_len), ...] in that order.

  Raises:
    ValueError: not of that form, or a number < 1.
  """
  cells = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    mem, _, batches = part.partition(":")
    if not batches:
      raise ValueError(f"{part!r} is not MEM_LEN:BATCH,BATCH,...")
    for b in batches.split(","):
      cells.append((int(b), int(mem)))
  if not cells or any(b < 1 or m < 1 for b, m in cells):
    raise ValueError(f"{text!r}: need cells with batch >= 1 and mem_len >= 1")
  return cells


def cell_key(batch: int, mem_len: int) -> str:
  """The JSON key of a cell: "B8_M128"."""
  return f"B{batch}_M{mem_len}"


def parse_args(argv=None) -> argparse.Namespace:
  """The flags; ``--smoke`` changes the defaults to ``SMOKE``'s tiny sizes."""
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  g = p.add_argument_group("model (the same sizes for both; default: configs/quickstart.py)")
  g.add_argument("--n_layer", type=int, default=4)
  g.add_argument("--d_model", type=int, default=128)
  g.add_argument("--n_head", type=int, default=4)
  g.add_argument("--d_head", type=int, default=32)
  g.add_argument("--d_inner", type=int, default=512)
  g.add_argument("--vocab", type=int, default=10000, help="n_token (PTB); dense tied softmax")
  g.add_argument(
      "--tgt_len",
      type=int,
      default=32,
      help="our Generator's segment length for the prompt (eval tgt_len)",
  )
  g = p.add_argument_group("sampling")
  g.add_argument(
      "--grid", default=DEFAULT_GRID, help="cells as MEM_LEN:BATCH,BATCH;MEM_LEN:BATCH,..."
  )
  g.add_argument("--prompt_len", type=int, default=64, help="random prompt tokens per row")
  g.add_argument("--num_tokens", type=int, default=200, help="new tokens per row and call")
  g.add_argument("--top_k", type=int, default=40)
  g.add_argument("--temperature", type=float, default=1.0)
  g = p.add_argument_group("measurement")
  g.add_argument("--repeats", type=int, default=3, help="timed calls; the median is reported")
  g.add_argument(
      "--threads", type=int, default=0, help="threads for both (0 = all CPUs this process may use)"
  )
  g.add_argument(
      "--which",
      default="ours,pytorch",
      help="comma list of ours, pytorch (HF's TransfoXLLMHeadModel)",
  )
  g.add_argument("--order", default="ours_first", choices=("ours_first", "pytorch_first"))
  g.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our subprocesses")
  g.add_argument(
      "--malloc_hugepages",
      type=int,
      default=1,
      choices=(0, 1),
      help="1: glibc.malloc.hugetlb=1 for our subprocesses, as our command line",
  )
  g.add_argument(
      "--pytorch_malloc_hugepages",
      type=int,
      default=0,
      choices=(0, 1),
      help="1: the same for the PyTorch subprocesses",
  )
  g.add_argument("--seed", type=int, default=0)
  g.add_argument(
      "--smoke",
      action="store_true",
      help="tiny model, 5 tokens, 1 repeat, 4 small cells: checks the tool in "
      "seconds; the numbers mean nothing",
  )
  g = p.add_argument_group("results")
  g.add_argument(
      "--json",
      default="",
      help="write settings, machine, versions and results here (default: "
      "benchmarks/results/generation_<date>_<time>_<host>.json; "
      "--smoke: a temp dir)",
  )
  g.add_argument(
      "--compare",
      default="",
      metavar="OLD.json",
      help="print every number beside OLD.json's, with the change",
  )
  g.add_argument(
      "--new",
      default="",
      metavar="NEW.json",
      help="with --compare: compare NEW.json to OLD.json and run nothing",
  )
  g.add_argument(
      "--tolerance",
      type=float,
      default=5.0,
      help="--compare flags changes for the worse beyond this many percent",
  )
  # Internal: the subprocess entry point.
  p.add_argument("--worker", default="", choices=("",) + IMPLEMENTATIONS, help=argparse.SUPPRESS)
  p.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--mem_len", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--result_file", default="", help=argparse.SUPPRESS)
  if "--smoke" in argv:
    p.set_defaults(**SMOKE)
  args = p.parse_args(argv)
  if args.new and not args.compare:
    p.error("--new=NEW.json needs --compare=OLD.json")
  try:
    args.cells = parse_grid(args.grid)
  except ValueError as err:
    p.error(f"--grid: {err}")
  bad = [x for x in args.which.split(",") if x not in IMPLEMENTATIONS]
  if bad or not args.which:
    p.error(f"--which={args.which!r}: use a comma list of {', '.join(IMPLEMENTATIONS)}")
  for name in ("prompt_len", "num_tokens", "repeats", "tgt_len", "vocab"):
    if getattr(args, name) < 1:
      p.error(f"--{name}={getattr(args, name)} must be >= 1")
  if args.top_k < 1:
    p.error(
        f"--top_k={args.top_k} must be >= 1 (HF's top_k=0 means no cut, ours too, but the "
        "comparison is about top-k sampling)"
    )
  return args


def _worker_env(args, which: str) -> dict:
  """The environment of the ``which`` worker: ours a JAX one on the CPU
  (``--xla_flags`` added), and glibc's huge pages where asked for."""
  env = common.worker_env(args.xla_flags.split() if which == "ours" else None)
  if args.malloc_hugepages if which == "ours" else args.pytorch_malloc_hugepages:
    if REPO not in sys.path:  # this checkout's transformer_xl (process_settings: stdlib only)
      sys.path.insert(0, REPO)
    from transformer_xl.cli import process_settings

    env = process_settings.hugepages_environ(env) or env
  return env


def run_worker(args, argv: list[str], which: str, batch: int, mem_len: int) -> dict:
  """Runs this script with --worker=which for one cell in a subprocess;
  returns its results plus the environment, wall seconds and load average.

  Raises:
    SystemExit: the subprocess failed (its output is above the message).
  """
  worker_argv = [
      *argv,
      f"--worker={which}",
      f"--threads={args.threads}",
      f"--batch={batch}",
      f"--mem_len={mem_len}",
  ]
  load_before = common.loadavg()
  t0 = time.perf_counter()
  env = _worker_env(args, which)
  code, res = common.run_script(__file__, worker_argv, env)
  if code != 0:
    raise SystemExit(
        f"error: the {which} benchmark subprocess (batch {batch}, mem_len "
        f"{mem_len}) failed with exit code {code} (its output is above)"
    )
  res["env"] = {k: env[k] for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "OMP_NUM_THREADS") if k in env}
  res["wall_seconds"] = round(time.perf_counter() - t0, 1)
  res["loadavg_before"] = load_before
  res["loadavg_after"] = common.loadavg()
  return res


def _fmt(x: float | None, digits: int = 0) -> str:
  return "-" if x is None else f"{x:,.{digits}f}"


def ratios(results: dict) -> dict:
  """Per cell: {"tokens_per_sec": ours/HF median tokens/s, "first_token":
  HF/ours median first-token latency (> 1: ours is faster), "target_met":
  the tokens/s ratio >= the target}; cells that lack either are left out."""
  out = {}
  for key, o in results.get("ours", {}).items():
    t = results.get("pytorch", {}).get(key)
    if not t:
      continue
    r = o["median_tokens_per_sec"] / t["median_tokens_per_sec"]
    out[key] = {
        "tokens_per_sec": r,
        "first_token": (t["median_first_token_latency_s"] / o["median_first_token_latency_s"]),
        "target_met": r >= TARGET_RATIO,
    }
  return out


def format_table(cells: list[tuple[int, int]], results: dict) -> str:
  """The markdown table: one row per cell."""
  rows = [
      "| batch | mem_len | ours tokens/s | HF tokens/s | ours/HF "
      f"| >= {TARGET_RATIO:g}x | ours first token s | HF first token s "
      "| HF/ours first token | ours warm-up (compile) s |",
      "|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|",
  ]
  rat = ratios(results)
  for batch, mem_len in cells:
    key = cell_key(batch, mem_len)
    o, t = (results.get(w, {}).get(key, {}) for w in IMPLEMENTATIONS)
    r = rat.get(key)
    rows.append(
        f"| {batch} | {mem_len:,} | {_fmt(o.get('median_tokens_per_sec'))} "
        f"| {_fmt(t.get('median_tokens_per_sec'))} "
        f"| {'-' if r is None else format(r['tokens_per_sec'], '.2f') + 'x'} "
        f"| {'-' if r is None else ('yes' if r['target_met'] else 'no')} "
        f"| {_fmt(o.get('median_first_token_latency_s'), 4)} "
        f"| {_fmt(t.get('median_first_token_latency_s'), 4)} "
        f"| {'-' if r is None else format(r['first_token'], '.2f') + 'x'} "
        f"| {_fmt(o.get('compile_seconds'), 2)} |"
    )
  return "\n".join(rows)


def main(argv=None) -> int:
  """Runs every (cell, implementation) in a worker subprocess (``--worker``:
  this process is one), prints the table and writes the JSON; or, with
  ``--compare`` and ``--new``, compares two saved runs.  Returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  if args.compare and args.new:  # compare two saved runs; run nothing
    lines, _ = compare_runs(load_json(args.compare), load_json(args.new), args.tolerance)
    print("\n".join(lines))
    return 0
  args.threads = common.pin_threads(args.threads)

  if args.worker:
    run = workers.run_ours if args.worker == "ours" else workers.run_pytorch
    res = run(args, args.batch, args.mem_len)
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  old = load_json(args.compare) if args.compare else None  # fail before the long run
  which = [w for w in args.which.split(",") if w]
  if args.order == "pytorch_first":
    which = sorted(which, key=lambda w: w != "pytorch")
  info = common.machine_info(PACKAGES)
  info.update(common.git_commit())
  info["threads"] = args.threads
  json_path = args.json
  if not json_path:
    folder = tempfile.mkdtemp(prefix="generation_smoke_") if args.smoke else common.RESULTS_DIR
    json_path = common.default_json_path(platform.node(), "generation_", folder)
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs ({info['cpus_available']} "
      f"available), {info['memory_gib']} GiB, {args.threads} threads for all; load average "
      f"{' '.join(map(str, info['loadavg_start']))}; commit {info['commit'][:12]}"
      + (f" + {len(info['dirty'])} changed file(s)" if info["dirty"] else ""),
      flush=True,
  )

  results = {w: {} for w in which}
  for batch, mem_len in args.cells:
    key = cell_key(batch, mem_len)
    for w in which:
      print(f"running {w} batch {batch}, mem_len {mem_len} ...", flush=True)
      r = results[w][key] = run_worker(args, argv, w, batch, mem_len)
      print(
          f"  {w} B={batch} M={mem_len}: median {r['median_tokens_per_sec']:,.1f} tokens/s "
          "(repeats: "
          + ", ".join(f"{x:,.1f}" for x in r["tokens_per_sec"])
          + f"); first token {r['median_first_token_latency_s']:.4f} s; warm-up "
          f"{r['warmup_seconds']:.2f} s; CPU/wall: "
          + ", ".join(f"{x:.2f}" for x in r["cpu_per_wall"])
          + f"; peak RSS {r['peak_rss_mib']:,.0f} MiB",
          flush=True,
      )
  info["loadavg_end"] = common.loadavg()

  table = format_table(args.cells, results)
  rat = ratios(results)
  print()
  print(table)
  print()
  if rat:
    met = sum(r["target_met"] for r in rat.values())
    print(
        f"target ours >= {TARGET_RATIO:g}x HF tokens/s: met in {met} of {len(rat)} cells"
        + (" (--smoke: the numbers mean nothing)" if args.smoke else "")
    )
  counts = {w: next(iter(results[w].values()))["n_params"] for w in which}
  same = (
      "" if len(counts) < 2 else (" (equal)" if len(set(counts.values())) == 1 else " (DIFFERENT)")
  )
  print("parameters: " + ", ".join(f"{LABELS[w]} {n:,}" for w, n in counts.items()) + same)
  v = info["versions"]
  print(
      f"model: n_layer {args.n_layer}, d_model {args.d_model}, {args.n_head}x{args.d_head} "
      f"heads, d_inner {args.d_inner}, vocab {args.vocab:,}, fp32; prompt {args.prompt_len} "
      f"tokens (ours in segments of {args.tgt_len}), {args.num_tokens} new tokens, top-k "
      f"{args.top_k}, temperature {args.temperature:g}; {args.repeats} repeat(s) (median)"
  )
  print(
      f"machine: {info['cpu']}, {info['cpu_count']} CPUs, {args.threads} threads; load average "
      + "; ".join(
          f"{w} {cell_key(b, m)} {results[w][cell_key(b, m)]['loadavg_before'][0]}->"
          f"{results[w][cell_key(b, m)]['loadavg_after'][0]}"
          for b, m in args.cells
          for w in which
      )
      + f" (1-min, before->after); python {info['python']}, jax {v['jax']}, "
      f"flax {v['flax']}, torch {v['torch']}, transformers {v['transformers']}"
  )
  for w in which:
    env = next(iter(results[w].values()))["env"]
    if env:
      print(f"{w} environment: " + ", ".join(f"{k}={val!r}" for k, val in env.items()))
  run = {
      "args": {
          k: v
          for k, v in vars(args).items()
          if k not in ("worker", "batch", "mem_len", "result_file", "cells")
      },
      "settings": {
          "cells": [{"batch": b, "mem_len": m} for b, m in args.cells],
          "target_ratio": TARGET_RATIO,
          "ours": "generate.Generator.generate / .stream (num_tokens=1)",
          "pytorch": "transformers TransfoXLLMHeadModel.generate (max_new_tokens=N / =1)",
      },
      "machine": info,
      "results": results,
      "ratios": rat,
      "table": table,
  }
  common.write_json(json_path, run)
  if old is not None:
    print()
    lines, _ = compare_runs(old, run, args.tolerance)
    print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
