"""What the benchmark tools share: the machine they ran on, library versions,
result files, worker subprocesses, the memory-carrying evaluation loop, and
the machinery of the memory benchmarks (``compressive_memory.py``,
``knn_memory.py``, ``armt_memory.py``, ``memory_variants.py``: their flags,
config, compiled steps, interleaved timing with CPU time, the state's
arrays, ratios to the baseline and table cells).

``vs_pytorch.py``, ``fit.py`` and ``eval_speed.py`` run as scripts
(``python benchmarks/X.py``) and the tests load them from their files; each
puts this folder on ``sys.path`` and imports this module as ``common``.
Only the standard library is imported at import time: the parent processes
of vs_pytorch.py and fit.py import neither JAX nor torch, and vs_pytorch's
PyTorch worker never imports JAX.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")

# Dense bf16 peak FLOP/s of one JAX device (vendor data sheets; a TPU v4/v5p
# device is a chip, a v5e/v6e device a chip of one core), by device_kind: the
# denominator of MFU.
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
}


# ---------------------------------------------------------------------------
# The machine and the library versions (saved with every result).
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


def memory_gib() -> float | None:
  """Physical memory (MemTotal of /proc/meminfo) in GiB; None where unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) / 2**20, 1)
  except OSError:
    pass
  return None


def loadavg() -> list[float]:
  """The 1-, 5- and 15-minute load averages (runnable processes), 2 decimals."""
  return [round(x, 2) for x in os.getloadavg()]


def version(package: str) -> str:
  """The installed version of ``package``, or "not installed"."""
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def machine_info(packages: tuple[str, ...]) -> dict:
  """Date, host, CPU model, CPU count (all, and those this process may run
  on), memory (GiB), load average now, OS, Python and the versions of
  ``packages``."""
  return {
      "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
      "host": platform.node(),
      "cpu": cpu_model(),
      "cpu_count": os.cpu_count(),
      "cpus_available": len(os.sched_getaffinity(0)),
      "memory_gib": memory_gib(),
      "loadavg_start": loadavg(),
      "platform": platform.platform(),
      "python": platform.python_version(),
      "versions": {p: version(p) for p in packages},
  }


def git_commit() -> dict:
  """{"commit": HEAD's hash, "dirty": the files that differ from it (git
  status --porcelain, untracked files too)}; "unknown" outside a git
  checkout."""

  def git(*cmd):
    return subprocess.run(
        ["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    ).stdout

  try:
    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty": [line[3:] for line in git("status", "--porcelain").splitlines()],
    }
  except (OSError, subprocess.SubprocessError):
    return {"commit": "unknown", "dirty": []}


# ---------------------------------------------------------------------------
# Result files.
# ---------------------------------------------------------------------------


def default_json_path(host: str, prefix: str = "", folder: str = RESULTS_DIR) -> str:
  """``<folder>/<prefix><date>_<time>_<host>.json``, by default under
  benchmarks/results/."""
  host = re.sub(r"[^A-Za-z0-9_.-]+", "-", host or "host")
  stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
  return os.path.join(folder, f"{prefix}{stamp}_{host}.json")


def pin_threads(threads: int) -> int:
  """The CPUs the workers use: ``threads`` (<= 0: all this process may run
  on).  With fewer than those, this process (and so every worker it starts)
  is pinned to the first ``threads`` of them: XLA:CPU sizes its pool from the
  CPUs it may use, torch from ``torch.set_num_threads``."""
  available = sorted(os.sched_getaffinity(0))
  threads = threads if threads > 0 else len(available)
  if threads < len(available):
    os.sched_setaffinity(0, available[:threads])
  return threads


def write_json(path: str, data: dict, quiet: bool = False) -> None:
  """Writes ``data`` to ``path`` (indented; missing folders are created;
  atomically, so a run stopped mid-write leaves the previous version) and
  says so unless ``quiet``."""
  from transformer_xl.util import files  # noqa: PLC0415

  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.write_text_atomic(path, json.dumps(data, indent=2))
  if not quiet:
    print(f"wrote {path}")


# ---------------------------------------------------------------------------
# Worker subprocesses.
# ---------------------------------------------------------------------------


def worker_env(xla_flags: list[str] | None = None) -> dict:
  """This process's environment for a worker subprocess, with this checkout
  first on PYTHONPATH.  With ``xla_flags`` (a list, maybe empty), a JAX
  worker on the CPU: ``XLA_FLAGS`` = the caller's without
  ``--xla_force_host_platform_device_count`` (the test suite's simulated
  devices) + ``xla_flags``, and ``JAX_PLATFORMS=cpu``."""
  env = dict(os.environ)
  if xla_flags is not None:
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join(flags + list(xla_flags))
    env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run_script(script: str, argv: list[str], env: dict) -> tuple[int, dict | None]:
  """Runs ``python SCRIPT ARGV --result_file=FILE`` from the repository root
  (its output goes to this process's) and reads the JSON it wrote to FILE.

  Returns:
    (exit status, the worker's JSON; None when the exit status is not 0).
  """
  with tempfile.TemporaryDirectory() as tmp:
    result_file = os.path.join(tmp, "result.json")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(script), *argv, f"--result_file={result_file}"],
        env=env,
        cwd=REPO,
    )
    if proc.returncode != 0:
      return proc.returncode, None
    with open(result_file) as f:
      return 0, json.load(f)


