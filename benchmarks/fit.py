r"""Fit before you rent: does a config's train step and eval step fit in its devices' memory?

Compiles the real steps for the slice's device count on simulated CPU
devices, executes nothing, and prints XLA's per-device memory analysis
against the memory of one device of the slice::

  python benchmarks/fit.py --config=configs/enwik8_24l.py:v3-32
  python benchmarks/fit.py --config=configs/enwik8_24l.py:v3-32 --config.model.remat=none
  python benchmarks/fit.py --config=configs/enwik8_12l.py --devices=8 --device_kind=v3 \
      --config.mesh.shape='(2, 4)'
  python benchmarks/fit.py --config=configs/wt103_base.py     # no preset: one H100
  python benchmarks/fit.py --all                              # every paper config on its slice

What is compiled, exactly as training and evaluation build it:

* **train**: ``train_step.make_train_step`` with the shardings of
  ``train_state.abstract_train_state`` (parameters, Adam moments, memory),
  lowered with ``jax.ShapeDtypeStruct`` inputs of the global batch
  (``train.global_batch`` x ``model.tgt_len``).  No parameter is allocated.
* **eval**: ``eval_steps.make_eval_step`` with ``eval_steps.eval_model_config``
  (the eval tgt_len, mem_len, clamp_len and same_length), parameters with
  the training shardings and ``eval.global_batch`` rows padded to the
  data-parallel size, as the ``Evaluator`` pads them
  (``eval.method="sliding"``: ``eval_steps.make_window_step``).

The devices: ``--config=FILE:PRESET`` (a slice preset, ``transformer_xl/presets.py``)
gives the device count (``presets.SLICE_DEVICES``) and the device kind (the
part before the "-": v3, v4, v5p); a config without a preset runs on
``--devices`` (default 1) of ``--device_kind`` (default h100).  This script
re-executes itself with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
(set before jax is imported) for each config.  Vocabulary sizes are the real
corpora's (``vocab_sizes``), so no data are read.

Memory per device, from ``compiled.memory_analysis()`` (bytes, shown in
GiB = 2**30 bytes): arguments, outputs, the outputs aliased to donated
arguments (the train state, the eval memory), temporaries and generated
code; total = arguments + outputs - aliased + temporaries + code.  The
verdict compares the total with one device's memory
(``DEVICE_MEMORY_GIB``, or ``--device_memory``):

* FITS: total <= (1 - ``--margin``) x device memory (margin 10%);
* TIGHT: within the margin below the device memory, which the CPU
  analysis cannot settle (see the caveats);
* DOES NOT FIT: total > device memory.

When a step is TIGHT or does not fit, the script looks for the cheapest
setting that FITS: first the most frugal candidate (``model.remat="full"``
and the smallest block of the blockwise attention); if even that does not
fit, no remat or block size will and it says so; otherwise it tries the
candidates from the least recomputation up (remat policies "none", "dots",
"save_proj", "save_qkv_proj", "full" of ``tuning.REMAT_POLICIES``, each with
the config's ``model.attn_block`` and then smaller blocks; eval: blocks
only) and prints the first that fits as ``--config.model.remat=...
--config.model.attn_block=...``.

The compiler: for a TPU device kind (a preset's, or ``--device_kind`` v2
... v6e) with libtpu installed (``pip install 'transformer_xl[tpu-compile]'``),
the TPU compiler itself, for the slice's topology; for up to 8 H100s with
jax's CUDA plugin (``[gpu-compile]``), XLA:GPU (``python -m
transformer_xl.compile`` does the same per config and adds FLOPs,
collectives and a roofline); otherwise, the fallback, XLA:CPU on simulated
devices.  The output and the JSON (``compiled_by``) say which.

Caveats: the numbers are XLA's compile-time buffer assignment, not a
measurement on a TPU or GPU.  The CPU fallback fuses, lays out and
schedules differently from the TPU and GPU compilers, and the runtime
reserves some memory, hence the margin.  Compiling the large
configs takes minutes each on a small CPU machine.

Any config value can be overridden as with ``transformer_xl.main``:
``--config.<section>.<key>=value`` (with ``--all``: for every config).
Every run writes a JSON (``--json``, default
``benchmarks/results/fit_<date>_<time>_<host>.json``) with the machine,
versions and every number.  Bad input (unknown config file, preset, key or
device kind) stops with one ``error: ...`` line and exit status 1.

This file turns the command line into jobs, runs each in a subprocess and
prints the table; ``fit_config.py`` loads a config with its overrides into
a job, ``fit_worker.py`` compiles and searches (in the subprocess), and
``common.py`` holds what all benchmark tools share (machine, versions,
result files, subprocesses).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py and the parts below, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
from transformer_xl.compile.report import gib_text, setting_flags  # noqa: E402

import common  # noqa: E402

# fit.py's API, for the tests too: bad input, configs and jobs (fit_config.py), the
# compilation, verdicts and search for a setting that fits (fit_worker.py).
from fit_config import (  # noqa: E402,F401
    DEVICE_MEMORY_GIB,
    GIB,
    FitError,
    Job,
    apply_overrides,
    load_config,
    make_job,
    split_overrides,
    vocab_sizes,
)
from fit_worker import REMAT_ORDER, analyse, candidates, classify, search_fit  # noqa: E402,F401

REPO = common.REPO
PACKAGES = ("jax", "jaxlib", "flax", "optax")  # versions saved with the results

# Every paper config on the slice docs/guide/pods.md recommends (``--all``): the
# large ones with their preset; enwik8_12l (batch 22, no preset divides it)
# on a v3-8 with that page's (data, model) = (2, 4) mesh; the base models,
# which have no preset, on one H100 (the config's own mesh, float32), and
# lm1b_base also on the 4 GPUs of the reference's lm1b_base_gpu.sh.
ALL_CONFIGS = (
    ("configs/enwik8_12l.py", ("--devices=8", "--device_kind=v3", "--config.mesh.shape=(2, 4)")),
    ("configs/enwik8_24l.py:v3-32", ()),
    ("configs/text8_24l.py:v3-32", ()),
    ("configs/wt103_base.py", ()),
    ("configs/wt103_large.py:v3-64", ()),
    ("configs/lm1b_base.py", ()),
    ("configs/lm1b_base.py", ("--devices=4",)),
    ("configs/lm1b_large.py:v3-512", ()),
    ("configs/ptb.py", ()),
)


# ---------------------------------------------------------------------------
# Jobs in subprocesses, the table, the JSON.
# ---------------------------------------------------------------------------


def run_job(job: Job) -> dict:
  """Runs ``analyse`` for ``job`` in a subprocess with job.devices
  simulated CPU devices; returns its result.

  Raises:
    FitError: the subprocess failed (its output is above the message).
  """
  env = common.worker_env([f"--xla_force_host_platform_device_count={job.devices}"])
  code, res = common.run_script(__file__, [f"--worker={json.dumps(dataclasses.asdict(job))}"], env)
  if code != 0:
    raise FitError(f"compiling {job.spec} failed (exit code {code}; its output is above)")
  return res


def verdict_text(step_result: dict, margin: float) -> tuple[str, str]:
  """(FITS / TIGHT / DOES NOT FIT, what makes it fit) for one step's result."""
  verdict = step_result["verdict"]
  if verdict == "FITS":
    return verdict, ""
  search = step_result.get("search")
  if search is None:
    return verdict, "not searched (--no_search)"
  if not search["tried"]:
    return verdict, (
        "already the most frugal remat / attn_block setting: fewer rows or "
        "less state per device (more devices, or arguments sharded further)"
    )
  fix = search["fix"]
  if fix is None:
    low = search["tried"][0]
    return verdict, (
        f"no remat / attn_block setting gets below {100 * (1 - margin):g}% "
        f"(remat={low['remat']}, attn_block={low['attn_block']}: "
        f"{gib_text(low['total_bytes'])} GiB): fewer rows or less state per device "
        "(more devices, or arguments sharded further)"
    )
  note = "" if search["cheapest"] else "; --max_tries reached, a cheaper one may fit"
  flags = " ".join(f"`{f}`" for f in setting_flags(fix, step_result["as_configured"]).split())
  return verdict, f"{flags} ({gib_text(fix['total_bytes'])} GiB{note})"


