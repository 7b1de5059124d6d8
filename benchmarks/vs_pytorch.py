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
  by default) is carried from step to step.  Ours: ``train.make_train_step``
  (one jitted, donated step; the memory lives in the TrainState).  PyTorch:
  ``model(input_ids, mems=mems, labels=...)``, ``loss.backward()``,
  ``clip_grad_norm_``, ``torch.optim.Adam.step()``; ``mems`` is the previous
  step's ``out.mems``.
* **eval**: scoring segments of ``--eval_tgt_len`` (128) with a memory of
  ``--eval_mem_len`` (512), no dropout, no gradient, the memory carried.
  Ours: ``evaluate.make_eval_step`` (the ``Evaluator``'s jitted step, memory
  donated) with the evaluation ModelConfig (``evaluate.eval_model_config``).
  PyTorch: the same forward under ``torch.no_grad()`` with
  ``reset_memory_length(eval_mem_len)``.
* **eval_long**: the same as eval with a memory of ``--eval_long_mem_len``
  (2048): the long-memory case, where the [B, H, T, M+T] attention
  temporaries dominate.

Ours uses ``model.attn_block`` = ``--block`` (queries per block of the
blockwise attention, 0 = the full computation); without ``--block``,
``default_config``'s -1, which ``models.attn_block_size`` resolves per
backend and phase (on CPU: 64 in training, 0 in evaluation); likewise
``model.scan_unroll`` = ``--scan_unroll`` (layers per iteration of the loop
over layers; default -1, ``models.scan_unroll_layers``: all 6 on CPU).  The
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
* **% of matmul limit** = model FLOPs per token (:func:`model_flops_per_token`)
  x tokens/s / the machine's float32 matrix-multiply limit.  The limit is
  measured in the same run, by every worker right after its timed steps,
  on its threads and CPUs (:func:`measure_matmul`): the fastest of
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
  transformer_xl.main`` does for itself (``transformer_xl.host_memory``:
  malloc asks for transparent huge pages for XLA:CPU's per-step buffers);
  ``--malloc_hugepages=0`` runs ours without.  PyTorch runs in the caller's
  environment, its own default: with the tunable its training ran at half
  speed on the README's CPU (634 against 1,192 tokens/s);
  ``--pytorch_malloc_hugepages=1`` gives it the tunable too.
* Both workers hand the memory that glibc holds free back to the kernel
  (``host_memory.release_free_memory``, ``malloc_trim``): ours after every
  XLA compilation (``host_memory.release_after_compiles``), as our command
  line and training loop do; PyTorch once, after creating the model and
  its optimizer (it compiles nothing).
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
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")
PHASES = ("train", "eval", "eval_long")
IMPLEMENTATIONS = ("ours", "pytorch")

# --smoke: tiny sizes (explicit flags still win), so the whole tool runs in seconds.
SMOKE = dict(n_layer=1, d_model=32, n_head=2, d_head=16, d_inner=64, vocab=32, batch=2,
             tgt_len=8, mem_len=8, eval_tgt_len=8, eval_mem_len=16, eval_long_mem_len=32,
             steps=2, repeats=1, warmup=1, matmul_n=256, matmul_repeats=2)


def parse_args(argv=None) -> argparse.Namespace:
  argv = sys.argv[1:] if argv is None else argv
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
  g.add_argument("--block", type=int, default=None,
                 help="our model.attn_block: queries per attention block (0 = the full "
                      "[B, H, T, K] computation); default: default_config's -1, per "
                      "backend and phase")
  g.add_argument("--scan_unroll", type=int, default=None,
                 help="our model.scan_unroll: layers per iteration of the loop over layers; "
                      "default: default_config's -1, per backend")
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
  g.add_argument("--eval_long_mem_len", type=int, default=2048,
                 help="memory of the eval_long phase")
  g.add_argument("--eval_same_length", type=int, default=1, choices=(0, 1),
                 help="same_length attention in eval (our eval default)")
  g = p.add_argument_group("measurement")
  g.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
  g.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
  g.add_argument("--warmup", type=int, default=3,
                 help="untimed steps first (compilation; memory filling up)")
  g.add_argument("--threads", type=int, default=0,
                 help="threads for both (0 = all CPUs this process may use)")
  g.add_argument("--phases", default=",".join(PHASES), help="comma list of " + ", ".join(PHASES))
  g.add_argument("--which", default="ours,pytorch", help="comma list of ours, pytorch")
  g.add_argument("--order", default="ours_first", choices=("ours_first", "pytorch_first"))
  g.add_argument("--matmul_n", type=int, default=2048,
                 help="N of the N x N float32 matmul that measures the machine's limit")
  g.add_argument("--matmul_repeats", type=int, default=5,
                 help="timed matmuls per library (the fastest counts)")
  g.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our subprocess")
  g.add_argument("--malloc_hugepages", type=int, default=1, choices=(0, 1),
                 help="1: glibc.malloc.hugetlb=1 in GLIBC_TUNABLES for our subprocess, "
                      "as our command line sets it (transformer_xl.host_memory)")
  g.add_argument("--pytorch_malloc_hugepages", type=int, default=0, choices=(0, 1),
                 help="1: the same for the PyTorch subprocess (it slowed torch's training "
                      "down 2x on the README's CPU)")
  g.add_argument("--seed", type=int, default=0)
  g.add_argument("--smoke", action="store_true",
                 help="tiny model, 1 repeat of 2 steps, small matmul: checks the tool in "
                      "seconds; the numbers mean nothing")
  g = p.add_argument_group("results")
  g.add_argument("--json", default="",
                 help="write settings, machine, versions and results here (default: "
                      "benchmarks/results/<date>_<time>_<host>.json; --smoke: a temp dir)")
  g.add_argument("--compare", default="", metavar="OLD.json",
                 help="print every number beside OLD.json's, with the change")
  g.add_argument("--new", default="", metavar="NEW.json",
                 help="with --compare: compare NEW.json to OLD.json and run nothing")
  g.add_argument("--tolerance", type=float, default=5.0,
                 help="--compare flags changes for the worse beyond this many percent")
  # Internal: the subprocess entry point.
  p.add_argument("--worker", default="", choices=("", "ours", "pytorch"),
                 help=argparse.SUPPRESS)
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
  """(batch, tgt_len, mem_len) of a phase."""
  if phase == "train":
    return args.batch, args.tgt_len, args.mem_len
  mem_len = args.eval_long_mem_len if phase == "eval_long" else args.eval_mem_len
  return args.eval_batch, args.eval_tgt_len, mem_len


def model_flops_per_token(n_layer: int, d_model: int, n_head: int, d_head: int, d_inner: int,
                          vocab: int, batch: int, tgt_len: int, mem_len: int,
                          train: bool) -> float:
  """Matrix-multiply FLOPs per predicted token of a Transformer-XL step.

  2 FLOPs per multiply-add; T = tgt_len, M = mem_len, K = T + M keys,
  H x Dh heads.  Per layer and token: the q projection (2 d H Dh), the k and
  v projections of all K rows (the memory is re-projected every segment:
  4 d H Dh K / T), ``r_net`` over the K sinusoid rows, shared by the batch
  (2 d H Dh K / (B T)), the (a)+(c) scores over K keys (2 H Dh K), the
  (b)+(d) scores against all K distances before the shift (2 H Dh K), the
  probabilities times the values (2 H Dh K), ``o_net`` (2 H Dh d) and the
  feed-forward (4 d d_inner); then the dense softmax layer (2 d vocab).
  Masked keys count (the dense computation does them).  Not counted:
  element-wise work (softmax, LayerNorm, dropout, the optimizer) and the
  q rows of the memory that a fused qkv projection computes and drops.
  Training counts 3x the forward (the backward pass is twice its matmuls;
  Kaplan et al. 2020, Sec. 2.1).

  Returns:
    FLOPs per token (batch * tgt_len tokens a step).
  """
  hd, k = n_head * d_head, tgt_len + mem_len
  per_layer = (2 * d_model * hd + 4 * d_model * hd * k / tgt_len
               + 2 * d_model * hd * k / (batch * tgt_len) + 3 * 2 * hd * k
               + 2 * hd * d_model + 4 * d_model * d_inner)
  forward = n_layer * per_layer + 2 * d_model * vocab
  return 3 * forward if train else forward


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


def rss_mib(field: str = "VmHWM") -> float:
  """This process's resident set in MiB: ``field`` of /proc/self/status
  ("VmHWM" = the peak so far, "VmRSS" = now).  Where /proc is missing, the
  peak from ``getrusage`` (ru_maxrss: KiB on Linux, bytes on macOS)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024  # kB
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure_matmul(args, products: dict) -> dict:
  """float32 GFLOP/s of an N x N by N x N product (2 N^3 FLOPs), N =
  ``--matmul_n``, by each library: the fastest of ``--matmul_repeats``
  timed calls after one untimed call.

  Args:
    products: {library name: make(a, b) -> a function computing a @ b to
      completion}, for numpy float32 arrays a, b.

  Returns:
    {"n": N, "<name>_gflops": GFLOP/s for each library}.
  """
  import numpy as np
  n = args.matmul_n
  rng = np.random.default_rng(args.seed)
  a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  out = {"n": n}
  for name, make in products.items():
    fn = make(a, b)
    fn()
    times = []
    for _ in range(args.matmul_repeats):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    out[f"{name}_gflops"] = 2 * n**3 / min(times) / 1e9
  return out


def _numpy_dot(a, b):
  import numpy as np
  return lambda: np.dot(a, b)


# ---------------------------------------------------------------------------
# Ours (JAX / Flax).
# ---------------------------------------------------------------------------

def run_ours(args, phase: str) -> dict:
  """Times our jitted train step or eval step for one phase; returns its result dict."""
  sys.path.insert(0, REPO)
  import flax.linen as nn
  import jax
  import numpy as np
  from transformer_xl import (default_config, evaluate, host_memory, models, sharding, train,
                              train_state)
  rss_imports = rss_mib("VmRSS")
  host_memory.release_after_compiles()  # as our command line and training loop do

  config = default_config.get_config()
  config.model.update(n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head,
                      d_head=args.d_head, d_inner=args.d_inner, dropout=args.dropout,
                      dropatt=args.dropatt, tgt_len=args.tgt_len, mem_len=args.mem_len,
                      clamp_len=0, same_length=False, untie_r=False, tie_weight=True,
                      dtype="float32", remat="none", cutoffs=(), div_val=1)
  if args.block is not None:
    config.model.attn_block = args.block
  if args.scan_unroll is not None:
    config.model.scan_unroll = args.scan_unroll
  config.train.update(global_batch=args.batch, batch_chunk=1, warmup_steps=0,
                      learning_rate=args.lr, min_lr=args.lr, clip=args.clip,
                      num_steps=10**9, seed=args.seed)
  batch, tgt_len, mem_len = phase_lengths(args, phase)
  config.eval.update(tgt_len=tgt_len, mem_len=mem_len, clamp_len=0,
                     same_length=bool(args.eval_same_length), global_batch=args.eval_batch)
  mcfg = default_config.model_config(config, args.vocab)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  rng = jax.random.PRNGKey(args.seed)
  _, state_shardings = train_state.abstract_train_state(model, tx, args.batch, mesh)
  out = {"device": str(jax.devices()[0]), "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "attn_block": models.attn_block_size(mcfg.attn_block, deterministic=phase != "train"),
         "scan_unroll": models.scan_unroll_layers(mcfg.scan_unroll, mcfg.n_layer),
         "rss_after_imports_mib": rss_imports}

  if phase == "train":
    state = train_state.create_train_state(model, tx, args.batch, mesh, rng, state_shardings)
    out["n_params"] = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    batches = [jax.device_put(
        {"inputs": x, "targets": y, "weights": np.ones(x.shape, np.float32),
         "reset": np.zeros((batch,), bool)},
        {"inputs": sharding.batch_sharding(mesh), "targets": sharding.batch_sharding(mesh),
         "weights": sharding.batch_sharding(mesh), "reset": sharding.rows_sharding(mesh)})
        for x, y in _token_batches(args, batch, tgt_len)]
    train_step = train.make_train_step(model, tx, mesh, state_shardings, 1, args.seed)
    holder = {"state": state, "i": 0}
    del state  # donated by the first step

    def run_train(n):
      s, m = holder["state"], None
      for _ in range(n):
        s, m = train_step(s, batches[holder["i"] % len(batches)])
        holder["i"] += 1
      jax.block_until_ready((s, m))
      holder["state"] = s
      holder["loss"] = float(m["loss"])

    out.update(_summary(_time_repeats(run_train, args), batch * tgt_len, args.steps))
    out["last_loss"] = holder["loss"]
  else:
    # Parameters only (no optimizer state): what an evaluation holds.
    params = jax.jit(lambda r: nn.unbox(models.init_params(model, r)),
                     out_shardings=state_shardings.params)(rng)
    out["n_params"] = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    ecfg = evaluate.eval_model_config(config, mcfg)
    eval_step = evaluate.make_eval_step(models.TransformerXL(ecfg), mesh)  # the Evaluator's
    batch_sharding = sharding.batch_sharding(mesh)
    batches = [jax.device_put(
        {"inputs": x, "targets": y, "reset": np.zeros((batch,), bool)},
        {"inputs": batch_sharding, "targets": batch_sharding,
         "reset": sharding.rows_sharding(mesh)})
        for x, y in _token_batches(args, batch, tgt_len)]
    memory = jax.jit(lambda: models.init_memory(ecfg, batch),
                     out_shardings=sharding.memory_sharding(mesh))()
    holder = {"memory": memory, "i": 0}
    del memory  # donated by the first step

    def run_eval(n):
      mem, nll = holder["memory"], None
      for _ in range(n):
        nll, mem = eval_step(params, mem, batches[holder["i"] % len(batches)])
        holder["i"] += 1
      jax.block_until_ready((nll, mem))
      holder["memory"] = mem

    out.update(_summary(_time_repeats(run_eval, args), batch * tgt_len, args.steps))
  out["peak_rss_mib"] = rss_mib("VmHWM")

  def jax_dot(a, b):
    import jax.numpy as jnp
    dot, xa, xb = jax.jit(jnp.dot), jax.device_put(a), jax.device_put(b)
    return lambda: dot(xa, xb).block_until_ready()

  out["matmul"] = measure_matmul(args, {"numpy": _numpy_dot, "jax": jax_dot})
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


def run_pytorch(args, phase: str) -> dict:
  """Times HF TransfoXLLMHeadModel training or evaluation for one phase;
  returns its result dict."""
  import warnings
  warnings.filterwarnings("ignore")
  import torch
  from transformers import TransfoXLLMHeadModel
  from transformers.utils import logging as hf_logging
  hf_logging.set_verbosity_error()
  sys.path.insert(0, REPO)
  from transformer_xl import host_memory  # stdlib only: no jax in this process
  rss_imports = rss_mib("VmRSS")

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  batch, tgt_len, mem_len = phase_lengths(args, phase)
  model = TransfoXLLMHeadModel(hf_config(args, args.mem_len, same_length=False))
  out = {"n_params": sum(p.numel() for p in model.parameters()),  # tied weights counted once
         "torch_threads": torch.get_num_threads(),
         "torch_config": torch.__config__.parallel_info(),
         "rss_after_imports_mib": rss_imports}
  # HF shifts labels inside (hidden t predicts labels t+1): pass the inputs.
  batches = [torch.from_numpy(x).long() for x, _ in _token_batches(args, batch, tgt_len)]
  holder = {"mems": None, "i": 0}
  host_memory.release_free_memory()  # once its setup is done (ours: after each compilation)

  if phase == "train":
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)

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

    out.update(_summary(_time_repeats(run_train, args), batch * tgt_len, args.steps))
    out["last_loss"] = holder["loss"]
  else:
    model.eval()
    model.reset_memory_length(mem_len)
    model.transformer.same_length = bool(args.eval_same_length)

    def run_eval(n):
      mems = holder["mems"]
      with torch.no_grad():
        for _ in range(n):
          x = batches[holder["i"] % len(batches)]
          holder["i"] += 1
          mems = model(input_ids=x, mems=mems, labels=x).mems
      holder["mems"] = mems

    out.update(_summary(_time_repeats(run_eval, args), batch * tgt_len, args.steps))
  out["peak_rss_mib"] = rss_mib("VmHWM")

  def torch_mm(a, b):
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return lambda: torch.mm(ta, tb)

  out["matmul"] = measure_matmul(args, {"numpy": _numpy_dot, "torch": torch_mm})
  return out


# ---------------------------------------------------------------------------
# The parent: machine info, subprocesses, table, JSON, comparison.
# ---------------------------------------------------------------------------

def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), or platform.processor()."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def _memory_gib() -> float | None:
  """Physical memory (MemTotal of /proc/meminfo) in GiB; None where unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) / 2**20, 1)
  except OSError:
    pass
  return None