# ---------------------------------------------------------------------------
# Timed loops.
# ---------------------------------------------------------------------------


def eval_loop(eval_step, params, memory, batches: list):
  """``run(n)``: n calls of ``nll, memory = eval_step(params, memory, batch)``
  (``eval_steps.make_eval_step``'s step, memory donated) over ``batches`` in
  turn, the memory carried from call to call and over runs; each run blocks
  until its last results are ready (timing it times the computation).
  ``run.memory()`` is the memory now carried (valid until the next run,
  which donates it)."""
  import jax

  holder = {"memory": memory, "i": 0}

  def run(n: int) -> None:
    mem, nll = holder["memory"], None
    for _ in range(n):
      nll, mem = eval_step(params, mem, batches[holder["i"] % len(batches)])
      holder["i"] += 1
    jax.block_until_ready((nll, mem))
    holder["memory"] = mem

  run.memory = lambda: holder["memory"]  # type: ignore[attr-defined]
  return run


def calibrate(run: Callable[[int], None], warmup: int, min_repeat_s: float) -> int:
  """Warm-up, then the steps of one timed repeat.

  ``run(n)`` runs n steps and blocks on their results; it is called
  ``max(1, warmup)`` times untimed (compiling on the first step), then three
  times with one step: the fastest of those sets n so that a repeat of n steps
  lasts ``min_repeat_s`` seconds at that speed (less where a lone step is
  slower than one of many).  Returns n."""
  run(max(1, warmup))
  one = []
  for _ in range(3):
    t0 = time.perf_counter()
    run(1)
    one.append(time.perf_counter() - t0)
  return max(1, math.ceil(min_repeat_s / max(min(one), 1e-6)))


def time_repeats(
    run: Callable[[int], None], warmup: int, repeats: int, min_repeat_s: float
) -> tuple[list, int]:
  """``calibrate``, then ``repeats`` timed runs of n steps.

  Returns:
    (seconds of each repeat, n)."""
  n = calibrate(run, warmup, min_repeat_s)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    run(n)
    times.append(time.perf_counter() - t0)
  return times, n


