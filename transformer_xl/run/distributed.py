"""Multi-process runs: work done once by process 0, agreeing on a flag, barriers.

Every process of a run executes the same program on its own devices
(jax.distributed, started by the entry point:
``process_settings.initialize_distributed``).  With one process every
function here is a plain call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import jax
import numpy as np

T = TypeVar("T")


def any_process(flag: bool) -> bool:
  """True on every process if ``flag`` is True on any (an all-gather; blocks)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  flags = multihost_utils.process_allgather(np.asarray([flag], np.int32))
  return bool(np.any(flags))


def barrier(name: str) -> None:
  """Waits until every process has reached the barrier ``name``; a no-op for one process."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def process_0_first(
    fn: Callable[[], T], errors: tuple[type[Exception], ...], what: str = "prepare the dataset"
) -> T:
  """Runs ``fn`` on process 0, then on the others (e.g. preparing a dataset).

  With several processes, process 0 goes first (so a shared directory is
  written once), then the others run ``fn`` (reading what process 0 wrote,
  or doing their own copy on a local disk).  An error of a type in
  ``errors`` on process 0 stops every process with an error instead of
  leaving them waiting; ``what`` names the work in that error.

  Raises:
    Exception: the error ``fn`` raised on process 0 (there); on the others,
      ``errors[0]`` with a message that points at process 0's.
  """
  if jax.process_count() == 1:
    return fn()
  result, error = None, None
  if jax.process_index() == 0:
    try:
      result = fn()
    except errors as err:
      error = err
  failed = any_process(error is not None)
  if error is not None:
    raise error
  if failed:
    raise errors[0](f"Process 0 could not {what}; see its error message.")
  return result if jax.process_index() == 0 else fn()
