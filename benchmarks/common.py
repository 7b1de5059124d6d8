"""What the benchmark tools share: the machine they ran on, library versions,
result files, worker subprocesses and the memory-carrying evaluation loop.

``vs_pytorch.py``, ``fit.py`` and ``eval_speed.py`` run as scripts
(``python benchmarks/X.py``) and the tests load them from their files; each
puts this folder on ``sys.path`` and imports this module as ``common``.
Only the standard library is imported at import time: the parent processes
of vs_pytorch.py and fit.py import neither JAX nor torch, and vs_pytorch's
PyTorch worker never imports JAX.
"""

from __future__ import annotations

import datetime
import importlib.metadata
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
from collections.abc import Callable

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
  until its last results are ready (timing it times the computation)."""
  import jax

  holder = {"memory": memory, "i": 0}

  def run(n: int) -> None:
    mem, nll = holder["memory"], None
    for _ in range(n):
      nll, mem = eval_step(params, mem, batches[holder["i"] % len(batches)])
      holder["i"] += 1
    jax.block_until_ready((nll, mem))
    holder["memory"] = mem

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