def _version(pkg: str) -> str:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def machine_info() -> dict:
  """Date, host, CPU model, CPU count, memory (GiB), load average, versions."""
  return {
      "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
      "host": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
      "cpus_available": len(os.sched_getaffinity(0)), "memory_gib": _memory_gib(),
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
  if args.malloc_hugepages if which == "ours" else args.pytorch_malloc_hugepages:
    if REPO not in sys.path:  # this checkout's transformer_xl (host_memory: stdlib only)
      sys.path.insert(0, REPO)
    from transformer_xl import host_memory
    env = host_memory.hugepages_environ(env) or env
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run_worker(args, which: str, argv: list[str], phase: str = "") -> dict:
  """Runs this script with --worker=which (--phase=phase) in a subprocess;
  returns its results plus the environment, wall seconds and load average.

  Raises:
    SystemExit: the subprocess failed (its output is above the message).
  """
  with tempfile.TemporaryDirectory() as tmp:
    result_file = os.path.join(tmp, "result.json")
    cmd = [sys.executable, os.path.abspath(__file__), *argv, f"--worker={which}",
           f"--result_file={result_file}", f"--threads={args.threads}"]
    if phase:
      cmd.append(f"--phase={phase}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    env = _worker_env(args, which)
    proc = subprocess.run(cmd, env=env, cwd=REPO)
    if proc.returncode != 0:
      raise SystemExit(f"error: the {which} {phase} benchmark subprocess failed with exit code "
                       f"{proc.returncode} (its output is above)")
    with open(result_file) as f:
      res = json.load(f)
  res["env"] = {k: env[k] for k in ("XLA_FLAGS", "GLIBC_TUNABLES", "OMP_NUM_THREADS") if k in env}
  res["wall_seconds"] = round(time.perf_counter() - t0, 1)
  res["loadavg_before"] = load_before
  res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
  return res


def _fmt(x: float | None, digits: int = 0) -> str:
  return "-" if x is None else f"{x:,.{digits}f}"


def phase_label(args, phase: str) -> str:
  batch, tgt_len, mem_len = phase_lengths(args, phase)
  return f"{phase} (B={batch}, tgt_len={tgt_len}, mem_len={mem_len})"


def format_table(args, results: dict) -> str:
  """The markdown table: one row per phase; tokens/s of ours and PyTorch,
  ours/PyTorch, % of the matmul limit and peak RSS (MiB) of both."""
  rows = ["| phase | ours tokens/s | PyTorch tokens/s | ratio ours/PyTorch "
          "| ours % of matmul limit | PyTorch % of matmul limit "
          "| ours peak RSS MiB | PyTorch peak RSS MiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for phase in args.phases.split(","):
    r = {w: results.get(w, {}).get(phase, {}) for w in IMPLEMENTATIONS}
    o, t = (r[w].get("median_tokens_per_sec") for w in IMPLEMENTATIONS)
    ratio = f"{o / t:.2f}x" if o and t else "-"
    pct = [_fmt(r[w].get("pct_of_matmul_limit"), 1) for w in IMPLEMENTATIONS]
    rss = [_fmt(r[w].get("peak_rss_mib")) for w in IMPLEMENTATIONS]
    rows.append(f"| {phase_label(args, phase)} | {_fmt(o)} | {_fmt(t)} | {ratio} "
                f"| {pct[0]} | {pct[1]} | {rss[0]} | {rss[1]} |")
  return "\n".join(rows)


# Which way is better, by the last part of a number's name (--compare).
_HIGHER_IS_BETTER = ("tokens_per_sec", "pct_of_matmul_limit", "ratio")
_LOWER_IS_BETTER = ("ms_per_step", "rss", "faults", "wall_seconds")


def _direction(name: str) -> int:
  """+1 if a larger value of the number ``name`` is better, -1 if a smaller
  one is, 0 if neither (counts, losses, the machine's matmul limit)."""
  if name.startswith("matmul."):
    return 0
  last = "ratio" if name.startswith("ratio.") else name.rsplit(".", 1)[-1]
  if any(s in last for s in _HIGHER_IS_BETTER):
    return 1
  return -1 if any(s in last for s in _LOWER_IS_BETTER) else 0


def flatten_numbers(tree: Any, prefix: str = "") -> dict[str, float]:
  """{dotted.name: value} of every int/float leaf of nested dicts (lists,
  strings and booleans are left out)."""
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(flatten_numbers(v, f"{prefix}.{k}" if prefix else str(k)))
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    out[prefix] = float(tree)
  return out


def comparable_numbers(run: dict) -> dict[str, float]:
  """The numbers of a saved run that --compare lists: every number of its
  results and matmul limit, plus ratio.<phase> = ours/PyTorch tokens/s."""
  nums = flatten_numbers({"results": run.get("results", {}), "matmul": run.get("matmul", {})})
  res = run.get("results", {})
  for phase in PHASES:
    o = res.get("ours", {}).get(phase, {}).get("median_tokens_per_sec")
    t = res.get("pytorch", {}).get(phase, {}).get("median_tokens_per_sec")
    if o and t:
      nums[f"ratio.{phase}"] = o / t
  return nums


def _num(x: float) -> str:
  return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def compare_runs(old: dict, new: dict, tolerance: float) -> tuple[list[str], int]:
  """Every number of ``new`` beside ``old``'s, with the change in percent.

  A number whose name ends in one of :data:`_HIGHER_IS_BETTER` (tokens/s,
  % of the matmul limit, the ratio) that fell by more than ``tolerance``
  percent, or one of :data:`_LOWER_IS_BETTER` (ms per step, RSS, page
  faults, wall seconds) that rose by more, is marked REGRESSION; the
  opposite moves are marked "better".  Settings and machines that differ
  are listed first, since they explain changes.

  Returns:
    (lines to print, number of regressions).
  """
  lines = []
  o_args, n_args = old.get("args", {}), new.get("args", {})
  skip = ("json", "compare", "new", "tolerance")
  diff = [f"{k}: {o_args.get(k)!r} -> {n_args.get(k)!r}"
          for k in sorted(set(o_args) | set(n_args))
          if k not in skip and o_args.get(k) != n_args.get(k)]
  om, nm = old.get("machine", {}), new.get("machine", {})
  lines.append(f"compare: old {om.get('date', '?')} ({om.get('cpu', '?')}, load "
               f"{om.get('loadavg_start', '?')}) -> new {nm.get('date', '?')} "
               f"({nm.get('cpu', '?')}, load {nm.get('loadavg_start', '?')})")
  lines.append("settings that differ: " + ("; ".join(diff) if diff else "none"))
  o_num, n_num = comparable_numbers(old), comparable_numbers(new)
  names = sorted(set(o_num) | set(n_num))
  width = max([len(n) for n in names] + [6])
  lines.append(f"{'number':<{width}}  {'old':>12}  {'new':>12}  {'change':>8}")
  regressions = 0
  for name in names:
    if name not in o_num or name not in n_num:
      where = "old" if name in o_num else "new"
      value = o_num.get(name, n_num.get(name))
      lines.append(f"{name:<{width}}  {'':>12}  {'':>12}  {'':>8}  only in {where}: "
                   f"{_num(value)}")
      continue
    a, b = o_num[name], n_num[name]
    change = (b - a) / abs(a) * 100 if a else None
    verdict, sign = "", _direction(name)
    if change is not None:
      if sign and sign * change < -tolerance:
        verdict, regressions = "REGRESSION", regressions + 1
      elif sign and sign * change > tolerance:
        verdict = "better"
    ch = "n/a" if change is None else f"{change:+.1f}%"
    lines.append(f"{name:<{width}}  {_num(a):>12}  {_num(b):>12}  {ch:>8}  {verdict}".rstrip())
  lines.append(f"{regressions} regression(s) beyond {tolerance:g}% "
               "(throughput down, or time / memory up)")
  return lines, regressions


def _load_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as err:
    raise SystemExit(f"error: cannot read {path}: {err}") from None


def default_json_path(args, info: dict) -> str:
  """benchmarks/results/<date>_<time>_<host>.json (--smoke: a temp dir)."""
  host = re.sub(r"[^A-Za-z0-9_.-]+", "-", info["host"] or "host")
  stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
  folder = tempfile.mkdtemp(prefix="vs_pytorch_smoke_") if args.smoke else RESULTS_DIR
  return os.path.join(folder, f"{stamp}_{host}.json")


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  if args.compare and args.new:  # compare two saved runs; run nothing
    lines, _ = compare_runs(_load_json(args.compare), _load_json(args.new), args.tolerance)
    print("\n".join(lines))
    return 0
  available = sorted(os.sched_getaffinity(0))
  if args.threads <= 0:
    args.threads = len(available)
  if args.threads < len(available):
    # XLA:CPU sizes its pool from the CPUs it may use: pin all workers to the same N.
    os.sched_setaffinity(0, available[:args.threads])

  if args.worker:
    res = (run_ours if args.worker == "ours" else run_pytorch)(args, args.phase)
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  old = _load_json(args.compare) if args.compare else None  # fail before the long run
  phases = args.phases.split(",")
  which = [w for w in args.which.split(",") if w]
  if args.order == "pytorch_first":
    which = sorted(which, key=lambda w: w != "pytorch")
  info = machine_info()
  info["threads"] = args.threads
  json_path = args.json or default_json_path(args, info)
  print(f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs ({info['cpus_available']} "
        f"available), {info['memory_gib']} GiB, {args.threads} threads for all; load average "
        f"{' '.join(map(str, info['loadavg_start']))}", flush=True)

  results = {w: {} for w in which}
  for phase in phases:
    for w in which:
      print(f"running {w} {phase} ...", flush=True)
      r = results[w][phase] = run_worker(args, w, argv, phase)
      results[w].setdefault("n_params", r["n_params"])
      print(f"  {w} {phase}: median {r['median_tokens_per_sec']:,.0f} tokens/s "
            f"({r['median_ms_per_step']:.1f} ms/step; repeats: "
            + ", ".join(f"{x:,.0f}" for x in r["tokens_per_sec"]) + "; CPU/wall: "
            + ", ".join(f"{x:.2f}" for x in r["cpu_per_wall"])
            + f"; per step: {r['sys_ms_per_step']:.0f} ms system time, "
            f"{r['minor_faults_per_step']:,.0f} page faults; peak RSS "
            f"{r['peak_rss_mib']:,.0f} MiB, {r['rss_after_imports_mib']:,.0f} after imports)",
            flush=True)
  best = {}  # library -> its best GFLOP/s over all workers
  for w in which:
    for phase in phases:
      for k, v in results[w][phase]["matmul"].items():
        if k.endswith("_gflops"):
          best[k[:-len("_gflops")]] = max(best.get(k[:-len("_gflops")], 0.0), v)
  limit = max(best.values())
  matmul = {"n": args.matmul_n, "best_gflops": best, "limit_gflops": limit}
  for w in which:
    for phase in phases:
      r = results[w][phase]
      batch, tgt_len, mem_len = phase_lengths(args, phase)
      r["flops_per_token"] = model_flops_per_token(
          args.n_layer, args.d_model, args.n_head, args.d_head, args.d_inner, args.vocab,
          batch, tgt_len, mem_len, train=phase == "train")
      r["pct_of_matmul_limit"] = (100 * r["flops_per_token"] * r["median_tokens_per_sec"]
                                  / (limit * 1e9))
  info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

  table = format_table(args, results)
  print()
  print(table)
  print()
  counts = {w: results[w]["n_params"] for w in results}
  same = len(set(counts.values())) == 1
  print("parameters: " + ", ".join(f"{w} {n:,}" for w, n in counts.items())
        + ("" if len(counts) < 2 else (" (equal)" if same else " (DIFFERENT)")))
  if "ours" in results:
    print("ours: model.attn_block " + ", ".join(
        f"{ph} {results['ours'][ph]['attn_block']}" for ph in phases if ph in results["ours"])
          + (" (--block)" if args.block is not None else " (default_config's -1, per backend)"))
    print("ours: model.scan_unroll " + ", ".join(
        f"{ph} {results['ours'][ph].get('scan_unroll', '-')}" for ph in phases
        if ph in results["ours"])
          + (" (--scan_unroll)" if args.scan_unroll is not None
             else " (default_config's -1, per backend)"))
  print(f"matmul limit (float32, N={args.matmul_n}, best of every worker): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in best.items())
        + f" GFLOP/s; limit {limit:,.0f} GFLOP/s")
  print("model FLOPs per token (matmuls; train = 3x forward): " + ", ".join(
      f"{p} {results[which[0]][p]['flops_per_token'] / 1e6:,.1f} M" for p in phases))
  v = info["versions"]
  print(f"machine: {info['cpu']}, {info['cpu_count']} CPUs, {args.threads} threads; load average "
        + "; ".join(f"{w} {p} {results[w][p]['loadavg_before'][0]}->"
                    f"{results[w][p]['loadavg_after'][0]}" for p in phases for w in which)
        + f" (1-min, before->after); python {info['python']}, jax {v['jax']}, "
        f"flax {v['flax']}, optax {v['optax']}, torch {v['torch']}, "
        f"transformers {v['transformers']}")
  print(f"steps {args.steps} x repeats {args.repeats} (median), warmup {args.warmup}; "
        "one subprocess per implementation and phase, in the order: "
        + ", ".join(f"{w} {p}" for p in phases for w in which))
  envs = {w: results[w][phases[0]]["env"] for w in which}
  for w, env in envs.items():
    if env:
      print(f"{w} environment: " + ", ".join(f"{k}={v!r}" for k, v in env.items()))
  run = {"args": {k: v for k, v in vars(args).items()
                  if k not in ("worker", "phase", "result_file")},
         "machine": info, "matmul": matmul, "results": results, "table": table}
  os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
  with open(json_path, "w") as f:
    json.dump(run, f, indent=2)
  print(f"wrote {json_path}")
  if old is not None:
    print()
    lines, _ = compare_runs(old, run, args.tolerance)
    print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