def format_table(results: list[dict]) -> str:
  """Markdown: one row per config and step, per-device GiB."""
  rows = [
      "| config | slice | mesh | step | remat | attn_block | arguments | outputs "
      "| aliased | temporaries | total | device | % of device | verdict "
      "| what makes it fit |",
      "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
  ]
  for res in results:
    job = res["job"]
    mesh = "(" + ", ".join(f"{k} {v}" for k, v in res["mesh"].items()) + ")"
    for step, sr in res["steps"].items():
      rep = sr["as_configured"]
      verdict, fix = verdict_text(sr, job["margin"])
      pct = 100 * rep["total_bytes"] / (job["device_memory_gib"] * GIB)
      rows.append(
          f"| `{job['spec']}` | {Job(**job).slice_name} | {mesh} | {step} | {rep['remat']} "
          f"| {rep['attn_block']} | {gib_text(rep['argument_bytes'])} | {gib_text(rep['output_bytes'])} "
          f"| {gib_text(rep['alias_bytes'])} | {gib_text(rep['temp_bytes'])} "
          f"| **{gib_text(rep['total_bytes'])}** | {job['device_memory_gib']:g} | {pct:.0f}% "
          f"| {verdict} | {fix} |"
      )
  return "\n".join(rows)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str]]]:
  """The flags and the ``--config.<key>=<value>`` overrides, as (key, value text)."""
  rest, overrides = split_overrides(argv)
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument(
      "--config", default="", help="configs/FILE.py[:PRESET], as for transformer_xl.main"
  )
  p.add_argument(
      "--all",
      action="store_true",
      help="every paper config on its slice (benchmarks/fit.py ALL_CONFIGS)",
  )
  p.add_argument(
      "--devices",
      type=int,
      default=None,
      help="simulated devices (default: the preset's count, else 1)",
  )
  p.add_argument(
      "--device_kind",
      default=None,
      help=f"one of {sorted(DEVICE_MEMORY_GIB)} (default: the preset's, else h100)",
  )
  p.add_argument(
      "--device_memory",
      type=float,
      default=None,
      help="memory of one device in GiB (default: by --device_kind: "
      + ", ".join(f"{k} {v}" for k, v in DEVICE_MEMORY_GIB.items())
      + ")",
  )
  p.add_argument(
      "--vocab",
      type=int,
      default=None,
      help="vocabulary size (default: the dataset's, fit.vocab_sizes)",
  )
  p.add_argument(
      "--margin",
      type=float,
      default=10.0,
      help="percent of the device memory kept free for FITS (below: TIGHT)",
  )
  p.add_argument(
      "--no_search",
      action="store_true",
      help="only the config as given: no remat / attn_block search",
  )
  p.add_argument(
      "--max_tries",
      type=int,
      default=12,
      help="compilations per step at most while searching for a fit",
  )
  p.add_argument(
      "--json",
      default="",
      help="write the results here (default: benchmarks/results/fit_<date>_<time>_<host>.json)",
  )
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # the Job as JSON
  p.add_argument("--result_file", default="", help=argparse.SUPPRESS)
  args = p.parse_args(rest)
  if not args.worker and bool(args.config) == bool(args.all):
    p.error("give --config=configs/FILE.py[:PRESET] or --all")
  if args.all and (args.devices or args.device_kind):
    p.error("--devices / --device_kind apply to one --config, not --all")
  return args, overrides


