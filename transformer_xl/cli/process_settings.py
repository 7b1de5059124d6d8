"""Everything that changes the whole process, in one place, for the entry points only.

The library (models, training, evaluation, checkpoints, data) never changes
process-wide state: importing and using it from Python leaves logging,
signal handlers, ``sys`` hooks, the environment and JAX's global settings as
they were.  The command-line entry points (``python -m transformer_xl.main``
through ``cli/modes.py``, ``python -m transformer_xl.convert``, the analysis
tools, ``benchmarks/``) call what they need from here, explicitly:

* ``reexec_with_hugepages``: restart once with glibc's transparent huge
  pages for XLA:CPU's buffers (below);
* ``release_after_compiles``: hand the memory a compilation freed back
  to the kernel after every XLA compilation (glibc's ``malloc_trim``);
* ``configure_logging``: absl at WARNING (orbax and tfds log every file
  at INFO), no preparation noise from tfds (its progress bars, its two
  printed lines, its warning about a custom configuration) unless
  ``--verbosity`` is given, and, unless ``debug``, no log of the errors that
  the command line reports as one line anyway (orbax's own logs, asyncio's
  tasks that orbax abandons after a failed write, reads that complete after
  orbax gave up on a damaged checkpoint);
* ``StopSignals``: SIGTERM (a preempted Cloud TPU VM) and SIGINT
  (Ctrl-C) set a flag that the training loop reads at a step boundary to
  save and stop, instead of killing;
* ``initialize_distributed``: ``jax.distributed`` for a multi-process
  run.

Huge pages: XLA:CPU allocates the temporaries of each step through glibc's
``malloc`` from its worker threads, as one block of hundreds of MiB for a
training step; glibc serves a block that large with a fresh ``mmap`` and
returns it with ``munmap``, so every step faults in new 4 KiB pages (81,200
per training step of ``benchmarks/vs_pytorch.py`` on a 2-core CPU, 115 ms
of kernel time per 790 ms step).  glibc's documented tunable
``glibc.malloc.hugetlb=1`` (glibc >= 2.35, "Memory Allocation Tunables" in
its manual) makes ``malloc`` ask the kernel for transparent huge pages for
such blocks (measured: 463 page faults, 13% more tokens/s).  Tunables are
read when a process starts, hence the restart; ``TRANSFORMER_XL_HUGEPAGES=0``
turns it off.  Python API users set the variable themselves:
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python ...``.

This module imports only the standard library at import time (the
benchmark's PyTorch worker imports it without JAX).
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import io
import logging
import os
import platform
import re
import signal
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "TRANSFORMER_XL_HUGEPAGES"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


# --------------------------------------------------------------------------- #
# glibc: huge pages and malloc_trim.


def thp_mode() -> str:
  """The kernel's transparent huge page mode ("always", "madvise", "never"),
  "" where it cannot be read."""
  try:
    with open(_THP) as f:
      text = f.read()
  except OSError:
    return ""
  return text[text.find("[") + 1 : text.find("]")] if "[" in text else ""


def hugepages_environ(
    environ: Mapping[str, str], libc: str | None = None, thp: str | None = None
) -> dict | None:
  """The environment to restart with, or None where a restart would not help.

  Args:
    environ: the current environment.
    libc: the C library's name, "glibc" on glibc systems (None: this
      machine's, ``platform.libc_ver()[0]``).
    thp: the kernel's transparent huge page mode (None: this machine's,
      ``thp_mode``).

  Returns:
    ``environ`` with ``TUNABLE`` appended to ``GLIBC_TUNABLES``; None
    when the C library is not glibc, the kernel's huge pages are off or
    unknown, ``GLIBC_TUNABLES`` already sets ``glibc.malloc.hugetlb`` (so a
    restarted process never restarts again) or ``TRANSFORMER_XL_HUGEPAGES``
    is "0".
  """
  libc = platform.libc_ver()[0] if libc is None else libc
  thp = thp_mode() if thp is None else thp
  tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
  if (
      libc != "glibc"
      or thp not in ("always", "madvise")
      or environ.get(OPT_OUT, "1") == "0"
      or any(t.startswith("glibc.malloc.hugetlb=") for t in tunables)
  ):
    return None
  env = dict(environ)
  env["GLIBC_TUNABLES"] = ":".join(tunables + [TUNABLE])
  return env


def reexec_with_hugepages() -> None:
  """Restarts this process (same interpreter, options and arguments, same
  PID: ``os.execve``) with glibc's huge-page tunable, where it helps
  (``hugepages_environ``); otherwise, or if the restart fails, returns
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
  """From now on, ``release_free_memory`` runs right after every XLA
  compilation of this process, before the compiled program first runs (a
  ``jax.monitoring`` listener on the backend-compile event): compiling a
  step leaves hundreds of MiB freed in glibc's heap, which glibc keeps
  resident under the step's own buffers (``benchmarks/vs_pytorch.py``'s
  training step: peak RSS 1,227 MiB without, 904 MiB with).  Idempotent;
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


# --------------------------------------------------------------------------- #
# Logging: one line per user error.


_ORBAX_DIR = os.sep + "orbax" + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_report(record: logging.LogRecord) -> bool:
  """An INFO record of a module of this package (a report for the user)."""
  return record.levelno == logging.INFO and (record.pathname or "").startswith(_PACKAGE_DIR)


class _Reports(logging.StreamHandler):
  """Prints the package's reports as plain lines on stdout."""

  def __init__(self):
    super().__init__(sys.stdout)
    self.setFormatter(logging.Formatter("%(message)s"))
    self.addFilter(_is_report)

  def emit(self, record: logging.LogRecord) -> None:
    self.setStream(sys.stdout)  # the current one (tests and tools swap it)
    super().emit(record)
    self.flush()


