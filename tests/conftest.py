"""Test-wide setup: 8 simulated CPU devices, so mesh-sharded code runs here.

Must run before jax is imported anywhere, which is why it lives in conftest.
Also the fixtures of several test modules (``reports``, ``hf_tokenization``);
their other shared helpers are in helpers.py.
"""

import atexit
import gc
import os
import shutil
import sys
import tempfile
import types
import warnings

import pytest

# A crashed xdist worker's dump, at the end of the output (tests/harness/).
pytest_plugins = ("harness.crash_report",)

# XLA's backend (LLVM) optimisation off, here and in every process a test starts (they
# inherit XLA_FLAGS): the tests' programs are tiny and compiled by the hundred, so compiling
# is most of the suite's time (a command-line test's wall time about halves) and running
# them is not.  Float results may differ from an optimised build's in the last bits; the
# fixtures compared bit for bit (tests/test_memory_bitwise.py, tests/test_memory_legacy.py)
# were written with the same flag and say so (scripts/make_memory_fixtures.py ``machine``).
# Set XLA_FLAGS=--xla_backend_optimization_level=2 (or 3) to run the suite optimised.
for _FLAG in (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
):
  if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# XLA's CPU client launches each device's part of a program on a pool of
# max(NPROC or the cores, devices) threads ("XLAPjRtCpuClient"), and runs the
# collectives on an intra-op pool of the same size ("XLAEigen"). On a 2-core machine
# that is 8 threads for 8 simulated devices: exactly one collective's participants.
# With programs dispatched asynchronously (dynamic evaluation's steps, a training
# loop), a launch can wait on its device's in-flight limit while the earlier
# program's completion waits for a pool thread that every launch of the next
# collective holds: a deadlock, which XLA ends with an abort after
# --xla_cpu_collective_call_terminate_timeout_seconds ("Fatal Python error: Aborted",
# in InProcessCommunicator::AllReduce: 3 runs of 7 of
# test_dynamic_evaluation_learns_a_repeated_pattern beside 3 CPU hogs aborted, 0 of 30
# with this).  Twice the devices leaves threads beyond one collective's; processes the
# tests start inherit it.  (XLA reads NPROC in DefaultThreadPoolSize.)
os.environ.setdefault("NPROC", "16")

# JAX's persistent compilation cache, one fresh directory per test run, shared by this
# process, the xdist workers and every process a test starts (they inherit the variables):
# the command-line tests compile the same small programs in process after process (train,
# resume, eval; a killed run restarted).  A hit skips only XLA's backend compile of an
# identical program (tracing, lowering and "Compiling" log lines are unchanged).  The
# process that made the directory removes it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE_DIR = tempfile.mkdtemp(prefix="transformer_xl_tests_jax_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)


def pytest_configure(config):
  config.addinivalue_line(
      "markers",
      "slow: an end-to-end or tooling test (command line, several processes, "
      "launch scripts, notebook, study, benchmarks, docs), or a case of more than ~20 s on "
      "2 cores beside a faster one that covers the same path; left out of the fast tier, "
      "python -m pytest -q -n 2 -m 'not slow'",
  )


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session):
  """An xdist worker collects its garbage once and freezes what is left
  (``gc.freeze``) before it reports itself finished, so that what it still
  does after that report is quick.

  After the last worker's report, pytest-xdist tells each worker to end, and
  execnet gives a worker 5 s to finish (``WorkerGateway._terminate_execution``)
  before it sends it a SIGINT.  What a worker does in that time is mostly
  pytest's own end: five full ``gc.collect()`` (``_pytest.unraisableexception``,
  to report the exceptions of finalizers), each a walk over the worker's
  heap of jax, flax and the tests' objects (the smoke tier's: 230,000
  objects, 0.34 to 1.2 s a walk on 2 busy cores, 6.2 s for the five once).
  The SIGINT then came as a ``KeyboardInterrupt`` inside jax's gc callback,
  and a green run ended with a ``PytestUnraisableExceptionWarning`` block
  about it (tests/harness/test_worker_shutdown.py).  Here the walk is done once, before the report (session fixtures
  already torn down; a finalizer's exception is still reported: pytest's hook
  is in place), and the five later collections only see newer objects.
  """
  yield
  if hasattr(session.config, "workerinput"):
    gc.collect()
    gc.freeze()