def main(argv=None) -> int:
  """Analyses every job (``--worker``: one job, in this process); prints the
  table of per-device GiB and writes the JSON.  Returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  args, overrides = parse_args(argv)
  sys.path.insert(0, REPO)
  if args.worker:  # the subprocess: jax sees the simulated devices
    job = Job(**json.loads(args.worker))
    job.overrides = [tuple(o) for o in job.overrides]
    res = analyse(job, log=lambda s: print(s, flush=True))
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  try:
    specs = (
        [(spec, list(extra)) for spec, extra in ALL_CONFIGS] if args.all else [(args.config, [])]
    )
    jobs = []
    for spec, extra in specs:
      rest, extra_overrides = split_overrides(extra)
      opts = dict(a.lstrip("-").split("=", 1) for a in rest)
      devices = int(opts["devices"]) if "devices" in opts else args.devices
      jobs.append(
          make_job(
              spec,
              extra_overrides + overrides,
              devices,
              opts.get("device_kind", args.device_kind),
              args.device_memory,
              args.vocab,
              not args.no_search,
              args.max_tries,
              args.margin / 100,
          )
      )
    info = common.machine_info(PACKAGES)
    info["loadavg"] = info.pop("loadavg_start")  # fit's JSON calls it so
    print(
        f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs, load average "
        f"{' '.join(map(str, info['loadavg']))}; jax {info['versions']['jax']}",
        flush=True,
    )
    results = []
    for job in jobs:
      print(
          f"compiling {job.spec} for {job.devices} device(s) "
          f"({job.slice_name}, {job.device_memory_gib:g} GiB each) ...",
          flush=True,
      )
      results.append(run_job(job))
  except FitError as err:
    sys.exit(f"error: {err}")

  table = format_table(results)
  print()
  print(table)
  print()
  compilers = sorted({r.get("compiled_by", "XLA:CPU") for r in results})
  print(
      "GiB per device (2**30 bytes) from XLA's compile-time memory analysis ("
      + "; ".join(compilers)
      + "), not measured on the accelerator; TPU kinds use the TPU compiler when libtpu is "
      "installed (pip install 'transformer_xl[tpu-compile]'), simulated CPU devices otherwise; "
      "total = arguments + outputs - aliased + "
      f"temporaries + generated code; FITS below {100 - args.margin:g}% of the device, TIGHT "
      "up to 100%."
  )
  common.write_json(
      args.json or common.default_json_path(info["host"], prefix="fit_"),
      {
          "args": {k: v for k, v in vars(args).items() if k not in ("worker", "result_file")},
          "overrides": overrides,
          "machine": info,
          "results": results,
          "table": table,
      },
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
