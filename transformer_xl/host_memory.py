"""The host allocator setting of the command line: glibc's transparent huge pages.

XLA:CPU allocates the temporaries of each step through glibc's ``malloc``
from its worker threads, as one block of hundreds of MiB for a training
step.  glibc serves a block that large with a fresh ``mmap`` and returns it
with ``munmap``, so every step touches new pages: on the README's 2-core CPU,
``benchmarks/vs_pytorch.py``'s training step (B 8, tgt_len = mem_len 128)
took 81,200 page faults and 115 ms of kernel time per 790 ms step.  glibc's
documented tunable ``glibc.malloc.hugetlb=1`` (glibc >= 2.35, "Memory
Allocation Tunables" in its manual) makes ``malloc`` ask the kernel for
transparent huge pages for such blocks (``madvise``): measured, 463 page
faults and 38 ms per step, 13% more tokens/s.  Tunables are read when a
process starts, so :func:`reexec_with_hugepages` starts the command again,
once, with ``GLIBC_TUNABLES`` extended; ``python -m transformer_xl.main``
calls it first.  ``TRANSFORMER_XL_HUGEPAGES=0`` turns it off.

Compiling a step leaves hundreds of MiB of freed memory in glibc's heap,
which glibc keeps, so it stays resident and the step's own buffers come on
top of it: :func:`release_free_memory` (glibc's ``malloc_trim``) hands it
back, and :func:`release_after_compiles` makes that happen after every XLA
compilation (``python -m transformer_xl.main`` and
``train.train_and_evaluate`` turn it on).  Measured on the README's CPU
(``benchmarks/vs_pytorch.py``'s training step): peak RSS 1,227 MiB
without, 904 MiB with.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Mapping, Optional

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "TRANSFORMER_XL_HUGEPAGES"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode() -> str:
  """The kernel's transparent huge page mode ("always", "madvise", "never"),
  "" where it cannot be read."""
  try:
    with open(_THP) as f:
      text = f.read()
  except OSError:
    return ""
  return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


def hugepages_environ(environ: Mapping[str, str], libc: Optional[str] = None,
                      thp: Optional[str] = None) -> Optional[dict]:
  """The environment to restart with, or None where a restart would not help.

  Args:
    environ: the current environment.
    libc: the C library's name, "glibc" on glibc systems (None: this
      machine's, ``platform.libc_ver()[0]``).
    thp: the kernel's transparent huge page mode (None: this machine's,
      :func:`thp_mode`).

  Returns:
    ``environ`` with :data:`TUNABLE` appended to ``GLIBC_TUNABLES``; None
    when the C library is not glibc, the kernel's huge pages are off or
    unknown, ``GLIBC_TUNABLES`` already sets ``glibc.malloc.hugetlb`` (so a
    restarted process never restarts again) or ``TRANSFORMER_XL_HUGEPAGES``
    is "0".
  """
  libc = platform.libc_ver()[0] if libc is None else libc
  thp = thp_mode() if thp is None else thp
  tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
  if (libc != "glibc" or thp not in ("always", "madvise")
      or environ.get(OPT_OUT, "1") == "0"
      or any(t.startswith("glibc.malloc.hugetlb=") for t in tunables)):
    return None
  env = dict(environ)
  env["GLIBC_TUNABLES"] = ":".join(tunables + [TUNABLE])
  return env


def release_free_memory() -> bool:
  """Returns the heap memory that glibc holds free to the kernel
  (``malloc_trim(0)``, glibc's "Memory Allocation" functions), so that it
  no longer counts as resident.  Call it after work that frees much, such
  as compiling a step.

  Returns:
    True where it ran (glibc); False elsewhere, where it does nothing.
  """
  if platform.libc_ver()[0] != "glibc":
    return False
  try:
    libc = ctypes.CDLL(None)
    libc.malloc_trim(0)
  except (OSError, AttributeError):
    return False
  return True


# JAX's monitoring event at the end of every backend (XLA) compilation.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_listening = False


def release_after_compiles() -> None:
  """From now on, :func:`release_free_memory` runs right after every XLA
  compilation of this process, before the compiled program first runs (a
  ``jax.monitoring`` listener on the backend-compile event).  Idempotent;
  imports jax.  Compilations served from a persistent cache skip it (they
  free little)."""
  global _listening
  if _listening:
    return
  import jax

  def listener(event: str, duration_secs: float, **kwargs) -> None:
    if event == _COMPILE_EVENT:
      release_free_memory()

  jax.monitoring.register_event_duration_secs_listener(listener)
  _listening = True


def reexec_with_hugepages() -> None:
  """Restarts this process (same interpreter, options and arguments, same
  PID: ``os.execve``) with glibc's huge-page tunable, where it helps
  (:func:`hugepages_environ`); otherwise, or if the restart fails, returns
  and the process goes on as it is.  Call it before any output or work."""
  if not sys.platform.startswith("linux"):
    return
  env = hugepages_environ(os.environ)
  argv = list(getattr(sys, "orig_argv", []))
  if env is None or len(argv) < 2:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, [sys.executable] + argv[1:], env)
  except OSError:
    pass
