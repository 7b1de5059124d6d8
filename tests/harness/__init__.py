"""The test harness: what happens when a test's xdist worker crashes.

``crash_report.py`` (a pytest plugin, loaded by ``tests/conftest.py``) prints a
crashed worker's faulthandler dump and a one-line summary per crash at the
end of the output; ``setup.cfg``'s ``[tool:pytest]`` reruns such a test once
in a new worker (pytest-rerunfailures) and never reruns a Python failure;
``test_harness.py`` checks both.
"""