def time_interleaved(
    runs: dict[str, Callable[[int], None]], warmup: int, repeats: int, min_repeat_s: float
) -> dict[str, tuple[list, int]]:
  """``time_repeats`` of several loops, their repeats taken in turn
  (repeat 1 of each, then repeat 2 of each, ...), so that a change of load
  on a shared machine reaches them all alike.  Each loop is calibrated
  (``calibrate``) before any is timed.

  Returns:
    {name: (seconds of each repeat, steps per repeat)}."""
  steps = {name: calibrate(run, warmup, min_repeat_s) for name, run in runs.items()}
  times: dict[str, list] = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      t0 = time.perf_counter()
      run(steps[name])
      times[name].append(time.perf_counter() - t0)
  return {name: (times[name], steps[name]) for name in runs}


def per_token_summary(times: list, steps: int, tokens_per_step: int) -> dict:
  """Repeats of ``steps`` steps of ``tokens_per_step`` scored tokens each, as
  {"median_s_per_token" (seconds), "tokens_per_sec" (1 / the median),
  "steps_per_repeat", "tokens_per_step", "repeat_seconds", "s_per_token"
  (each repeat's)}."""
  per_token = [t / (steps * tokens_per_step) for t in times]
  med = statistics.median(per_token)
  return {
      "median_s_per_token": med,
      "tokens_per_sec": 1.0 / med,
      "steps_per_repeat": steps,
      "tokens_per_step": tokens_per_step,
      "repeat_seconds": [round(t, 4) for t in times],
      "s_per_token": per_token,
  }


# ---------------------------------------------------------------------------
# The memory benchmarks (compressive_memory.py, knn_memory.py, armt_memory.py,
# memory_variants.py): the package's jitted training and evaluation steps of
# memory variants of one model, timed in one run against Transformer-XL's, as
# ratios.
# ---------------------------------------------------------------------------

ABLATION = os.path.join(REPO, "configs", "ablation_wt2.py")
JAX_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")  # versions saved with the results
PHASES = ("train", "eval")
# The model's sizes and the segment length, flags of every memory benchmark (ints >= 1).
MODEL_SIZES = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab", "div_val", "tgt_len")

# The model, batch and timing every memory benchmark's presets start from (each adds its
# memory's settings; flags given explicitly override them).  "default": configs/ablation_wt2.py:xl's
# model and training batch (WikiText-2's vocabulary); "smoke": a toy for the tests.
DEFAULT_PRESET = dict(
    n_layer=4,
    d_model=128,
    n_head=4,
    d_head=32,
    d_inner=512,
    vocab=33_278,
    cutoffs="2000,8000",
    div_val=2,
    tgt_len=32,
    batch=16,
    repeats=5,
    min_repeat_s=1.0,
)
SMOKE_PRESET = dict(
    n_layer=2,
    d_model=16,
    n_head=2,
    d_head=8,
    d_inner=32,
    vocab=64,
    cutoffs="",
    div_val=1,
    tgt_len=8,
    batch=2,
    repeats=3,
    min_repeat_s=0.05,
)


class UsageError(ValueError):
  """Bad command-line input; printed as one ``error: ...`` line."""


class Parser(argparse.ArgumentParser):
  """An ``argparse.ArgumentParser`` whose errors raise ``UsageError``."""

  def error(self, message):
    raise UsageError(message)


def int_list(flag: str, text: str) -> list[int]:
  """``text``, a comma list of ints ('' = none), as a list.

  Raises:
    UsageError: not a comma list of ints (the message names ``--flag``).
  """
  try:
    return [int(s) for s in str(text).split(",") if s.strip()]
  except ValueError:
    raise UsageError(f"--{flag}={text!r}: expected a comma list of ints.") from None


def add_model_flags(p: argparse.ArgumentParser, sizes: Sequence[str]) -> None:
  """The memory benchmarks' first flags: ``--smoke``, one int flag per name
  of ``sizes`` (default None: the preset's) and ``--cutoffs``."""
  p.add_argument("--smoke", action="store_true", help="tiny model (seconds)")
  for name in sizes:
    p.add_argument(f"--{name}", type=int)
  p.add_argument("--cutoffs", help="adaptive softmax cutoffs, a comma list ('' = dense)")