# Other libraries' warnings that leave nothing to act on, as (a part of the
# path of the file that logs it, the start of its message): tfds's for every
# dataset of this package, each a custom BuilderConfig named by the corpus's
# fingerprint (data/text_builder.py, own text only).
_NOISE = ((os.sep + "tensorflow_datasets" + os.sep, "Using custom data configuration"),)


def _is_noise(record: logging.LogRecord) -> bool:
  """A record of ``_NOISE``."""
  path, msg = record.pathname or "", str(record.msg)
  return any(part in path and msg.startswith(start) for part, start in _NOISE)


class _NotReports(logging.Filter):
  """On absl's handler: everything but the package's reports (printed by
  ``_Reports``), and other libraries' records below WARNING, and their
  warnings of ``_NOISE``, only with ``third_party_info``."""

  def __init__(self, third_party_info: bool):
    super().__init__()
    self._third_party_info = third_party_info

  def filter(self, record: logging.LogRecord) -> bool:
    if _is_report(record):
      return False
    if self._third_party_info:
      return True
    return record.levelno >= logging.WARNING and not _is_noise(record)


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _printed_as_logged(method):
  """``method`` (of tfds's ``DatasetBuilder``, taking no arguments), with
  what it prints on stdout logged instead, one absl INFO record per line
  (terminal escape codes removed), attributed to tfds's own code that
  called it: a third-party INFO record, shown only with ``--verbosity``."""

  def logged(self) -> None:
    from absl import logging as absl_logging

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      method(self)
    for line in _ESCAPES.sub("", printed.getvalue()).splitlines():
      if line.strip():
        absl_logging.info("%s", line, stacklevel=2)

  logged.txl_logged = True  # type: ignore[attr-defined]
  return logged


# The tfds methods that print on stdout while a dataset is prepared:
# "Downloading and preparing dataset <size> ... to DIR..." before (an own-text
# corpus has no size: "Unknown size" four times) and "Dataset NAME downloaded
# and prepared to DIR. Subsequent calls will reuse this data." after.
_TFDS_PRINTS = ("_log_download_bytes", "_log_download_done")


def _quiet_preparation(verbose: bool) -> None:
  """tfds's output while it prepares a dataset, as verbose as ``verbose``:
  its progress bars (tqdm, with cursor-moving escape codes even in a log
  file; ``tfds.display_progress_bar``) only when it is, and its two
  printed lines (``_TFDS_PRINTS``) logged as its INFO records instead
  (``_printed_as_logged``), which ``_NotReports`` shows only when it is.
  The package's own progress bars (a corpus's tokenisation, training) are
  shown on terminals only, whatever ``verbose``.  Idempotent; imports tfds."""
  import tensorflow_datasets as tfds

  tfds.display_progress_bar(verbose)
  builder = tfds.core.DatasetBuilder
  for name in _TFDS_PRINTS:
    method = getattr(builder, name, None)  # a later tfds may rename them: then as it is
    if method is not None and not getattr(method, "txl_logged", False):
      setattr(builder, name, _printed_as_logged(method))


_UNRETRIEVED = " exception was never retrieved"


class _NotFromOrbax(logging.Filter):
  """Drops the absl records that orbax's own code emits: the tracebacks it
  logs for the exceptions it raises (the command line reports each as one
  line), and those its worker threads log, one per array, after a failed
  write."""

  def filter(self, record: logging.LogRecord) -> bool:
    return _ORBAX_DIR not in (record.pathname or "")


class _NoUnretrievedTasks(logging.Filter):
  """Drops asyncio's "Task (Future, _GatheringFuture) exception was never
  retrieved" for the write tasks orbax abandons when one write fails (logged whenever they are
  garbage collected, even inside a later save)."""

  def filter(self, record: logging.LogRecord) -> bool:
    # "<class> exception was never retrieved": Task, Future and asyncio's
    # _GatheringFuture (a failed gather of several writes) alike.
    return not str(record.msg).split("\n", 1)[0].endswith(_UNRETRIEVED)


def _quiet_unraisable(previous):
  """An unraisable-exception hook that drops what orbax's abandoned I/O
  leaves behind: the "Event loop is closed" of reads still pending when
  orbax gave up on a damaged checkpoint (tensorstore completes them after
  orbax's event loop is gone), and the coroutines a library left pending
  and that are closed at exit (this package runs no coroutine of its own);
  every other unraisable exception goes to ``previous``."""

  def hook(unraisable):
    if (
        isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"
    ):
      return
    if inspect.iscoroutine(unraisable.object):
      return
    previous(unraisable)

  hook.txl_quiet = True
  return hook


