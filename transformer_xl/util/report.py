"""The package's one report path: ``log``.

A message for the user (resumed from, a checkpoint set aside, a file
written, a download retried, a conversion's steps) is ``log(msg)``, never a
``print`` or a ``log=`` callback: absl logging at INFO, on process 0 only,
attributed to the module that called it.  The command line prints these
records as plain lines on stdout
(``cli.process_settings.configure_logging``); from Python, set
``absl.logging.set_verbosity(absl.logging.INFO)`` to see them; tests read
them with the ``reports`` fixture (``tests/conftest.py``).
"""

from __future__ import annotations

import jax
from absl import logging


def log(msg: str) -> None:
  """The package's reports (resumed from, checkpoints set aside, files
  written, ...): absl logging at INFO, on process 0 only, attributed to the
  caller.  The command line shows them as plain lines on stdout
  (``cli.process_settings.configure_logging``); from Python, set
  ``absl.logging.set_verbosity(absl.logging.INFO)`` to see them."""
  if jax.process_index() == 0:
    logging.info(msg, stacklevel=2)
