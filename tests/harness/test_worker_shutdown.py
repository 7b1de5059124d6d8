"""A pytest-xdist worker's end is quick (tests/conftest.py's
``pytest_sessionfinish``): a green run used to end with a
``PytestUnraisableExceptionWarning`` about a ``KeyboardInterrupt`` in jax's
garbage-collection callback, the SIGINT that execnet sends a worker still
busy 5 s after it was told to end; what kept it busy was pytest's five
final ``gc.collect()``, each a walk over the whole heap.

Runs pytest in a subprocess, under the project's [tool:pytest] settings and
its tests/conftest.py, on a throw-away test that keeps 300,000 objects alive
(the smoke tier's workers keep 230,000), and reads how many objects those
final collections still walk in each worker.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from harness import project_pytest_settings

pytestmark = pytest.mark.slow  # tooling: the test harness

_ROOT = pathlib.Path(__file__).resolve().parents[2]

_TESTS = """
import pytest

KEEP = [[i] for i in range(300_000)]  # containers: the collector walks each one

@pytest.mark.parametrize("i", range(4))
def test_keeps_a_heap(i):
  assert len(KEEP) == 300_000
"""

# Loaded with -p: in each worker, when pytest ends (after every other
# pytest_unconfigure, right before its five collections), the number of
# objects a collection walks.
_MEASURE = """
import gc, os, pathlib
import pytest

@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  if hasattr(config, "workerinput"):
    out = pathlib.Path(os.environ["HARNESS_OUT"]) / f"{os.getpid()}.txt"
    out.write_text(str(len(gc.get_objects())))
"""


def test_a_worker_s_final_collections_walk_only_what_came_after_its_report(tmp_path):
  run_dir, out_dir = tmp_path / "run", tmp_path / "out"
  run_dir.mkdir()
  out_dir.mkdir()
  (run_dir / "setup.cfg").write_text(project_pytest_settings())
  (run_dir / "conftest.py").write_text((_ROOT / "tests" / "conftest.py").read_text())
  (run_dir / "test_heap.py").write_text(_TESTS)
  (run_dir / "measure_heap.py").write_text(_MEASURE)
  env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
  env["HARNESS_OUT"] = str(out_dir)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(run_dir), str(_ROOT / "tests"), env.get("PYTHONPATH", "")]
  )
  r = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"]
      + ["-p", "measure_heap"],
      cwd=run_dir,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  text = r.stdout + r.stderr
  assert r.returncode == 0 and "4 passed" in r.stdout, text
  assert "KeyboardInterrupt" not in text and "PytestUnraisableExceptionWarning" not in text, text
  walked = [int(p.read_text()) for p in out_dir.glob("*.txt")]
  assert len(walked) == 2, text
  # Without the freeze: the whole heap, over 300,000 in each worker.
  assert max(walked) < 100_000, walked
