"""Throughput, peak memory and matmul-limit share of our Transformer-XL against
HuggingFace's ``TransfoXLLMHeadModel``.

Run from the repository root (defaults: the model below, phases train, eval
and eval_long, 5 repeats of 10 timed steps each)::

  python benchmarks/vs_pytorch.py [--steps=10] [--repeats=5] [--threads=N] [--block=N]
                                  [--json=FILE] [--compare=OLD.json]
  python benchmarks/vs_pytorch.py --compare=OLD.json --new=NEW.json  # compare, run nothing
  python benchmarks/vs_pytorch.py --smoke   # tiny sizes: checks the tool, numbers meaningless

What is measured, for both implementations with the same model configuration
(default: n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024, vocab 256,
a plain dense softmax with its weights tied to the embedding and a bias,
shared u/v, dropout 0.1, dropatt 0, fp32), the same batch and the same
sequence lengths, one phase at a time:

* **train**: one optimizer step = forward, backward, global-norm gradient
  clipping at ``--clip`` (0.25), an Adam update; the memory (tgt_len=mem_len=128
  by default) is carried from step to step.  Ours: ``train_step.make_train_step``
  (one jitted, donated step; the memory lives in the TrainState).  PyTorch:
  ``model(input_ids, mems=mems, labels=...)``, ``loss.backward()``,
  ``clip_grad_norm_``, ``torch.optim.Adam.step()``; ``mems`` is the previous
  step's ``out.mems``.
* **eval**: scoring segments of ``--eval_tgt_len`` (128) with a memory of
  ``--eval_mem_len`` (512), no dropout, no gradient, the memory carried.
  Ours: ``eval_steps.make_eval_step`` (the ``Evaluator``'s jitted step, memory
  donated) with the evaluation ModelConfig (``eval_steps.eval_model_config``).
  PyTorch: the same forward under ``torch.no_grad()`` with
  ``reset_memory_length(eval_mem_len)``.
* **eval_long**: the same as eval with a memory of ``--eval_long_mem_len``
  (2048): the long-memory case, where the [B, H, T, M+T] attention
  temporaries dominate.

Ours uses ``model.attn_block`` = ``--block`` (queries per block of the
blockwise attention, 0 = the full computation); without ``--block``,
``default_config``'s -1, which ``tuning.attn_block_size`` resolves per
backend and phase (on CPU: 64 in training, 0 in evaluation); likewise
``model.scan_unroll`` = ``--scan_unroll`` (layers per iteration of the loop
over layers; default -1, ``tuning.scan_unroll_layers``: all 6 on CPU).  The
resolved values are printed and saved with the results.

Numbers per phase and implementation:

* **tokens/s** = batch * tgt_len * steps / seconds for one repeat of
  ``--steps`` steps, after ``--warmup`` untimed steps (compilation, first
  steps); the median over ``--repeats`` is reported (min and max go to the
  JSON).  Inputs are random token ids, prepared before timing (a few
  distinct batches, cycled), so no input pipeline is timed.
* **peak RSS** (MiB = 2**20 bytes): the high-water mark of the resident set
  of the phase's own subprocess (``VmHWM`` in ``/proc/self/status``; Linux),
  read after its last step: interpreter, libraries, model, optimizer state,
  compilation and step temporaries included.  The RSS right after the
  imports goes to the JSON too (``rss_after_imports_mib``), so the part of
  the peak that the model and its steps add is visible.
* **% of matmul limit** = model FLOPs per token (``model_flops_per_token``)
  x tokens/s / the machine's float32 matrix-multiply limit.  The limit is
  measured in the same run, by every worker right after its timed steps,
  on its threads and CPUs (``measure_matmul``): the fastest of
  ``--matmul_repeats`` ``--matmul_n`` x ``--matmul_n`` float32 products
  with ``np.dot`` (numpy's BLAS) and with the worker's own library (a
  jitted ``jnp.dot`` on XLA:CPU, or ``torch.mm``); the highest GFLOP/s of
  all workers is the limit (each measurement is in the JSON).

Fairness:

* Every (implementation, phase) runs in its own subprocess, so the JAX/XLA
  and torch thread pools never coexist in one process, each gets the whole
  machine, and each peak RSS belongs to one phase.  Phases run in turn;
  within a phase ours goes first unless ``--order=pytorch_first``.  The
  parent process imports neither.
* Both use the same number of threads, ``--threads`` (default: all CPUs
  available to the process): torch via ``torch.set_num_threads(N)``; XLA:CPU
  sizes its intra-op pool from the CPUs the process may run on, so when N is
  below the core count every subprocess is pinned to the same N CPUs
  (``os.sched_setaffinity``), and torch is given N threads on them.
* ``XLA_FLAGS`` for our subprocess is the caller's, minus
  ``--xla_force_host_platform_device_count`` (the test suite's 8 simulated
  devices), plus ``--xla_flags`` if given; by default nothing else, i.e. XLA's
  own CPU defaults.  Ours runs on a 1x1 mesh of one CPU device.
  ``--malloc_hugepages=1`` (the default) adds ``glibc.malloc.hugetlb=1`` to
  ``GLIBC_TUNABLES`` for our subprocess, as ``python -m
  transformer_xl.main`` does for itself (``transformer_xl.cli.process_settings``:
  malloc asks for transparent huge pages for XLA:CPU's per-step buffers);
  ``--malloc_hugepages=0`` runs ours without.  PyTorch runs in the caller's
  environment, its own default: with the tunable its training ran at half
  speed on a 2-core CPU VM (634 against 1,192 tokens/s; measured runs in
  ``benchmarks/results/REPORT.md``); ``--pytorch_malloc_hugepages=1`` gives
  it the tunable too.
* Both workers hand the memory that glibc holds free back to the kernel
  (``process_settings.release_free_memory``, ``malloc_trim``): ours after
  every XLA compilation (``process_settings.release_after_compiles``), as
  our command line and training loop do; PyTorch once, after creating the
  model and its optimizer (it compiles nothing).
* HF's ``labels`` are shifted inside the model, so its loss covers
  tgt_len - 1 positions per row and ours tgt_len; both count batch * tgt_len
  tokens per step.  HF initialises its memory with mem_len zero states (its
  ``init_mems``) and ours with mem_len masked slots: the same shapes and
  work from the first step.

Output: the markdown table (one row per phase: tokens/s of both, the ratio,
% of the matmul limit and peak RSS of both), the machine (CPU model, cores,
memory, load average before and after each subprocess) and library
versions.  Every run writes a JSON with the settings, machine, versions and
all results: ``--json=FILE``, by default
``benchmarks/results/<date>_<time>_<host>.json`` (``--smoke``: a temporary
directory).  ``--compare=OLD.json`` then prints every number of the run
beside the one in OLD.json with its change, and flags as REGRESSION each
throughput that fell, or time or memory that rose, by more than
``--tolerance`` percent; with ``--new=NEW.json`` it compares two saved runs
without running anything.

This file parses the flags, runs the workers and prints the results; the
workers are in ``vs_pytorch_workers.py``, ``--compare`` in
``vs_pytorch_compare.py``, and what all benchmark tools share (machine,
versions, result files) in ``common.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py and the parts below, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
from vs_pytorch_compare import compare_runs, load_json  # noqa: E402

import common  # noqa: E402
import vs_pytorch_workers as workers  # noqa: E402  (workers: nothing heavy at import)

if common.REPO not in sys.path:  # this checkout's transformer_xl
  sys.path.insert(0, common.REPO)
from transformer_xl.compile.flops import (  # noqa: E402
    layer_flops_per_token as model_flops_per_token,
)

REPO = common.REPO
PHASES = ("train", "eval", "eval_long")
IMPLEMENTATIONS = ("ours", "pytorch")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "numpy")  # versions saved

# --smoke: tiny sizes (explicit flags still win), so the whole tool runs in seconds.
SMOKE = dict(
    n_layer=1,
    d_model=32,
    n_head=2,
    d_head=16,
    d_inner=64,
    vocab=32,
    batch=2,
    tgt_len=8,
    mem_len=8,
    eval_tgt_len=8,
    eval_mem_len=16,
    eval_long_mem_len=32,
    steps=2,
    repeats=1,
    warmup=1,
    matmul_n=256,
    matmul_repeats=2,
)


def parse_args(argv=None) -> argparse.Namespace:
  """The flags; ``--smoke`` changes the defaults to ``SMOKE``'s tiny sizes."""
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  g = p.add_argument_group("model (the same for both)")
  g.add_argument("--n_layer", type=int, default=6)
  g.add_argument("--d_model", type=int, default=256)
  g.add_argument("--n_head", type=int, default=8)
  g.add_argument("--d_head", type=int, default=32)
  g.add_argument("--d_inner", type=int, default=1024)
  g.add_argument("--vocab", type=int, default=256, help="n_token; dense softmax (no cutoffs)")
  g.add_argument("--dropout", type=float, default=0.1)
  g.add_argument("--dropatt", type=float, default=0.0)
  g.add_argument(
      "--block",
      type=int,
      default=None,
      help="our model.attn_block: queries per attention block (0 = the full "
      "[B, H, T, K] computation); default: default_config's -1, per "
      "backend and phase",
  )
  g.add_argument(
      "--scan_unroll",
      type=int,
      default=None,
      help="our model.scan_unroll: layers per iteration of the loop over layers; "
      "default: default_config's -1, per backend",
  )
  g = p.add_argument_group("training")
  g.add_argument("--batch", type=int, default=8)
  g.add_argument("--tgt_len", type=int, default=128)
  g.add_argument("--mem_len", type=int, default=128)
  g.add_argument("--clip", type=float, default=0.25, help="global gradient-norm clip")
  g.add_argument("--lr", type=float, default=2.5e-4, help="Adam learning rate (constant)")
  g = p.add_argument_group("evaluation")
  g.add_argument("--eval_batch", type=int, default=0, help="0 = --batch")
  g.add_argument("--eval_tgt_len", type=int, default=128)
  g.add_argument("--eval_mem_len", type=int, default=512, help="memory of the eval phase")
  g.add_argument(
      "--eval_long_mem_len", type=int, default=2048, help="memory of the eval_long phase"
  )
  g.add_argument(
      "--eval_same_length",
      type=int,
      default=1,
      choices=(0, 1),
      help="same_length attention in eval (our eval default)",
  )
  g = p.add_argument_group("measurement")
  g.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
  g.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
  g.add_argument(
      "--warmup", type=int, default=3, help="untimed steps first (compilation; memory filling up)"
  )
  g.add_argument(
      "--threads", type=int, default=0, help="threads for both (0 = all CPUs this process may use)"
  )
  g.add_argument("--phases", default=",".join(PHASES), help="comma list of " + ", ".join(PHASES))
  g.add_argument("--which", default="ours,pytorch", help="comma list of ours, pytorch")
  g.add_argument("--order", default="ours_first", choices=("ours_first", "pytorch_first"))
  g.add_argument(
      "--matmul_n",
      type=int,
      default=2048,
      help="N of the N x N float32 matmul that measures the machine's limit",
  )
  g.add_argument(
      "--matmul_repeats", type=int, default=5, help="timed matmuls per library (the fastest counts)"
  )
  g.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our subprocess")
  g.add_argument(
      "--malloc_hugepages",
      type=int,
      default=1,
      choices=(0, 1),
      help="1: glibc.malloc.hugetlb=1 in GLIBC_TUNABLES for our subprocess, "
      "as our command line sets it (transformer_xl.cli.process_settings)",
  )
  g.add_argument(
      "--pytorch_malloc_hugepages",
      type=int,
      default=0,
      choices=(0, 1),
      help="1: the same for the PyTorch subprocess (it slowed torch's training "
      "down 2x on a 2-core CPU VM, benchmarks/results/REPORT.md)",
  )
  g.add_argument("--seed", type=int, default=0)
  g.add_argument(
      "--smoke",
      action="store_true",
      help="tiny model, 1 repeat of 2 steps, small matmul: checks the tool in "
      "seconds; the numbers mean nothing",
  )
  g = p.add_argument_group("results")
  g.add_argument(
      "--json",
      default="",
      help="write settings, machine, versions and results here (default: "
      "benchmarks/results/<date>_<time>_<host>.json; --smoke: a temp dir)",
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
  p.add_argument("--worker", default="", choices=("", "ours", "pytorch"), help=argparse.SUPPRESS)
  p.add_argument("--phase", default="", choices=("",) + PHASES, help=argparse.SUPPRESS)
  p.add_argument("--result_file", default="", help=argparse.SUPPRESS)
  if "--smoke" in argv:
    p.set_defaults(**SMOKE)
  args = p.parse_args(argv)
  if args.eval_batch <= 0:
    args.eval_batch = args.batch
  bad = [x for x in args.phases.split(",") if x not in PHASES]
  if bad or not args.phases:
    p.error(f"--phases={args.phases!r}: use a comma list of {', '.join(PHASES)}")
  bad = [x for x in args.which.split(",") if x not in IMPLEMENTATIONS]
  if bad or not args.which:
    p.error(f"--which={args.which!r}: use a comma list of {', '.join(IMPLEMENTATIONS)}")
  if args.new and not args.compare:
    p.error("--new=NEW.json needs --compare=OLD.json")
  if args.block is not None and args.block < 0:
    p.error(f"--block={args.block} must be >= 0 (0 = no blocks)")
  return args


def phase_lengths(args, phase: str) -> tuple[int, int, int]:
  """(batch: rows, tgt_len: tokens per segment, mem_len: tokens of memory) of a phase."""
  if phase == "train":
    return args.batch, args.tgt_len, args.mem_len
  mem_len = args.eval_long_mem_len if phase == "eval_long" else args.eval_mem_len
  return args.eval_batch, args.eval_tgt_len, mem_len


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


def run_worker(args, which: str, argv: list[str], phase: str = "") -> dict:
  """Runs this script with --worker=which (--phase=phase) in a subprocess;
  returns its results plus the environment, wall seconds and load average.

  Raises:
    SystemExit: the subprocess failed (its output is above the message).
  """
  worker_argv = [*argv, f"--worker={which}", f"--threads={args.threads}"]
  if phase:
    worker_argv.append(f"--phase={phase}")
  load_before = common.loadavg()
  t0 = time.perf_counter()
  env = _worker_env(args, which)
  code, res = common.run_script(__file__, worker_argv, env)
  if code != 0:
    raise SystemExit(
        f"error: the {which} {phase} benchmark subprocess failed with exit code "
        f"{code} (its output is above)"
    )
  res["env"] = {k: env[k] for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "OMP_NUM_THREADS") if k in env}
  res["wall_seconds"] = round(time.perf_counter() - t0, 1)
  res["loadavg_before"] = load_before
  res["loadavg_after"] = common.loadavg()
  return res