def add_timing_flags(p: argparse.ArgumentParser, name: str) -> None:
  """The memory benchmarks' last flags: ``--same_length`` (eval, default
  on), ``--min_repeat_s``, ``--warmup`` (3), ``--seed`` (0) and ``--json``
  (default ``benchmarks/results/<name>_<date>_<time>_<host>.json``)."""
  p.add_argument(
      "--same_length",
      action=argparse.BooleanOptionalAction,
      default=True,
      help="eval same_length (default on, as configs/ablation_wt2.py's eval)",
  )
  p.add_argument("--min_repeat_s", type=float, help="seconds per timed repeat (about)")
  p.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
      "--json",
      default="",
      help="write arguments, machine and results here (default: benchmarks/results/"
      f"{name}_<date>_<time>_<host>.json; --smoke: a temporary directory)",
  )


def apply_preset(args: argparse.Namespace, presets: dict[str, dict]) -> None:
  """Fills every flag not given (None) from ``presets["smoke"]`` (with
  ``--smoke``) or ``presets["default"]``, and parses ``args.cutoffs``.

  Raises:
    UsageError: cutoffs that are not a comma list of ints.
  """
  preset = presets["smoke" if args.smoke else "default"]
  for k, v in preset.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  args.cutoffs = int_list("cutoffs", args.cutoffs)


def check_sizes(args: argparse.Namespace, sizes: Sequence[str]) -> None:
  """Raises ``UsageError`` naming every flag of ``sizes`` below 1, a
  negative ``--warmup`` and a ``--min_repeat_s`` not above 0."""
  bad = [f"--{k}" for k in sizes if getattr(args, k) < 1]
  bad += ["--warmup"] if args.warmup < 0 else []
  bad += ["--min_repeat_s"] if not args.min_repeat_s > 0 else []
  if bad:
    raise UsageError(
        f"{', '.join(bad)}: sizes, lengths, --batch and --repeats must be >= 1, --warmup >= 0, "
        "--min_repeat_s > 0."
    )


def ablation_config():
  """``configs/ablation_wt2.py:xl``, loaded from its file (ml_collections.ConfigDict)."""
  spec = importlib.util.spec_from_file_location("ablation_wt2", ABLATION)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("xl")


def memory_config(args: argparse.Namespace, memory: str, mem_len: int):
  """The config of one memory variant: ``configs/ablation_wt2.py:xl``
  (optimizer, clipping, dropout) with the sizes of ``args``, ``model.memory``
  and XL memory of ``mem_len`` slots, eval segments of ``tgt_len`` with that
  ``mem_len``, no clamp_len and ``args.same_length``, and batch
  ``args.batch`` for both.  The variant's own section (``model.<memory>``)
  keeps its defaults: the caller sets it.

  Returns:
    ml_collections.ConfigDict.
  """
  c = ablation_config()
  c.model.update(
      n_layer=args.n_layer,
      d_model=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      tgt_len=args.tgt_len,
      cutoffs=tuple(args.cutoffs),
      div_val=args.div_val,
      tie_projs=(False,) + (True,) * len(args.cutoffs) if args.cutoffs else (),
      memory=memory,
      mem_len=mem_len,
  )
  c.train.update(global_batch=args.batch, batch_chunk=1)
  c.eval.update(
      method="segments",
      tgt_len=args.tgt_len,
      mem_len=mem_len,
      same_length=args.same_length,
      clamp_len=0,
      global_batch=args.batch,
  )
  return c


def memory_analysis(compiled) -> dict:
  """XLA's memory analysis of a compiled step, in MiB: {"temp_mib",
  "argument_mib", "output_mib"}, each None where the backend gives none."""
  try:
    a = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 -- an estimate only; the timing goes on
    a = None
  names = {"temp_mib": "temp", "argument_mib": "argument", "output_mib": "output"}
  return {
      k: (None if a is None else getattr(a, f"{n}_size_in_bytes", None) / 2**20)
      for k, n in names.items()
  }


