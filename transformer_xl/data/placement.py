"""Multi-process row placement: which rows a process reads, and the global batch.

Each process materialises only the global batch rows its addressable
devices hold (``process_row_ids``, passed to the iterators as
``row_ids``) and ``to_global_batch`` assembles the global ``jax.Array``
batch from every process's local rows; see the batch contract of
``transformer_xl.data``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformer_xl.data.checks import check_positive


def process_row_ids(
    sharding: jax.sharding.Sharding, global_batch: int, tgt_len: int | None = None
) -> list[int]:
  """Global batch rows held by this process's addressable devices.

  Args:
    sharding: the sharding of the global [global_batch, tgt_len] batch arrays
      (e.g. ``NamedSharding(mesh, P("data", None))``).
    global_batch: B, rows of the global batch, >= 1.
    tgt_len: T, only needed when ``sharding`` splits the time axis unevenly;
      by default the number of devices of the sharding is used as the time
      length, which any even split of the time axis divides.

  Returns:
    Sorted, duplicate-free list of row indices in [0, B): the union of the
    rows of every addressable device's shard (rows replicated on several
    local devices appear once).  Pass it as ``row_ids`` to the iterators.

  Raises:
    ValueError: global_batch or tgt_len < 1, or the sharding cannot shard a
      [global_batch, tgt_len] array (e.g. B not divisible by the data axis).
  """
  global_batch = check_positive("global_batch", global_batch)
  if tgt_len is None:
    tgt_len = len(sharding.device_set)
  tgt_len = check_positive("tgt_len", tgt_len)
  try:
    index_map = sharding.addressable_devices_indices_map((global_batch, tgt_len))
  except Exception as e:  # jax raises several types for an incompatible shape.
    raise ValueError(
        f"the sharding {sharding} cannot shard a batch of shape "
        f"({global_batch}, {tgt_len}): {e}. Make global_batch "
        f"divisible by the size of the mesh axes that shard the "
        f"batch axis."
    ) from e
  rows: set[int] = set()
  for index in index_map.values():
    row_slice = index[0] if index else slice(None)
    rows.update(range(*row_slice.indices(global_batch)))
  return sorted(rows)


def _batch_axis_sharding(sharding: jax.sharding.Sharding) -> NamedSharding:
  """The sharding of a [B] array that follows the batch axis of ``sharding``."""
  if not isinstance(sharding, NamedSharding):
    raise TypeError(
        f"to_global_batch needs a jax.sharding.NamedSharding (to "
        f"derive the sharding of the [B] reset array), got "
        f"{type(sharding).__name__}; build the batch sharding as "
        f"NamedSharding(mesh, PartitionSpec('data', None))."
    )
  batch_spec = sharding.spec[0] if len(sharding.spec) else None
  return NamedSharding(sharding.mesh, PartitionSpec(batch_spec))


def to_global_batch(
    local_batch: Mapping[str, np.ndarray], sharding: jax.sharding.Sharding, global_batch: int
) -> dict[str, jax.Array]:
  """Assembles global ``jax.Array`` batches from each process's local rows.

  Every process calls this with its own local batch (rows ``row_ids`` from
  ``process_row_ids`` of the same sharding, in that order).  Arrays with
  2 or more dimensions (``inputs``, ``targets``, ``weights``: [b, T]) become
  [global_batch, T] arrays with ``sharding``; 1-D arrays (``reset``: [b])
  become [global_batch] arrays sharded like the batch axis of ``sharding``
  (``NamedSharding(mesh, PartitionSpec(spec[0]))``).  Dtypes are kept.

  Args:
    local_batch: dict of numpy arrays whose leading axis is this process's
      rows, e.g. a batch of any of the iterators.
    sharding: the NamedSharding of the global [global_batch, T] batch.
    global_batch: B, rows of the global batch, >= 1.

  Returns:
    Dict with the same keys of global jax.Arrays.

  Raises:
    ValueError: global_batch < 1, or an array is 0-dimensional.
    TypeError: sharding is not a NamedSharding.
    Exception: the errors of ``jax.make_array_from_process_local_data``
      when the local rows do not match the rows that ``sharding`` puts on
      this process.
  """
  global_batch = check_positive("global_batch", global_batch)
  row_sharding = _batch_axis_sharding(sharding)
  out = {}
  for key, local in local_batch.items():
    local = np.asarray(local)
    if local.ndim == 0:
      raise ValueError(
          f"local_batch[{key!r}] is a scalar; every batch array needs a leading row axis."
      )
    global_shape = (global_batch,) + local.shape[1:]
    target = sharding if local.ndim >= 2 else row_sharding
    out[key] = jax.make_array_from_process_local_data(target, local, global_shape)
  return out
