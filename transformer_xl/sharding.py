"""Device mesh and the logical-axis rules that place parameters and data.

Mesh axes: ``data`` (data parallel), ``fsdp`` (data parallel whose
devices also split the parameters and optimizer state, ZeRO-3 style) and
``model`` (tensor parallel).  ``fsdp`` may be left out of the mesh.

Parameters carry logical axis names (set where they are created, e.g.
``("embed", None, "heads", "kv")`` for qkv_net); ``LOGICAL_AXIS_RULES``
maps them to mesh axes: heads, d_inner ("mlp") and the vocabulary on
``model``, d_model ("embed") on ``fsdp``; the batch (and so the memory)
on ``data`` x ``fsdp`` (MaxText style).  Mesh axes missing from the mesh,
and those that do not divide a dimension, are dropped (replicated).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_xl.model.axes import BATCH_AXES, LOGICAL_AXIS_RULES  # noqa: F401 (re-exported)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replaces one -1 in ``shape`` by what the other axes leave of num_devices.

  Raises:
    ValueError: more than one -1, or the product is not num_devices.
  """
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1:
    raise ValueError(f"mesh.shape={shape} has more than one -1; give at most one.")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if known <= 0 or num_devices % known:
      raise ValueError(
          f"mesh.shape={shape} cannot fill {num_devices} devices: {num_devices} is not "
          f"divisible by {known}. Set --config.mesh.shape so its product is {num_devices}."
      )
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if int(np.prod(shape)) != num_devices:
    raise ValueError(
        f"mesh.shape={shape} has {int(np.prod(shape))} devices but {num_devices} are "
        f"available. Set --config.mesh.shape so its product is {num_devices} "
        f"(e.g. '({num_devices}, 1)')."
    )
  return shape


def check_mesh(
    shape: Sequence[int], axis_names: Sequence[str], num_devices: int
) -> tuple[int, ...]:
  """Checks a mesh's axis names against its shape; returns the resolved shape.

  Raises:
    ValueError: axis names other than "data", "model" and optionally
      "fsdp", or not one per size; a shape that does not fill num_devices
      (``resolve_mesh_shape``).
  """
  names, shape = tuple(axis_names), tuple(shape)
  if (
      len(names) != len(shape)
      or len(set(names)) != len(names)
      or "data" not in names
      or "model" not in names
      or not set(names) <= {"data", "fsdp", "model"}
  ):
    raise ValueError(
        f"mesh.axis_names={names} and mesh.shape={shape}: give one size per "
        "axis; axes are 'data', 'model' and optionally 'fsdp'."
    )
  return resolve_mesh_shape(shape, num_devices)


def make_mesh(shape: Sequence[int], axis_names: Sequence[str], devices=None) -> Mesh:
  """A Mesh of all devices (Auto axis types, so sharding constraints work).

  Args:
    shape: mesh shape, may hold one -1 (see ``resolve_mesh_shape``).
    axis_names: must include "data" and "model".
    devices: defaults to ``jax.devices()``.

  Raises:
    ValueError: bad shape or names (``check_mesh``).
  """
  devices = jax.devices() if devices is None else devices
  shape = check_mesh(shape, axis_names, len(devices))
  device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, tuple(axis_names), axis_types=(AxisType.Auto,) * len(shape))


def _divisible_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops from ``spec`` the mesh axes that the mesh lacks, or whose size
  does not divide their dimension."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = [
        a for a in ((axes,) if isinstance(axes, str) else tuple(axes or ())) if a in mesh.shape
    ]
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    out.append(None if not names or dim % size else (names[0] if len(names) == 1 else tuple(names)))
  return P(*out)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes that split batch rows: ``data`` and, if present, ``fsdp``."""
  return tuple(a for a in BATCH_AXES if a in mesh.shape)


def data_parallel_size(mesh: Mesh) -> int:
  """Number of batch shards (product of the ``batch_axes`` sizes)."""
  return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings for a tree of (possibly logically boxed) abstract arrays.

  Leaves annotated with ``nn.with_logical_partitioning`` are placed by
  ``rules``; other leaves are replicated.
  """
  logical_specs = nn.get_partition_spec(abstract_tree)
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  shapes = nn.unbox(abstract_tree)
  return jax.tree_util.tree_map(
      lambda spec, x: NamedSharding(mesh, _divisible_spec(spec, x.shape, mesh)),
      mesh_specs,
      shapes,
      is_leaf=lambda s: isinstance(s, P),
  )


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """[B, T] arrays: rows over ``data`` (x ``fsdp``)."""
  return NamedSharding(mesh, P(batch_axes(mesh), None))


def rows_sharding(mesh: Mesh) -> NamedSharding:
  """[B] arrays (e.g. the ``reset`` flags): rows over ``data`` (x ``fsdp``)."""
  return NamedSharding(mesh, P(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
  """Scalars and small state: a full copy on every device."""
  return NamedSharding(mesh, P())


def traced_with_mesh(fn: Callable, mesh: Mesh) -> Callable:
  """``fn`` traced with ``mesh`` as the context (abstract) mesh.

  For what XLA cannot partition by itself: the fused attention kernel
  (``pallas_attention.rel_attention``) reads the context mesh and runs as
  a ``shard_map`` over the batch and head axes.  Wrap a step function with
  this before ``jax.jit``; with no context mesh the kernel assumes one
  device.
  """

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return wrapped