def train_loop(step, state, batches: list) -> Callable[[int], None]:
  """``run(n)``: n calls of ``state, metrics = step(state, batch)`` (the
  train step, state donated) over ``batches`` in turn, the state carried
  from call to call and over runs; each run blocks until its last results
  are ready.  ``run.last`` holds the last call's metrics, ``run.state()``
  the state now carried (valid until the next run, which donates it)."""
  import jax  # noqa: PLC0415

  holder = {"state": state, "i": 0}

  def run(n: int) -> None:
    st, metrics = holder["state"], None
    for _ in range(n):
      st, metrics = step(st, batches[holder["i"] % len(batches)])
      holder["i"] += 1
    jax.block_until_ready((st, metrics))
    holder["state"] = st
    run.last = metrics  # type: ignore[attr-defined]

  run.state = lambda: holder["state"]  # type: ignore[attr-defined]
  return run


def time_interleaved_cpu(
    runs: dict, warmup: int, repeats: int, min_repeat_s: float
) -> dict[str, tuple[list, list, int]]:
  """``time_interleaved`` that also reads this process's CPU time
  (``time.process_time``: all its threads, XLA:CPU's pool included) around
  each repeat: on a shared CPU the wall time of a repeat includes the time
  other processes held the cores, its CPU time less so.  (On an accelerator
  the CPU time is the host's, not the computation's.)

  Returns:
    {name: (wall seconds of each repeat, CPU seconds of each, steps per repeat)}."""
  steps = {name: calibrate(run, warmup, min_repeat_s) for name, run in runs.items()}
  wall: dict = {name: [] for name in runs}
  cpu: dict = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      c0, t0 = time.process_time(), time.perf_counter()
      run(steps[name])
      wall[name].append(time.perf_counter() - t0)
      cpu[name].append(time.process_time() - c0)
  return {name: (wall[name], cpu[name], steps[name]) for name in runs}


def model_description(args: argparse.Namespace) -> str:
  """The memory benchmarks' model, as their output's first line begins:
  layers, widths, vocabulary and softmax, segments and batch."""
  cut = f"adaptive, cutoffs {args.cutoffs}, div_val {args.div_val}" if args.cutoffs else "dense"
  return (
      f"model: {args.n_layer} layers, d_model {args.d_model}, {args.n_head}x{args.d_head} heads, "
      f"d_inner {args.d_inner}, vocab {args.vocab:,} ({cut}), attn_type 0, float32; segments "
      f"of {args.tgt_len}, batch {args.batch}"
  )