_MAPS_LIMIT = 20_000  # of the kernel's default vm.max_map_count of 65,530


def _mapped_regions() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux
    return 0


@pytest.fixture(autouse=True)
def _release_compiled_code():
  """Frees jax's cached executables once the process maps many regions.

  Every executable (the thousands of small ones that eager, un-jitted code
  compiles too) keeps a few memory mappings for as long as jax caches it; a
  single-process run of the whole suite used to pass the kernel's limit on
  mappings and die with a segmentation fault inside XLA's compiler.
  """
  yield
  if _mapped_regions() > _MAPS_LIMIT:
    import jax  # after the XLA_FLAGS above are set

    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True)
def _restore_process_logging():
  """Puts back what a command line run in the test's own process changes for
  the whole process (``process_settings.configure_logging``: the absl and
  asyncio loggers' filters and levels, absl's verbosity, sys.unraisablehook),
  so that such a test (e.g. the converter's ``main`` called in-process) leaves
  no filter behind for a later test in the same worker."""
  import logging

  from absl import logging as absl_logging

  loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
  saved = [(lg, list(lg.filters), list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
  absl_handler = absl_logging.get_absl_handler()
  handler_filters = list(absl_handler.filters)
  hook = sys.unraisablehook
  yield
  for lg, filters, handlers, level, propagate in saved:
    lg.filters[:] = filters
    lg.handlers[:] = handlers
    lg.setLevel(level)
    lg.propagate = propagate
  absl_handler.filters[:] = handler_filters
  sys.unraisablehook = hook


class Reports:
  """The package's reports (``util.report.log`` and other absl INFO records of
  its modules) that a test's own process logged."""

  def __init__(self, caplog):
    self._caplog = caplog

  @property
  def lines(self) -> list[str]:
    import logging

    return [
        r.getMessage()
        for r in self._caplog.records
        if r.levelno == logging.INFO and f"{os.sep}transformer_xl{os.sep}" in r.pathname
    ]

  @property
  def text(self) -> str:
    return "\n".join(self.lines)


@pytest.fixture
def reports(caplog):
  """``Reports`` of this test (absl INFO captured through caplog)."""
  caplog.set_level("INFO")
  return Reports(caplog)


@pytest.fixture
def hf_tokenization(monkeypatch):
  """transformers' TransfoXLTokenizer module, with stand-in ``sacremoses``
  tokenizers (the real package is not a dependency) under their real module
  names, so that save_vocabulary pickles the same globals as with it."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      import transformers.models.transfo_xl.tokenization_transfo_xl as tok
    except ImportError:  # newer transformers moved it
      import transformers.models.deprecated.transfo_xl.tokenization_transfo_xl as tok
  from transformers.utils import import_utils

  pkg = types.ModuleType("sacremoses")
  submodules = {
      "tokenize": types.ModuleType("sacremoses.tokenize"),
      "normalize": types.ModuleType("sacremoses.normalize"),
  }
  for sub, name in (
      ("tokenize", "MosesTokenizer"),
      ("tokenize", "MosesDetokenizer"),
      ("normalize", "MosesPunctNormalizer"),
  ):

    def init(self, lang="en"):
      self.lang, self.NONBREAKING_PREFIXES = lang, ["Mr", "Dr"]

    cls = type(name, (), {"__init__": init, "__module__": f"sacremoses.{sub}"})
    setattr(submodules[sub], name, cls)
    setattr(pkg, name, cls)
  for sub, module in submodules.items():
    setattr(pkg, sub, module)
    monkeypatch.setitem(sys.modules, module.__name__, module)
  monkeypatch.setitem(sys.modules, "sacremoses", pkg)
  monkeypatch.setattr(tok, "sm", pkg, raising=False)
  monkeypatch.setattr(import_utils, "_sacremoses_available", True)
  return tok
