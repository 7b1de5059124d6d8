"""host_memory: the command line restarts once with glibc's huge pages."""
import os
import platform
import subprocess
import sys

import pytest

from transformer_xl import host_memory
from test_train import REPO

GLIBC = platform.libc_ver()[0] == "glibc"
THP = host_memory.thp_mode() in ("always", "madvise")


def test_hugepages_environ_adds_the_tunable_once():
  env = host_memory.hugepages_environ({"A": "1"}, "glibc", "madvise")
  assert env == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  kept = host_memory.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=9"},
                                       "glibc", "always")
  assert kept["GLIBC_TUNABLES"] == "glibc.malloc.trim_threshold=9:glibc.malloc.hugetlb=1"
  # Never twice (the restarted process sees the tunable), nor where it cannot help.
  assert host_memory.hugepages_environ(env, "glibc", "madvise") is None
  assert host_memory.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "glibc",
                                       "madvise") is None
  assert host_memory.hugepages_environ({}, "glibc", "never") is None
  assert host_memory.hugepages_environ({}, "glibc", "") is None
  assert host_memory.hugepages_environ({}, "", "madvise") is None
  assert host_memory.hugepages_environ({"TRANSFORMER_XL_HUGEPAGES": "0"}, "glibc",
                                       "madvise") is None


_SHOW = ("from transformer_xl import host_memory; host_memory.reexec_with_hugepages(); "
         "import os, sys; print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")


@pytest.mark.skipif(not (GLIBC and THP and sys.platform.startswith("linux")),
                    reason="needs glibc and transparent huge pages")
def test_the_process_restarts_with_the_tunable_and_its_arguments():
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "TRANSFORMER_XL_HUGEPAGES")}
  run = lambda e: subprocess.run([sys.executable, "-c", _SHOW, "x", "--y=1"], cwd=REPO, env=e,
                                 capture_output=True, text=True, timeout=60)
  r = run(env)
  assert r.returncode == 0 and r.stdout.strip() == "glibc.malloc.hugetlb=1 ['x', '--y=1']", r
  r = run(dict(env, TRANSFORMER_XL_HUGEPAGES="0"))
  assert r.stdout.strip() == "None ['x', '--y=1']", r


def test_the_command_line_restarts_once_and_still_reports_bad_input():
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  r = subprocess.run([sys.executable, "-m", "transformer_xl.main", "--mode=train"], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 1 and "--config" in r.stderr and "Traceback" not in r.stderr, r


_FRAGMENT = r"""
import sys
from transformer_xl import host_memory

def rss_mib():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

# 3,000 blocks of 96 KiB (below glibc's mmap threshold: they come from the heap),
# then all freed but the last, which keeps the heap from shrinking by itself.
blocks = [bytearray(96 * 1024) for _ in range(3000)]
keep = blocks[-1]
del blocks
before = rss_mib()
ran = host_memory.release_free_memory()
print(ran, before, rss_mib())
"""


@pytest.mark.skipif(not (GLIBC and sys.platform.startswith("linux")), reason="needs glibc")
def test_release_free_memory_returns_the_freed_heap_to_the_kernel():
  r = subprocess.run([sys.executable, "-c", _FRAGMENT], cwd=REPO, capture_output=True,
                     text=True, timeout=60)
  ran, before, after = r.stdout.split()
  assert ran == "True", r
  # ~280 MiB were freed but stayed resident; the call hands them back.
  assert float(before) - float(after) > 150, r.stdout


def test_release_after_compiles_runs_after_every_compilation(monkeypatch):
  import jax
  import jax.numpy as jnp
  x, y = jnp.arange(7.0), jnp.arange(5.0)  # compiled before counting
  calls = []
  monkeypatch.setattr(host_memory, "release_free_memory", lambda: calls.append(1) or True)
  host_memory.release_after_compiles()
  host_memory.release_after_compiles()  # idempotent: one listener
  jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())(x).block_until_ready()
  assert len(calls) == 1
  jax.jit(lambda y: jnp.cos(y) - 1.5)(y).block_until_ready()
  assert len(calls) == 2