def measure_memory_variants(
    args: argparse.Namespace,
    variants: list[dict],
    make_config: Callable,
    describe: Callable,
    finish: Callable | None = None,
    log: Callable[[str], None] = print,
) -> dict:
  """Compiles and times every variant's train and eval steps on the first
  device, all repeats in turn (``time_interleaved_cpu``).

  Per variant: ``make_config(args, variant)`` (validated for one device);
  the model's default initialisation (``args.seed``) and its train state for
  ``args.batch`` rows; the training step (``train_step.make_train_step``)
  and the eval segment step (``eval_steps.make_eval_step`` of
  ``eval_steps.eval_model_config``, an empty eval memory ``init_memory``)
  compiled once (``lower().compile()``: the analysed executable is the one
  timed); 4 batches of random token ids in [0, ``args.vocab``), [B, T] int32,
  placed on the device before timing, used in turn.  A config with
  ``train.mem_backprop_depth`` k > 0 gets the training step that
  backpropagates through the k segments before the newest (``train_step``)
  and train batches of windows of k + 1 segments ([B, (k + 1) T], their own
  random ids); its tokens per step stay B x T, the newest segment's, the
  only ones scored (the window slides by one segment a step).

  Args:
    args: the flags (``batch``, ``tgt_len``, ``vocab``, ``seed``,
      ``warmup``, ``repeats``, ``min_repeat_s``, and what ``make_config``
      reads).
    variants: one dict per variant with a unique "key"; the first is the
      baseline of the ratios.
    make_config: ``(args, variant) -> ConfigDict``.
    describe: ``(variant, train_state, eval_memory) -> (train_state,
      eval_memory, fields)``: the states to time from (e.g. a store filled)
      and the variant's entries of the results, at least
      "state_bytes_per_row" (the recurrent state, bytes per batch row).
    finish: ``(variant result, train run, eval run) -> None``, after timing:
      adds to the result (the runs: ``train_loop``'s and ``eval_loop``'s).
    log: progress lines.

  Returns:
    {"variants": [each variant's dict with "n_params", ``describe``'s
    fields, "train" and "eval": each ``per_token_summary``'s dict plus
    "temp_mib", "argument_mib", "output_mib" (``memory_analysis``),
    "cpu_tokens_per_sec" and "repeat_cpu_seconds", and for train
    "last_loss" (the last step's cross-entropy, nats)], "ratios": {phase:
    {variant key: {"tokens_per_sec", "cpu_tokens_per_sec",
    "state_bytes_per_row", "temp_mib"}: the variant's over the
    baseline's}}, "device_peak_mib" (None where the device reports none,
    as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
  """
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from transformer_xl import default_config, sharding  # noqa: PLC0415
  from transformer_xl.inference import eval_steps  # noqa: PLC0415
  from transformer_xl.model import memory as memory_lib  # noqa: PLC0415
  from transformer_xl.model import models  # noqa: PLC0415
  from transformer_xl.training import train_state, train_step  # noqa: PLC0415

  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  rng = np.random.default_rng(args.seed)
  b, t = args.batch, args.tgt_len
  bs, rows = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)
  tokens = [rng.integers(0, args.vocab, (b, t + 1), dtype=np.int32) for _ in range(4)]

  def batches(with_weights: bool) -> list:
    out = []
    for x in tokens:
      batch = {"inputs": x[:, :-1], "targets": x[:, 1:], "reset": np.zeros((b,), bool)}
      shard = {"inputs": bs, "targets": bs, "reset": rows}
      if with_weights:
        batch["weights"], shard["weights"] = np.ones((b, t), np.float32), bs
      out.append(jax.device_put(batch, shard))
    return out

  def window_batches(depth: int) -> list:
    """4 train batches of windows of k + 1 segments, k = ``depth`` ([B, (k +
    1) T], ``reset`` [B, k + 1]; ``train_step``'s backpropagation through
    segments), random ids of their own (seeded by ``args.seed`` and k)."""
    wrng = np.random.default_rng([args.seed, depth])
    n = (depth + 1) * t
    out = []
    for _ in range(4):
      x = wrng.integers(0, args.vocab, (b, n + 1), dtype=np.int32)
      batch = {
          "inputs": x[:, :-1],
          "targets": x[:, 1:],
          "weights": np.ones((b, n), np.float32),
          "reset": np.zeros((b, depth + 1), bool),
      }
      out.append(jax.device_put(batch, {**dict.fromkeys(batch, bs), "reset": rows}))
    return out

  train_batches, eval_batches = batches(True), batches(False)
  windows: dict[int, list] = {0: train_batches}
  runs, found = {}, []
  for v in variants:
    config = make_config(args, v)
    default_config.validate(config, 1)
    depth = config.train.get("mem_backprop_depth", 0)
    if depth not in windows:
      windows[depth] = window_batches(depth)
    train_cfg = default_config.model_config(config, args.vocab)
    model = models.TransformerXL(train_cfg)
    tx = train_state.make_optimizer(config.train, train_cfg)
    _, shardings = train_state.abstract_train_state(model, tx, b, mesh)
    state = train_state.create_train_state(
        model, tx, b, mesh, jax.random.PRNGKey(args.seed), shardings
    )
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    log(f"compiling {v['key']} ({n_params:,} parameters) ...")
    step = train_step.make_train_step(
        model,
        tx,
        mesh,
        shardings,
        1,
        config.train.seed,
        config.train.loss_span,
        config.train.aux_loss_weight,
        depth,
    )
    train_exe = step.lower(state, windows[depth][0]).compile()
    eval_cfg = eval_steps.eval_model_config(config, train_cfg)
    eval_step = eval_steps.make_eval_step(models.TransformerXL(eval_cfg), mesh)
    memory = jax.jit(
        lambda cfg=eval_cfg: memory_lib.init_memory(cfg, b),
        out_shardings=memory_lib.shardings(eval_cfg, mesh),
    )()
    params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), state.params)  # not donated
    eval_exe = eval_step.lower(params, memory, eval_batches[0]).compile()
    state, memory, fields = describe(v, state, memory)
    found.append(
        {
            **v,
            "n_params": n_params,
            **fields,
            "train": memory_analysis(train_exe),
            "eval": memory_analysis(eval_exe),
        }
    )
    runs[("train", v["key"])] = train_loop(train_exe, state, windows[depth])
    runs[("eval", v["key"])] = eval_loop(eval_exe, params, memory, eval_batches)
  log("timing ...")
  timed = time_interleaved_cpu(runs, args.warmup, args.repeats, args.min_repeat_s)

  base = found[0]["key"]
  for v in found:
    for phase in PHASES:
      times, cpu_times, n = timed[(phase, v["key"])]
      v[phase].update(per_token_summary(times, n, b * t))
      v[phase]["cpu_tokens_per_sec"] = b * t * n / statistics.median(cpu_times)
      v[phase]["repeat_cpu_seconds"] = [round(x, 4) for x in cpu_times]
    v["train"]["last_loss"] = float(runs[("train", v["key"])].last["loss"])
    if finish is not None:
      finish(v, runs[("train", v["key"])], runs[("eval", v["key"])])
  by_key = {v["key"]: v for v in found}
  ratios = {}
  for phase in PHASES:
    ref = by_key[base]
    ratios[phase] = {
        v["key"]: {
            "tokens_per_sec": v[phase]["tokens_per_sec"] / ref[phase]["tokens_per_sec"],
            "cpu_tokens_per_sec": (
                v[phase]["cpu_tokens_per_sec"] / ref[phase]["cpu_tokens_per_sec"]
            ),
            "state_bytes_per_row": v["state_bytes_per_row"] / ref["state_bytes_per_row"],
            "temp_mib": (
                None
                if v[phase]["temp_mib"] is None or not ref[phase]["temp_mib"]
                else v[phase]["temp_mib"] / ref[phase]["temp_mib"]
            ),
        }
        for v in found
    }
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return {
      "variants": found,
      "ratios": ratios,
      "device_peak_mib": (
          stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None
      ),
  }