def configure_logging(debug: bool, verbosity_given: bool = False) -> None:
  """The command line's logging.

  * The package's reports (``report.log`` and every other absl INFO record
    of a module of this package) are printed as plain lines on stdout,
    what the user reads (``_Reports``); absl's own handler (stderr, with
    its prefix) does not repeat them.
  * Other libraries' INFO records (orbax and tfds log every file) are
    dropped unless ``--verbosity`` was given; so is tfds's preparation
    noise (``_quiet_preparation``: its progress bars, the lines it prints,
    its warning of ``_NOISE``); other warnings and errors always reach
    absl's handler.
  * Unless ``debug``, none of the logs of orbax's failures
    (``_NotFromOrbax``, ``_NoUnretrievedTasks``, ``_quiet_unraisable``): a
    failed checkpoint write or read is reported by the command line as
    one message.

  Idempotent.

  Args:
    debug: ``--debug``: keep every log (and the tracebacks of user errors).
    verbosity_given: absl's ``--verbosity`` flag was given: leave it.
  """
  from absl import logging as absl_logging

  if not verbosity_given:
    absl_logging.set_verbosity(absl_logging.INFO)
  # absl's records go to these two handlers only (not also to handlers that
  # another library put on the root logger, e.g. through basicConfig).
  absl_logger = logging.getLogger("absl")
  if not any(isinstance(h, _Reports) for h in absl_logger.handlers):
    absl_logger.addHandler(_Reports())
  handler = absl_logging.get_absl_handler()
  if handler not in absl_logger.handlers:
    absl_logger.addHandler(handler)
  absl_logger.propagate = False
  for f in list(handler.filters):
    if isinstance(f, _NotReports):
      handler.removeFilter(f)
  handler.addFilter(_NotReports(third_party_info=verbosity_given))
  _quiet_preparation(verbose=verbosity_given)
  if debug:
    return
  for name, filter_cls in (("absl", _NotFromOrbax), ("asyncio", _NoUnretrievedTasks)):
    logger = logging.getLogger(name)
    if not any(isinstance(f, filter_cls) for f in logger.filters):
      logger.addFilter(filter_cls())
  if not getattr(sys.unraisablehook, "txl_quiet", False):
    sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)


# --------------------------------------------------------------------------- #
# Signals: a preempted VM's SIGTERM and a user's Ctrl-C become a clean stop.


class StopSignals:
  """While active, SIGTERM (what a preempted Cloud TPU VM receives, and what
  ``launch/stop.sh`` sends) and SIGINT (Ctrl-C) only set a flag,
  ``received``, which the training loop reads at a step boundary to
  write a checkpoint and return (``guards.PreemptionGuard`` agrees on it
  across processes).  The first Ctrl-C prints one line saying so; a second
  one quits at once (exit status 130, no traceback, no checkpoint: the
  newest one written is intact, and a write it interrupts is a partial
  write that the next training removes).  The previous handlers are
  restored on exit."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self._received = ""
    self._previous = {}

  def __enter__(self) -> StopSignals:
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handler)
    return self

  def __exit__(self, *exc) -> None:
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)

  def _handler(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
      if self._received == name:
        sys.stderr.write(
            "\nSIGINT again: quitting without a checkpoint (the newest one written is intact).\n"
        )
        sys.stderr.flush()
        os._exit(130)
      sys.stderr.write(
          "\nSIGINT: stopping after the current step with a checkpoint (Ctrl-C "
          "again quits at once, without one).\n"
      )
      sys.stderr.flush()
    self._received = self._received or name

  def received(self) -> str:
    """The name of the first stop signal since ``__enter__`` ("SIGTERM"
    or "SIGINT"; a true value), or "" if none came."""
    return self._received


# --------------------------------------------------------------------------- #
# Several processes.


def on_tpu_vm() -> bool:
  """Whether this looks like a Cloud TPU VM (its metadata env or accel devices)."""
  return bool(
      os.environ.get("TPU_ACCELERATOR_TYPE")
      or os.environ.get("TPU_WORKER_HOSTNAMES")
      or os.path.exists("/dev/accel0")
      or os.path.exists("/dev/vfio/0")
  )


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
  """Starts jax.distributed for a multi-process run; a no-op for one process.

  With ``coordinator_address`` all three values are required (explicit
  setup, e.g. CPU processes on 127.0.0.1 with gloo collectives, or GPU
  hosts).  Without it, on a Cloud TPU VM slice, ``jax.distributed.initialize()``
  discovers everything by itself.  Must run before any other JAX call.

  Raises:
    default_config.ConfigError: an incomplete set of values.
  """
  import jax

  from transformer_xl import default_config

  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise default_config.ConfigError(
        "--coordinator_address, --num_processes and --process_id go together: give all three "
        "(or none on a Cloud TPU VM)."
    )
  if coordinator_address:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )
  elif on_tpu_vm():
    jax.distributed.initialize()
