"""A pytest plugin: what a crashed pytest-xdist worker was doing, at the end
of the output.

When a worker dies in native code (a signal, an abort), pytest-xdist says
only which test it was running; the worker's faulthandler dump (the signal
and every thread's Python stack) went to the terminal in the middle of the
run, where a CI log that keeps only its head and tail drops it.  Here each
worker writes its dump to a file of its own instead, and the controller
prints, for each crash: a section "worker crashes" with the whole dump
(before the short test summary), and after the final line of counts one
line with the worker, the test, the signal and the crashing thread's
innermost frame (and its innermost frame in the project's own files).

Loaded by ``tests/conftest.py``; ``tests/harness/test_harness.py`` checks it.
"""

import faulthandler
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

_ENV = "TXL_CRASH_DIR"  # the controller's directory, inherited by its workers
_dump_file = None  # the worker's open dump file (faulthandler keeps its fd)
_crashes: dict = {}  # controller: worker id -> {"test": nodeid, "dump": text}


def _is_worker(config) -> bool:
  return hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin enabled its own
def pytest_configure(config):
  global _dump_file
  if _is_worker(config):
    directory = os.environ.get(_ENV)
    if directory and Path(directory).is_dir():
      worker = config.workerinput["workerid"]
      _dump_file = open(Path(directory) / f"{worker}-{os.getpid()}.txt", "w")
      faulthandler.enable(file=_dump_file, all_threads=True)
  elif getattr(config.option, "numprocesses", None):
    os.environ[_ENV] = tempfile.mkdtemp(prefix="txl-crash-")


def _dump_of(worker: str) -> str:
  directory = os.environ.get(_ENV)
  if not directory:
    return ""
  texts = [p.read_text(errors="replace") for p in sorted(Path(directory).glob(f"{worker}-*.txt"))]
  return "\n".join(t for t in texts if t.strip())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  """xdist: a worker went down; ``error`` is set when it crashed."""
  if error:
    worker = node.gateway.id
    _crashes.setdefault(worker, {"test": None})["dump"] = _dump_of(worker)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
  """xdist: the crashed worker was running ``crashitem``."""
  found = re.match(r"worker '([^']+)' crashed", str(report.longrepr))
  if found:
    _crashes.setdefault(found.group(1), {"dump": ""})["test"] = crashitem


def _summary(dump: str, root: Path) -> str:
  """The "Fatal Python error" line, and the crashing thread's innermost
  frame and innermost frame under ``root`` (the project's code or tests)."""
  lines = dump.splitlines()
  signal = next(
      (l.strip() for l in lines if l.startswith("Fatal Python error")),
      "no faulthandler dump (killed, or died before Python could write one)",
  )
  start = next((i for i, l in enumerate(lines) if l.startswith("Current thread")), None)
  if start is None:
    return signal
  frames = []  # the crashing thread's frames, innermost first, up to the next thread
  for line in lines[start + 1 :]:
    if not line.startswith("  File "):
      break
    frames.append(line.strip())
  ours = next((f for f in frames if f'"{root}' in f and "site-packages" not in f), None)
  return (
      signal
      + (f"; innermost frame: {frames[0]}" if frames else "")
      + (f"; innermost of ours: {ours}" if ours and ours != frames[0] else "")
  )


def _test(crash: dict) -> str:
  return crash.get("test") or "no test (it died between tests)"


def pytest_terminal_summary(terminalreporter):
  if not _crashes:
    return
  terminalreporter.section("worker crashes")
  for worker, crash in sorted(_crashes.items()):
    terminalreporter.line(f"[{worker}] running {_test(crash)}:")
    terminalreporter.line(crash.get("dump") or "(no faulthandler dump)")


def pytest_unconfigure(config):
  if _is_worker(config):
    if _dump_file is not None:
      faulthandler.disable()
      _dump_file.close()
    return
  for worker, crash in sorted(_crashes.items()):
    config.get_terminal_writer().line(
        f"worker crash: [{worker}] running {_test(crash)}: "
        + _summary(crash.get("dump") or "", config.rootpath)
    )
  directory = os.environ.pop(_ENV, None)
  if directory:
    shutil.rmtree(directory, ignore_errors=True)
