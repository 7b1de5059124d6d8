"""The test harness's own policy (setup.cfg, [tool:pytest]): a test whose
pytest-xdist worker crashes in native code runs once more; a Python failure
never does; each crash is summed up after the final counts (crash_report.py).

Runs pytest in a subprocess on three throw-away tests under the project's real
[tool:pytest] settings and crash_report plugin: one that aborts its worker on
the first run only, one that fails an assertion on the first run only, one
that always aborts.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from harness import project_pytest_settings

pytestmark = pytest.mark.slow  # tooling: the test harness

_ROOT = pathlib.Path(__file__).resolve().parents[2]

# The crashing tests wait a second before they abort, as a real crash comes
# well into a test: pytest-rerunfailures learns a test's rerun count from a
# message the worker sends without waiting when the test starts, and a
# worker that dies within microseconds of it can beat the message to the
# controller (the test is then not rerun: two of eight runs here).
_TESTS = """
import os, pathlib, time
MARKS = pathlib.Path(os.environ["HARNESS_MARKS"])

def _first_time(name):
  mark = MARKS / name
  if mark.exists():
    return False
  mark.touch()
  return True

def test_worker_crashes_on_the_first_run():
  if _first_time("crash"):
    time.sleep(1)
    os.abort()

def test_assertion_fails_on_the_first_run():
  if _first_time("fail"):
    assert False, "a Python failure"

def test_worker_crashes_every_time():
  time.sleep(1)
  os.abort()
"""


def test_a_crashed_worker_s_test_reruns_once_and_a_python_failure_never(tmp_path):
  run_dir = tmp_path / "run"
  marks = tmp_path / "marks"
  run_dir.mkdir()
  marks.mkdir()
  (run_dir / "setup.cfg").write_text(project_pytest_settings())
  (run_dir / "test_policy.py").write_text(_TESTS)
  env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
  env["HARNESS_MARKS"] = str(marks)
  env["PYTHONPATH"] = os.pathsep.join([str(_ROOT / "tests" / "harness"), env.get("PYTHONPATH", "")])
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "pytest",
          "-q",
          "-n",
          "2",
          "-p",
          "no:cacheprovider",
          "-rA",
          "-p",
          "crash_report",
      ],
      cwd=run_dir,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  text = out.stdout + out.stderr
  assert out.returncode == 1, text
  lines = out.stdout.strip().splitlines()
  crashes = [l for l in lines if l.startswith("worker crash: ")]
  # The crash-once test passes on its rerun; the always-crashing one is rerun
  # once and then fails; the assertion fails once and is not rerun.
  assert re.search(r"\b2 failed, 1 passed, 2 rerun\b", lines[-1 - len(crashes)]), text
  # Three crashes, each summed up after the counts with its test, its signal
  # and the line of the test that crashed.
  assert len(crashes) == 3 and lines[-3:] == crashes, text
  for test, n in (
      ("test_worker_crashes_on_the_first_run", 1),
      ("test_worker_crashes_every_time", 2),
  ):
    mine = [l for l in crashes if f"running test_policy.py::{test}: " in l]
    assert len(mine) == n, text
    assert all(
        "Fatal Python error: Aborted; innermost frame: File " in l
        and 'test_policy.py", line ' in l
        and l.endswith(f" in {test}")
        for l in mine
    ), text
  assert "PASSED test_policy.py::test_worker_crashes_on_the_first_run" in text, text
  assert "FAILED test_policy.py::test_assertion_fails_on_the_first_run" in text, text
  assert "FAILED test_policy.py::test_worker_crashes_every_time" in text, text