def phase_columns(temp_ratio: bool = False) -> tuple[str, str]:
  """The table header of ``phase_cells``' columns (after the variant's own,
  from its leading "| ") and their alignment row (right-aligned)."""
  names = []
  for phase in PHASES:
    names += [
        f"{phase} tokens/s",
        f"{phase} vs XL",
        f"{phase} vs XL, CPU time",
        f"{phase} temp / args MiB",
    ]
    names += [f"{phase} temp vs XL"] if temp_ratio else []
  return "| " + " | ".join(names) + " |", "---:|" * len(names)


# The table columns of ``phase_cells``, after the variant's own.
PHASE_COLUMNS, PHASE_ALIGN = phase_columns()


def phase_cells(v: dict, base: dict, temp_ratio: bool = False) -> list[str]:
  """The table cells of a measured variant ``v`` (``measure_memory_variants``)
  against the baseline ``base``, per phase: tokens/s, its ratio (wall time,
  then this process's CPU time), XLA's temporaries / arguments (MiB) and,
  with ``temp_ratio``, the temporaries' ratio ("-" where either has none)."""
  num = lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
  mib = lambda x: "-" if x is None else f"{x:,.1f}"
  cells = []
  for phase in PHASES:
    x, ref = v[phase], base[phase]
    cells += [
        num(x["tokens_per_sec"]),
        f"{x['tokens_per_sec'] / ref['tokens_per_sec']:.3f}x",
        f"{x['cpu_tokens_per_sec'] / ref['cpu_tokens_per_sec']:.3f}x",
        f"{mib(x['temp_mib'])} / {mib(x['argument_mib'])}",
    ]
    if temp_ratio:
      known = x["temp_mib"] is not None and ref["temp_mib"]
      cells.append(f"{x['temp_mib'] / ref['temp_mib']:.2f}x" if known else "-")
  return cells


