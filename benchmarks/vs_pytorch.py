"""Throughput of our Transformer-XL against HuggingFace's ``TransfoXLLMHeadModel``.

Run from the repository root (defaults: the model below, 5 repeats of 10
timed steps)::

  python benchmarks/vs_pytorch.py [--steps=10] [--repeats=5] [--threads=N] [--json=FILE]

What is measured, for both implementations with the same model configuration
(default: n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024, vocab 256,
a plain dense softmax with its weights tied to the embedding and a bias,
shared u/v, dropout 0.1, dropatt 0, fp32), the same batch and the same
sequence lengths:

* **train**: one optimizer step = forward, backward, global-norm gradient
  clipping at ``--clip`` (0.25), an Adam update; the memory (tgt_len=mem_len=128
  by default) is carried from step to step.  Ours: ``train.make_train_step``
  (one jitted, donated step; the memory lives in the TrainState).  PyTorch:
  ``model(input_ids, mems=mems, labels=...)``, ``loss.backward()``,
  ``clip_grad_norm_``, ``torch.optim.Adam.step()``; ``mems`` is the previous
  step's ``out.mems``.
* **eval**: scoring segments of ``--eval_tgt_len`` (128) with a memory of
  ``--eval_mem_len`` (512), no dropout, no gradient, the memory carried.
  Ours: a jitted ``model.apply`` with the evaluation ModelConfig
  (``evaluate.eval_model_config``; the same step as ``evaluate.Evaluator``,
  memory donated).  PyTorch: the same forward under ``torch.no_grad()`` with
  ``reset_memory_length(eval_mem_len)``.

tokens/s = batch * tgt_len * steps / seconds for one repeat of ``--steps``
steps, after ``--warmup`` untimed steps (compilation, first steps); the
median over ``--repeats`` is reported (min and max go to the JSON).  Inputs
are random token ids, prepared before timing (a few distinct batches,
cycled), so no input pipeline is timed.

Fairness:

* Each implementation runs in its own subprocess, one after the other (ours
  first unless ``--order=pytorch_first``), so the JAX/XLA and torch thread
  pools never coexist in one process and each gets the whole machine.  The
  parent process imports neither.
* Both use the same number of threads, ``--threads`` (default: all CPUs
  available to the process): torch via ``torch.set_num_threads(N)``; XLA:CPU
  sizes its intra-op pool from the CPUs the process may run on, so when N is
  below the core count both subprocesses are pinned to the same N CPUs
  (``os.sched_setaffinity``), and torch is given N threads on them.
* ``XLA_FLAGS`` for our subprocess is the caller's, minus
  ``--xla_force_host_platform_device_count`` (the test suite's 8 simulated
  devices), plus ``--xla_flags`` if given; by default nothing else, i.e. XLA's
  own CPU defaults.  Ours runs on a 1x1 mesh of one CPU device.
  ``--malloc_hugepages`` sets ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` for
  both subprocesses (off by default; the README's benchmark section says why
  it matters to XLA:CPU and not to torch).
* HF's ``labels`` are shifted inside the model, so its loss covers
  tgt_len - 1 positions per row and ours tgt_len; both count batch * tgt_len
  tokens per step.  HF initialises its memory with mem_len zero states (its
  ``init_mems``) and ours with mem_len masked slots: the same shapes and
  work from the first step.

The table (markdown) gives tokens/s of ours and PyTorch's and the ratio; the
machine (CPU model, cores, load average before and after each subprocess)
and library versions are printed with it and saved by ``--json``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  g = p.add_argument_group("model (the same for both)")
  g.add_argument("--n_layer", type=int, default=6)
  g.add_argument("--d_model", type=int, default=256)
  g.add_argument("--n_head", type=int, default=8)
  g.add_argument("--d_head", type=int, default=32)
  g.add_argument("--d_inner", type=int, default=1024)
  g.add_argument("--vocab", type=int, default=256, help="n_token; dense softmax (no cutoffs)")
  g.add_argument("--dropout", type=float, default=0.1)
  g.add_argument("--dropatt", type=float, default=0.0)
  g = p.add_argument_group("training")
  g.add_argument("--batch", type=int, default=8)
  g.add_argument("--tgt_len", type=int, default=128)
  g.add_argument("--mem_len", type=int, default=128)
  g.add_argument("--clip", type=float, default=0.25, help="global gradient-norm clip")
  g.add_argument("--lr", type=float, default=2.5e-4, help="Adam learning rate (constant)")
  g = p.add_argument_group("evaluation")
  g.add_argument("--eval_batch", type=int, default=0, help="0 = --batch")
  g.add_argument("--eval_tgt_len", type=int, default=128)
  g.add_argument("--eval_mem_len", type=int, default=512)
  g.add_argument("--eval_same_length", type=int, default=1, choices=(0, 1),
                 help="same_length attention in eval (our eval default)")
  g = p.add_argument_group("measurement")
  g.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
  g.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
  g.add_argument("--warmup", type=int, default=3,
                 help="untimed steps first (compilation; memory filling up)")
  g.add_argument("--threads", type=int, default=0,
                 help="threads for both (0 = all CPUs this process may use)")
  g.add_argument("--phases", default="train,eval", help="comma list of train, eval")
  g.add_argument("--which", default="ours,pytorch", help="comma list of ours, pytorch")
  g.add_argument("--order", default="ours_first", choices=("ours_first", "pytorch_first"))
  g.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our subprocess")
  g.add_argument("--malloc_hugepages", action="store_true",
                 help="GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for both subprocesses: "
                      "malloc asks for transparent huge pages (see README)")
  g.add_argument("--seed", type=int, default=0)
  g.add_argument("--json", default="", help="write config, machine info and results here")
  # Internal: the subprocess entry point.
  p.add_argument("--worker", default="", choices=("", "ours", "pytorch"), help=argparse.SUPPRESS)
  p.add_argument("--result_file", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.eval_batch <= 0:
    args.eval_batch = args.batch
  return args


# ---------------------------------------------------------------------------
# Shared helpers (no jax / torch imports here).
# ---------------------------------------------------------------------------

def _token_batches(args, batch: int, tgt_len: int, n: int = 4):
  """n distinct (inputs, targets) int32 numpy pairs [batch, tgt_len], from one
  random stream per row (targets = inputs shifted by one)."""
  import numpy as np
  rng = np.random.default_rng(args.seed)
  stream = rng.integers(0, args.vocab, size=(batch, n * tgt_len + 1), dtype=np.int64)
  return [(stream[:, i * tgt_len:(i + 1) * tgt_len].astype(np.int32),
           stream[:, i * tgt_len + 1:(i + 1) * tgt_len + 1].astype(np.int32)) for i in range(n)]


def _time_repeats(run_steps, args) -> dict:
  """Times ``args.repeats`` calls of ``run_steps(args.steps)``, after one
  untimed ``run_steps(args.warmup)``.

  Returns {"seconds": wall seconds per repeat, "cpu_seconds": process CPU
  seconds (all threads, user + system) per repeat, "sys_seconds": system
  time over all repeats, "minor_faults": page faults over all repeats}.
  """
  if args.warmup:
    run_steps(args.warmup)
  times, cpu = [], []
  ru0 = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(args.repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    run_steps(args.steps)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  ru1 = resource.getrusage(resource.RUSAGE_SELF)
  return {"seconds": times, "cpu_seconds": cpu, "sys_seconds": ru1.ru_stime - ru0.ru_stime,
          "minor_faults": ru1.ru_minflt - ru0.ru_minflt}


def _summary(timing: dict, tokens_per_step: int, steps: int) -> dict:
  """tokens/s per repeat and their median, plus diagnostics per step.

  ``cpu_per_wall`` (process CPU seconds per wall second, all threads) shows
  how many cores the run got: well below --threads means other processes
  took CPU time (or the run could not use all threads).  ``sys_ms_per_step``
  and ``minor_faults_per_step`` show time in the kernel, mostly first
  touches of freshly mapped buffers.
  """
  times, n = timing["seconds"], steps * len(timing["seconds"])
  tps = [tokens_per_step * steps / t for t in times]
  return {"tokens_per_step": tokens_per_step, "steps": steps, "seconds": times,
          "tokens_per_sec": tps, "median_tokens_per_sec": statistics.median(tps),
          "min_tokens_per_sec": min(tps), "max_tokens_per_sec": max(tps),
          "median_ms_per_step": 1e3 * statistics.median(times) / steps,
          "cpu_per_wall": [c / t for c, t in zip(timing["cpu_seconds"], times)],
          "sys_ms_per_step": 1e3 * timing["sys_seconds"] / n,
          "minor_faults_per_step": timing["minor_faults"] / n}


# ---------------------------------------------------------------------------
# Ours (JAX / Flax).
# ---------------------------------------------------------------------------

def run_ours(args) -> dict:
  """Times our jitted train step and eval step; returns the result dict."""
  sys.path.insert(0, REPO)
  import jax
  import numpy as np
  from transformer_xl import default_config, evaluate, models, sharding, train, train_state

  config = default_config.get_config()
  config.model.update(n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head,
                      d_head=args.d_head, d_inner=args.d_inner, dropout=args.dropout,
                      dropatt=args.dropatt, tgt_len=args.tgt_len, mem_len=args.mem_len,
                      clamp_len=0, same_length=False, untie_r=False, tie_weight=True,
                      dtype="float32", remat="none", cutoffs=(), div_val=1)
  config.train.update(global_batch=args.batch, batch_chunk=1, warmup_steps=0,
                      learning_rate=args.lr, min_lr=args.lr, clip=args.clip,
                      num_steps=10**9, seed=args.seed)
  config.eval.update(tgt_len=args.eval_tgt_len, mem_len=args.eval_mem_len, clamp_len=0,
                     same_length=bool(args.eval_same_length), global_batch=args.eval_batch)
  mcfg = default_config.model_config(config, args.vocab)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, state_shardings = train_state.abstract_train_state(model, tx, args.batch, mesh)
  state = train_state.create_train_state(model, tx, args.batch, mesh,
                                         jax.random.PRNGKey(args.seed), state_shardings)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  out = {"n_params": n_params, "device": str(jax.devices()[0]),
         "xla_flags": os.environ.get("XLA_FLAGS", "")}
  phases = args.phases.split(",")

  if "train" in phases:
    train_step = train.make_train_step(model, tx, mesh, state_shardings, 1, args.seed)
    batches = [jax.device_put(
        {"inputs": x, "targets": y, "weights": np.ones(x.shape, np.float32),
         "reset": np.zeros((args.batch,), bool)},
        {"inputs": sharding.batch_sharding(mesh), "targets": sharding.batch_sharding(mesh),
         "weights": sharding.batch_sharding(mesh), "reset": sharding.rows_sharding(mesh)})
        for x, y in _token_batches(args, args.batch, args.tgt_len)]
    holder = {"state": state, "i": 0}

    def run_train(n):
      s, m = holder["state"], None
      for _ in range(n):
        s, m = train_step(s, batches[holder["i"] % len(batches)])
        holder["i"] += 1
      jax.block_until_ready((s, m))
      holder["state"] = s
      holder["loss"] = float(m["loss"])

    out["train"] = _summary(_time_repeats(run_train, args), args.batch * args.tgt_len,
                            args.steps)
    out["train"]["last_loss"] = holder["loss"]
    state = holder["state"]

  if "eval" in phases:
    ecfg = evaluate.eval_model_config(config, mcfg)
    emodel = models.TransformerXL(ecfg)
    eval_step = evaluate.make_eval_step(emodel, mesh)  # the Evaluator's step
    mem_sharding, batch_sharding = sharding.memory_sharding(mesh), sharding.batch_sharding(mesh)
    params = state.params
    batches = [jax.device_put(
        {"inputs": x, "targets": y, "reset": np.zeros((args.eval_batch,), bool)},
        {"inputs": batch_sharding, "targets": batch_sharding,
         "reset": sharding.rows_sharding(mesh)})
        for x, y in _token_batches(args, args.eval_batch, args.eval_tgt_len)]
    memory = jax.jit(lambda: models.init_memory(ecfg, args.eval_batch),
                     out_shardings=mem_sharding)()
    holder = {"memory": memory, "i": 0}

    def run_eval(n):
      mem, nll = holder["memory"], None
      for _ in range(n):
        nll, mem = eval_step(params, mem, batches[holder["i"] % len(batches)])
        holder["i"] += 1
      jax.block_until_ready((nll, mem))
      holder["memory"] = mem

    out["eval"] = _summary(_time_repeats(run_eval, args), args.eval_batch * args.eval_tgt_len,
                           args.steps)
  return out


# ---------------------------------------------------------------------------
# PyTorch (HuggingFace transformers).
# ---------------------------------------------------------------------------

def hf_config(args, mem_len: int, same_length: bool):
  """The TransfoXLConfig equal to our model: dense softmax (no cutoffs,
  div_val 1, d_embed = d_model), tied output weights with a bias, shared
  u/v (untie_r=False), no clamp."""
  from transformers import TransfoXLConfig
  return TransfoXLConfig(
      vocab_size=args.vocab, cutoffs=[], div_val=1, adaptive=True, d_model=args.d_model,
      d_embed=args.d_model, n_head=args.n_head, d_head=args.d_head, d_inner=args.d_inner,
      n_layer=args.n_layer, mem_len=mem_len, clamp_len=0, same_length=same_length,
      untie_r=False, pre_lnorm=False, attn_type=0, dropout=args.dropout, dropatt=args.dropatt,
      tie_word_embeddings=True, proj_share_all_but_first=False, sample_softmax=-1)


def run_pytorch(args) -> dict:
  """Times HF TransfoXLLMHeadModel training and eval steps; returns the result dict."""
  import warnings
  warnings.filterwarnings("ignore")
  import torch
  from transformers import TransfoXLLMHeadModel
  from transformers.utils import logging as hf_logging
  hf_logging.set_verbosity_error()

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  model = TransfoXLLMHeadModel(hf_config(args, args.mem_len, same_length=False))
  n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
  out = {"n_params": n_params, "torch_threads": torch.get_num_threads(),
         "torch_config": torch.__config__.parallel_info()}
  phases = args.phases.split(",")

  if "train" in phases:
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    # HF shifts labels inside (hidden t predicts labels t+1): pass the inputs.
    batches = [torch.from_numpy(x).long() for x, _ in
               _token_batches(args, args.batch, args.tgt_len)]
    holder = {"mems": None, "i": 0}

    def run_train(n):
      mems = holder["mems"]
      for _ in range(n):
        x = batches[holder["i"] % len(batches)]
        holder["i"] += 1
        res = model(input_ids=x, mems=mems, labels=x)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mems = res.mems  # detached by HF (_update_mems runs under no_grad)
      holder["mems"] = mems
      holder["loss"] = float(res.loss)

    out["train"] = _summary(_time_repeats(run_train, args), args.batch * args.tgt_len,
                            args.steps)
    out["train"]["last_loss"] = holder["loss"]

  if "eval" in phases:
    model.eval()
    model.reset_memory_length(args.eval_mem_len)
    model.transformer.same_length = bool(args.eval_same_length)
    batches = [torch.from_numpy(x).long() for x, _ in
               _token_batches(args, args.eval_batch, args.eval_tgt_len)]
    holder = {"mems": None, "i": 0}

    def run_eval(n):
      mems = holder["mems"]
      with torch.no_grad():
        for _ in range(n):
          x = batches[holder["i"] % len(batches)]
          holder["i"] += 1
          res = model(input_ids=x, mems=mems, labels=x)
          mems = res.mems
      holder["mems"] = mems

    out["eval"] = _summary(_time_repeats(run_eval, args), args.eval_batch * args.eval_tgt_len,
                           args.steps)
  return out


# ---------------------------------------------------------------------------
# The parent: machine info, subprocesses, table.
# ---------------------------------------------------------------------------

def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def _version(pkg: str) -> str:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def machine_info() -> dict:
  return {
      "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
      "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
      "cpus_available": len(os.sched_getaffinity(0)),
      "loadavg_start": [round(x, 2) for x in os.getloadavg()],
      "platform": platform.platform(), "python": platform.python_version(),
      "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "torch",
                                            "transformers", "numpy")},
  }


def _worker_env(args, which: str) -> dict:
  env = dict(os.environ)
  if which == "ours":
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    flags += args.xla_flags.split()
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
  if args.malloc_hugepages:
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    env["GLIBC_TUNABLES"] = ":".join(tunables + ["glibc.malloc.hugetlb=1"])
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run_worker(args, which: str, argv: list[str]) -> dict:
  """Runs this script with --worker=which in a subprocess; returns its results."""
  with tempfile.TemporaryDirectory() as tmp:
    result_file = os.path.join(tmp, "result.json")
    cmd = [sys.executable, os.path.abspath(__file__), *argv, f"--worker={which}",
           f"--result_file={result_file}", f"--threads={args.threads}"]
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    env = _worker_env(args, which)
    proc = subprocess.run(cmd, env=env, cwd=REPO)
    if proc.returncode != 0:
      raise SystemExit(f"{which} benchmark subprocess failed with exit code {proc.returncode}")
    with open(result_file) as f:
      res = json.load(f)
  res["env"] = {k: env[k] for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "OMP_NUM_THREADS") if k in env}
  res["wall_seconds"] = round(time.perf_counter() - t0, 1)
  res["loadavg_before"] = load_before
  res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
  return res


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:,.0f}"


def format_table(args, results: dict) -> str:
  """The markdown table: one row per phase; ours, PyTorch and ours/PyTorch."""
  rows = ["| phase | ours tokens/s | PyTorch tokens/s | ratio ours/PyTorch |",
          "|---|---:|---:|---:|"]
  labels = {"train": (f"train (B={args.batch}, tgt_len={args.tgt_len}, "
                      f"mem_len={args.mem_len})"),
            "eval": (f"eval (B={args.eval_batch}, tgt_len={args.eval_tgt_len}, "
                     f"mem_len={args.eval_mem_len})")}
  for phase in args.phases.split(","):
    o = results.get("ours", {}).get(phase, {}).get("median_tokens_per_sec")
    t = results.get("pytorch", {}).get(phase, {}).get("median_tokens_per_sec")
    ratio = f"{o / t:.2f}x" if o and t else "-"
    rows.append(f"| {labels[phase]} | {_fmt(o)} | {_fmt(t)} | {ratio} |")
  return "\n".join(rows)


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  available = sorted(os.sched_getaffinity(0))
  if args.threads <= 0:
    args.threads = len(available)
  if args.threads < len(available):
    # XLA:CPU sizes its pool from the CPUs it may use: pin both workers to the same N.
    os.sched_setaffinity(0, available[:args.threads])

  if args.worker:
    res = run_ours(args) if args.worker == "ours" else run_pytorch(args)
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  which = [w for w in args.which.split(",") if w]
  if args.order == "pytorch_first":
    which = sorted(which, key=lambda w: w != "pytorch")
  info = machine_info()
  info["threads"] = args.threads
  print(f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs ({info['cpus_available']} "
        f"available), {args.threads} threads for both; load average "
        f"{' '.join(map(str, info['loadavg_start']))}", flush=True)
  results = {}
  for w in which:
    print(f"running {w} ...", flush=True)
    results[w] = run_worker(args, w, argv)
    r = results[w]
    for phase in args.phases.split(","):
      if phase in r:
        print(f"  {w} {phase}: median {r[phase]['median_tokens_per_sec']:,.0f} tokens/s "
              f"({r[phase]['median_ms_per_step']:.1f} ms/step; repeats: "
              + ", ".join(f"{x:,.0f}" for x in r[phase]["tokens_per_sec"]) + "; CPU/wall: "
              + ", ".join(f"{x:.2f}" for x in r[phase]["cpu_per_wall"])
              + f"; per step: {r[phase]['sys_ms_per_step']:.0f} ms system time, "
              f"{r[phase]['minor_faults_per_step']:,.0f} page faults)", flush=True)
  info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

  print()
  print(format_table(args, results))
  print()
  counts = {w: results[w]["n_params"] for w in results}
  same = len(set(counts.values())) == 1
  print("parameters: " + ", ".join(f"{w} {n:,}" for w, n in counts.items())
        + ("" if len(counts) < 2 else (" (equal)" if same else " (DIFFERENT)")))
  v = info["versions"]
  print(f"machine: {info['cpu']}, {info['cpu_count']} CPUs, {args.threads} threads; load average "
        + "; ".join(f"{w} {results[w]['loadavg_before'][0]}->{results[w]['loadavg_after'][0]}"
                    for w in results)
        + f" (1-min, before->after); python {info['python']}, jax {v['jax']}, "
        f"flax {v['flax']}, optax {v['optax']}, torch {v['torch']}, "
        f"transformers {v['transformers']}")
  print(f"steps {args.steps} x repeats {args.repeats} (median), warmup {args.warmup}; order: "
        + " then ".join(which) + ", separate subprocesses")
  for w in results:
    if results[w]["env"]:
      print(f"{w} environment: " + ", ".join(f"{k}={v!r}" for k, v in results[w]["env"].items()))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": {k: v for k, v in vars(args).items()
                          if k not in ("worker", "result_file")},
                 "machine": info, "results": results,
                 "table": format_table(args, results)}, f, indent=2)
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