def _fmt(x: float | None, digits: int = 0) -> str:
  return "-" if x is None else f"{x:,.{digits}f}"


def phase_label(args, phase: str) -> str:
  """The table's name of a phase: "train (B=8, tgt_len=128, mem_len=128)"."""
  batch, tgt_len, mem_len = phase_lengths(args, phase)
  return f"{phase} (B={batch}, tgt_len={tgt_len}, mem_len={mem_len})"


def format_table(args, results: dict) -> str:
  """The markdown table: one row per phase; tokens/s of ours and PyTorch,
  ours/PyTorch, % of the matmul limit and peak RSS (MiB) of both."""
  rows = [
      "| phase | ours tokens/s | PyTorch tokens/s | ratio ours/PyTorch "
      "| ours % of matmul limit | PyTorch % of matmul limit "
      "| ours peak RSS MiB | PyTorch peak RSS MiB |",
      "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for phase in args.phases.split(","):
    r = {w: results.get(w, {}).get(phase, {}) for w in IMPLEMENTATIONS}
    o, t = (r[w].get("median_tokens_per_sec") for w in IMPLEMENTATIONS)
    ratio = f"{o / t:.2f}x" if o and t else "-"
    pct = [_fmt(r[w].get("pct_of_matmul_limit"), 1) for w in IMPLEMENTATIONS]
    rss = [_fmt(r[w].get("peak_rss_mib")) for w in IMPLEMENTATIONS]
    rows.append(
        f"| {phase_label(args, phase)} | {_fmt(o)} | {_fmt(t)} | {ratio} "
        f"| {pct[0]} | {pct[1]} | {rss[0]} | {rss[1]} |"
    )
  return "\n".join(rows)


def main(argv=None) -> int:
  """Runs every (phase, implementation) in a worker subprocess (``--worker``:
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
    res = run(args, args.phase, *phase_lengths(args, args.phase))
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  old = load_json(args.compare) if args.compare else None  # fail before the long run
  phases = args.phases.split(",")
  which = [w for w in args.which.split(",") if w]
  if args.order == "pytorch_first":
    which = sorted(which, key=lambda w: w != "pytorch")
  info = common.machine_info(PACKAGES)
  info["threads"] = args.threads
  json_path = args.json
  if not json_path:  # benchmarks/results/<date>_<time>_<host>.json (--smoke: a temp dir)
    folder = tempfile.mkdtemp(prefix="vs_pytorch_smoke_") if args.smoke else common.RESULTS_DIR
    json_path = common.default_json_path(info["host"], folder=folder)
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs ({info['cpus_available']} "
      f"available), {info['memory_gib']} GiB, {args.threads} threads for all; load average "
      f"{' '.join(map(str, info['loadavg_start']))}",
      flush=True,
  )

  results = {w: {} for w in which}
  for phase in phases:
    for w in which:
      print(f"running {w} {phase} ...", flush=True)
      r = results[w][phase] = run_worker(args, w, argv, phase)
      results[w].setdefault("n_params", r["n_params"])
      print(
          f"  {w} {phase}: median {r['median_tokens_per_sec']:,.0f} tokens/s "
          f"({r['median_ms_per_step']:.1f} ms/step; repeats: "
          + ", ".join(f"{x:,.0f}" for x in r["tokens_per_sec"])
          + "; CPU/wall: "
          + ", ".join(f"{x:.2f}" for x in r["cpu_per_wall"])
          + f"; per step: {r['sys_ms_per_step']:.0f} ms system time, "
          f"{r['minor_faults_per_step']:,.0f} page faults; peak RSS "
          f"{r['peak_rss_mib']:,.0f} MiB, {r['rss_after_imports_mib']:,.0f} after imports)",
          flush=True,
      )
  best = {}  # library -> its best GFLOP/s over all workers
  for w in which:
    for phase in phases:
      for k, v in results[w][phase]["matmul"].items():
        if k.endswith("_gflops"):
          best[k[: -len("_gflops")]] = max(best.get(k[: -len("_gflops")], 0.0), v)
  limit = max(best.values())
  matmul = {"n": args.matmul_n, "best_gflops": best, "limit_gflops": limit}
  for w in which:
    for phase in phases:
      r = results[w][phase]
      batch, tgt_len, mem_len = phase_lengths(args, phase)
      r["flops_per_token"] = model_flops_per_token(
          args.n_layer,
          args.d_model,
          args.n_head,
          args.d_head,
          args.d_inner,
          args.vocab,
          batch,
          tgt_len,
          mem_len,
          train=phase == "train",
      )
      r["pct_of_matmul_limit"] = (
          100 * r["flops_per_token"] * r["median_tokens_per_sec"] / (limit * 1e9)
      )
  info["loadavg_end"] = common.loadavg()

  table = format_table(args, results)
  print()
  print(table)
  print()
  counts = {w: results[w]["n_params"] for w in results}
  same = len(set(counts.values())) == 1
  print(
      "parameters: "
      + ", ".join(f"{w} {n:,}" for w, n in counts.items())
      + ("" if len(counts) < 2 else (" (equal)" if same else " (DIFFERENT)"))
  )
  if "ours" in results:
    print(
        "ours: model.attn_block "
        + ", ".join(
            f"{ph} {results['ours'][ph]['attn_block']}" for ph in phases if ph in results["ours"]
        )
        + (" (--block)" if args.block is not None else " (default_config's -1, per backend)")
    )
    print(
        "ours: model.scan_unroll "
        + ", ".join(
            f"{ph} {results['ours'][ph].get('scan_unroll', '-')}"
            for ph in phases
            if ph in results["ours"]
        )
        + (
            " (--scan_unroll)"
            if args.scan_unroll is not None
            else " (default_config's -1, per backend)"
        )
    )
  print(
      f"matmul limit (float32, N={args.matmul_n}, best of every worker): "
      + ", ".join(f"{k} {v:,.0f}" for k, v in best.items())
      + f" GFLOP/s; limit {limit:,.0f} GFLOP/s"
  )
  print(
      "model FLOPs per token (matmuls; train = 3x forward): "
      + ", ".join(f"{p} {results[which[0]][p]['flops_per_token'] / 1e6:,.1f} M" for p in phases)
  )
  v = info["versions"]
  print(
      f"machine: {info['cpu']}, {info['cpu_count']} CPUs, {args.threads} threads; load average "
      + "; ".join(
          f"{w} {p} {results[w][p]['loadavg_before'][0]}->{results[w][p]['loadavg_after'][0]}"
          for p in phases
          for w in which
      )
      + f" (1-min, before->after); python {info['python']}, jax {v['jax']}, "
      f"flax {v['flax']}, optax {v['optax']}, torch {v['torch']}, "
      f"transformers {v['transformers']}"
  )
  print(
      f"steps {args.steps} x repeats {args.repeats} (median), warmup {args.warmup}; "
      "one subprocess per implementation and phase, in the order: "
      + ", ".join(f"{w} {p}" for p in phases for w in which)
  )
  envs = {w: results[w][phases[0]]["env"] for w in which}
  for w, env in envs.items():
    if env:
      print(f"{w} environment: " + ", ".join(f"{k}={v!r}" for k, v in env.items()))
  run = {
      "args": {k: v for k, v in vars(args).items() if k not in ("worker", "phase", "result_file")},
      "machine": info,
      "matmul": matmul,
      "results": results,
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
