"""process_settings: the command line restarts once with glibc's huge pages; logging, signals."""

import json
import os
import platform
import subprocess
import sys
import time

import pytest

from transformer_xl.cli import process_settings

from helpers import REPO

GLIBC = platform.libc_ver()[0] == "glibc"
THP = process_settings.thp_mode() in ("always", "madvise")


def test_hugepages_environ_adds_the_tunable_once():
  env = process_settings.hugepages_environ({"A": "1"}, "glibc", "madvise")
  assert env == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  kept = process_settings.hugepages_environ(
      {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=9"}, "glibc", "always"
  )
  assert kept["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=9:glibc.malloc.hugetlb=1"
  # Never twice (the restarted process sees the tunable), nor where it cannot help.
  assert process_settings.hugepages_environ(env, "glibc", "madvise") is None
  assert (
      process_settings.hugepages_environ(
          {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "glibc", "madvise"
      )
      is None
  )
  assert process_settings.hugepages_environ({}, "glibc", "never") is None
  assert process_settings.hugepages_environ({}, "glibc", "") is None
  assert process_settings.hugepages_environ({}, "", "madvise") is None
  assert (
      process_settings.hugepages_environ({"TRANSFORMER_XL_HUGEPAGES": "0"}, "glibc", "madvise")
      is None
  )


_SHOW = (
    "from transformer_xl.cli import process_settings; process_settings.reexec_with_hugepages(); "
    "import os, sys; print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])"
)


@pytest.mark.skipif(
    not (GLIBC and THP and sys.platform.startswith("linux")),
    reason="needs glibc and transparent huge pages",
)
def test_the_process_restarts_with_the_tunable_and_its_arguments():
  env = {
      k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TRANSFORMER_XL_HUGEPAGES")
  }
  run = lambda e: subprocess.run(
      [sys.executable, "-c", _SHOW, "x", "--y=1"],
      cwd=REPO,
      env=e,
      capture_output=True,
      text=True,
      timeout=60,
  )
  r = run(env)
  assert r.returncode == 0 and r.stdout.strip() == "glibc.malloc.hugetlb=1 ['x', '--y=1']", r
  r = run(dict(env, TRANSFORMER_XL_HUGEPAGES="0"))
  assert r.stdout.strip() == "None ['x', '--y=1']", r


def test_the_command_line_restarts_once_and_still_reports_bad_input():
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  r = subprocess.run(
      [sys.executable, "-m", "transformer_xl.main", "--mode=train"],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert r.returncode == 1 and "--config" in r.stderr and "Traceback" not in r.stderr, r


_FRAGMENT = r"""
import sys
import time
from transformer_xl.cli import process_settings

def rss_mib():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

# 3,000 blocks of 96 KiB (below glibc's mmap threshold: they come from the heap),
# then all freed but the last, which keeps the heap from shrinking by itself.
blocks = [bytearray(96 * 1024) for _ in range(3000)]
keep = blocks[-1]
del blocks
before = rss_mib()
ran = process_settings.release_free_memory()
print(ran, before, rss_mib())
"""


@pytest.mark.skipif(not (GLIBC and sys.platform.startswith("linux")), reason="needs glibc")
def test_release_free_memory_returns_the_freed_heap_to_the_kernel():
  r = subprocess.run(
      [sys.executable, "-c", _FRAGMENT], cwd=REPO, capture_output=True, text=True, timeout=60
  )
  ran, before, after = r.stdout.split()
  assert ran == "True", r
  # ~280 MiB were freed but stayed resident; the call hands them back.
  assert float(before) - float(after) > 150, r.stdout


def test_release_after_compiles_runs_after_every_compilation(monkeypatch):
  import jax
  import jax.numpy as jnp

  x, y = jnp.arange(7.0), jnp.arange(5.0)  # compiled before counting
  calls = []
  monkeypatch.setattr(process_settings, "release_free_memory", lambda: calls.append(1) or True)
  process_settings.release_after_compiles()
  process_settings.release_after_compiles()  # idempotent: one listener
  jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())(x).block_until_ready()
  assert len(calls) == 1
  jax.jit(lambda y: jnp.cos(y) - 1.5)(y).block_until_ready()
  assert len(calls) == 2


# --------------------------------------------------------------------------- #
# The library leaves the process alone; the entry points' settings do what they say.

_LIBRARY_RUN = r"""
import json, logging, os, pathlib, signal, sys
import jax
from transformer_xl import sharding
from transformer_xl.run import checkpointing
from transformer_xl.run import workdir as wd
from transformer_xl.run import run_dir
from helpers import TOY_VOCAB, damage_checkpoint, toy_config, train_toy
from transformer_xl import default_config

def snapshot():
  names = ["", "absl", "asyncio", "orbax", "jax"]
  return {"loggers": {n: [logging.getLogger(n).level,
                          [type(f).__name__ for f in logging.getLogger(n).filters],
                          len(logging.getLogger(n).handlers)] for n in names},
          "unraisablehook": repr(sys.unraisablehook), "excepthook": repr(sys.excepthook),
          "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGINT)},
          "environ": dict(os.environ),
          "jax": {k: repr(getattr(jax.config, k)) for k in ("jax_cpu_collectives_implementation",
                                                            "jax_enable_x64")}}

before = snapshot()
workdir = sys.argv[1]
mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
config = toy_config(num_steps=4)
train_toy(workdir, mesh, config)                      # training, checkpoints 2 and 4
damage_checkpoint(pathlib.Path(workdir) / "checkpoints" / "4", "data_file_deleted", None)
mcfg = default_config.model_config(config, TOY_VOCAB)
step, _ = run_dir.restore_params(workdir, mcfg, mesh)  # a failed read, then the fallback
after = snapshot()
print(json.dumps({"step": step, "before": before, "after": after}))
"""


@pytest.mark.slow
def test_the_library_changes_nothing_process_wide(tmp_path):
  """Training, checkpointing and a restore that falls back over a damaged
  checkpoint leave logging, hooks, signal handlers, the environment and
  jax's settings as they were (only the entry points change them)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
  r = subprocess.run(
      [sys.executable, "-c", _LIBRARY_RUN, str(tmp_path / "wd")],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["step"] == 2
  assert result["after"] == result["before"]


def test_configure_logging_drops_orbax_failures_and_keeps_the_rest(monkeypatch):
  import logging

  absl, asyncio_logger = logging.getLogger("absl"), logging.getLogger("asyncio")
  monkeypatch.setattr(absl, "filters", list(absl.filters))
  monkeypatch.setattr(asyncio_logger, "filters", list(asyncio_logger.filters))
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

  def record(name, msg, path):
    return logging.LogRecord(name, logging.ERROR, path, 1, msg, None, None)

  orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "manager.py")
  ours = os.path.join(os.sep, "repo", "transformer_xl", "train.py")
  assert absl.filter(record("absl", "write failed", orbax_file))  # nothing filtered yet
  process_settings.configure_logging(debug=False, verbosity_given=True)
  process_settings.configure_logging(debug=False, verbosity_given=True)  # idempotent
  assert [type(f).__name__ for f in absl.filters].count("_NotFromOrbax") == 1
  assert not absl.filter(record("absl", "write failed", orbax_file))
  assert absl.filter(record("absl", "our own warning", ours))
  assert not asyncio_logger.filter(record("asyncio", "Task exception was never retrieved", ""))
  # a failed gather of several writes (seen when a full disk fails orbax's save)
  assert not asyncio_logger.filter(
      record("asyncio", "_GatheringFuture exception was never retrieved\nfuture: <...>", "")
  )
  assert asyncio_logger.filter(record("asyncio", "Executing <Task> took 2 s", ""))

  class Unraisable:

    def __init__(self, exc, obj=None):
      self.exc_value, self.object = exc, obj

  async def pending():
    return None

  coroutine = pending()
  sys.unraisablehook(Unraisable(RuntimeError("Event loop is closed")))
  sys.unraisablehook(Unraisable(RuntimeError("closed"), coroutine))
  other = ValueError("a real problem")
  sys.unraisablehook(Unraisable(other))
  coroutine.close()
  assert seen == [other]


def test_debug_logging_filters_nothing(monkeypatch):
  import logging

  absl = logging.getLogger("absl")
  monkeypatch.setattr(absl, "filters", [])
  hook = sys.unraisablehook
  process_settings.configure_logging(debug=True, verbosity_given=True)
  assert absl.filters == [] and sys.unraisablehook is hook


def test_stop_signals_turn_sigterm_into_a_flag_and_restore_the_handler():
  import signal

  previous = signal.getsignal(signal.SIGTERM)
  with process_settings.StopSignals() as stop:
    assert not stop.received()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.received()
  assert signal.getsignal(signal.SIGTERM) is previous


_TWO_CTRL_C = """
import os, signal, time
from transformer_xl.cli import process_settings
with process_settings.StopSignals() as stop:
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(0.2)
  print("first:", stop.received(), flush=True)
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(10)
print("not reached", flush=True)
"""


def test_ctrl_c_once_is_a_flag_twice_quits_at_once():
  """The first SIGINT sets the flag (named) with one line on stderr; the
  second exits 130 at once, without a traceback."""
  t = time.monotonic()
  r = subprocess.run(
      [sys.executable, "-c", _TWO_CTRL_C],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=60,
      env=dict(os.environ, PYTHONPATH=str(REPO)),
  )
  assert r.returncode == 130 and r.stdout == "first: SIGINT\n", (r.stdout, r.stderr)
  assert time.monotonic() - t < 9  # did not sleep out the 10 s
  lines = [line for line in r.stderr.splitlines() if line]
  assert lines == [
      "SIGINT: stopping after the current step with a checkpoint (Ctrl-C again quits at once, "
      "without one).",
      "SIGINT again: quitting without a checkpoint (the newest one written is intact).",
  ]


def test_an_incomplete_multi_process_setup_is_a_config_error():
  from transformer_xl import default_config

  with pytest.raises(default_config.ConfigError, match="go together"):
    process_settings.initialize_distributed("127.0.0.1:1234", None, 0)
