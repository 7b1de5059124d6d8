"""Multi-process runs: start-up, work done once by process 0, agreeing on a flag.

Every process of a run executes the same program on its own devices
(jax.distributed).  On a Cloud TPU VM slice everything is detected; GPU
hosts, or CPU processes for testing (gloo collectives over 127.0.0.1), pass
the coordinator address, the number of processes and their index.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, TypeVar

import jax
import numpy as np

from transformer_xl import default_config

T = TypeVar("T")


def on_tpu_vm() -> bool:
  """Whether this looks like a Cloud TPU VM (its metadata env or accel devices)."""
  return bool(os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("TPU_WORKER_HOSTNAMES")
              or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"))


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> None:
  """Starts jax.distributed for a multi-process run; a no-op for one process.

  With ``coordinator_address`` all three values are required (explicit
  setup, e.g. CPU processes on 127.0.0.1 with gloo collectives, or GPU
  hosts).  Without it, on a Cloud TPU VM slice, ``jax.distributed.initialize()``
  discovers everything by itself.  Must run before any other JAX call.

  Raises:
    default_config.ConfigError: an incomplete set of values.
  """
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise default_config.ConfigError(
        "--coordinator_address, --num_processes and --process_id go together: give all three "
        "(or none on a Cloud TPU VM).")
  if coordinator_address:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif on_tpu_vm():
    jax.distributed.initialize()


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


def process_0_first(fn: Callable[[], T], errors: tuple[type[Exception], ...],
                    what: str = "prepare the dataset") -> T:
  """Runs ``fn`` on process 0, then on the others (e.g. preparing a dataset).

  With several processes, process 0 goes first (so a shared directory is
  written once), then the others run ``fn`` (reading what process 0 wrote,
  or doing their own copy on a local disk).  An error of a type in
  ``errors`` on process 0 stops every process with an error instead of
  leaving them waiting; ``what`` names the work in that error.

  Raises:
    The error ``fn`` raised on process 0 (there); on the others,
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
