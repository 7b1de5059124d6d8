"""The bottom floor: what every other part of the package may use.

``util`` imports nothing of the package (``tests/test_layout.py`` checks
it), so any module, ``data/`` and ``convert/`` included, can use it without
reaching into ``run/`` or another wing:

* ``report.py``: ``log``, the one way the package reports to the user
  (absl INFO, process 0);
* ``files.py``: ``write_text_atomic`` and ``write_bytes_atomic``, the one
  way the package replaces a small file.
"""