def state_leaves(memory, batch: int) -> dict[str, dict]:
  """The recurrent state's arrays of ``memory`` (a ``memory.Memory`` of
  ``batch`` rows): the XL cache ``mems_LxBxMxD`` and every array of its
  ``variant_state``, as {name: {"shape", "dtype", "bytes_per_row"}} (the
  array's bytes over ``batch``); ``mlen_B`` (4 bytes per row in every
  variant) is left out, as the memory benchmarks count the state."""
  leaves = {"mems_LxBxMxD": memory.mems_LxBxMxD, **memory.variant_state}
  return {
      name: {
          "shape": list(x.shape),
          "dtype": str(x.dtype),
          "bytes_per_row": int(x.size) * x.dtype.itemsize // batch,
      }
      for name, x in leaves.items()
  }


def jax_machine_info() -> dict:
  """The machine (``machine_info`` with ``JAX_PACKAGES``), the commit, its
  first JAX device and the JAX platform ("cpu", "gpu", "tpu"), recorded
  with the results."""
  import jax  # noqa: PLC0415

  info = machine_info(JAX_PACKAGES)
  info.update(git_commit())
  info.update(device=str(jax.devices()[0].device_kind), platform=jax.devices()[0].platform)
  return info


def memory_benchmark_main(
    argv: Sequence[str] | None,
    parse_args: Callable,
    model_line: Callable,
    measure: Callable,
    format_table: Callable,
    name: str,
) -> int:
  """A memory benchmark's command line: parses the flags (``parse_args``:
  a ``UsageError`` is one ``error:`` line, status 2), prints the machine and
  ``model_line(args)``, runs ``measure(args, log=...)`` (a
  ``default_config.ConfigError``: one line, status 2), prints
  ``format_table(res)`` and the timing's terms, and writes the JSON (flags,
  machine, results, table) to ``--json``, by default
  ``benchmarks/results/<name>_<date>_<time>_<host>.json`` (``--smoke``: a
  temporary directory).  Returns the exit status."""
  try:
    args = parse_args(argv)
  except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  from transformer_xl import default_config  # noqa: PLC0415

  info = jax_machine_info()
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs; device {info['device']} "
      f"({info['platform']}); load average {' '.join(map(str, info['loadavg_start']))}; "
      f"commit {info['commit'][:12]}",
      flush=True,
  )
  print(model_line(args), flush=True)
  try:
    res = measure(args, log=lambda s: print(s, flush=True))
  except default_config.ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  info["loadavg_end"] = loadavg()
  table = format_table(res)
  print()
  print(table)
  print()
  print(
      f"median of {args.repeats} repeats (>= {args.min_repeat_s} s each, all variants and steps "
      f"in turn) after compilation and {args.warmup} warm-up steps; load average "
      f"{info['loadavg_start'][0]} -> {info['loadavg_end'][0]} (1 min); temporaries: XLA's "
      "memory_analysis of each compiled step"
  )
  path = args.json
  if not path:
    folder = tempfile.mkdtemp(prefix=f"{name}_smoke_") if args.smoke else RESULTS_DIR
    path = default_json_path(platform.node(), f"{name}_", folder)
  write_json(path, {"args": vars(args), "machine": info, **res, "table": table})
  return 0
