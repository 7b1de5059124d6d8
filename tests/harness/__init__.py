"""The test harness: what happens when a test's xdist worker crashes.

``crash_report.py`` (a pytest plugin, loaded by ``tests/conftest.py``) prints a
crashed worker's faulthandler dump and a one-line summary per crash at the
end of the output; ``setup.cfg``'s ``[tool:pytest]`` reruns such a test once
in a new worker (pytest-rerunfailures) and never reruns a Python failure;
``test_harness.py`` checks both.

``project_pytest_settings`` gives the harness tests the project's pytest
settings for the throw-away runs they make.
"""

import configparser
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def project_pytest_settings() -> str:
  """[tool:pytest] of the project's setup.cfg, minus testpaths."""
  cfg = configparser.ConfigParser()
  cfg.read(_ROOT / "setup.cfg")
  lines = [  # a multi-line value (markers) keeps its continuation lines indented
      f"{key} = {value}".replace("\n", "\n    ")
      for key, value in cfg["tool:pytest"].items()
      if key != "testpaths"
  ]
  return "[tool:pytest]\n" + "\n".join(lines) + "\n"
