"""Device mesh and the logical-axis rules that place parameters and data.

Parameters carry logical axis names (set where they are created, e.g.
``("embed", None, "heads", "kv")`` for qkv_net); :data:`LOGICAL_AXIS_RULES`
maps them to mesh axes: heads, d_inner ("mlp") and the vocabulary on
``model``; the batch (and so the memory) on ``data`` (MaxText style).
A dimension that its mesh axis does not divide is replicated instead.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

LOGICAL_AXIS_RULES = (
    ("batch", "data"),
    ("heads", "model"),
    ("mlp", "model"),
    ("vocab", "model"),
    ("embed", None),
    ("kv", None),
    ("layers", None),
    ("length", None),
)


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
          f"divisible by {known}. Set --config.mesh.shape so its product is {num_devices}.")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if int(np.prod(shape)) != num_devices:
    raise ValueError(
        f"mesh.shape={shape} has {int(np.prod(shape))} devices but {num_devices} are "
        f"available. Set --config.mesh.shape so its product is {num_devices} "
        f"(e.g. '({num_devices}, 1)').")
  return shape


def make_mesh(shape: Sequence[int], axis_names: Sequence[str], devices=None) -> Mesh:
  """A Mesh of all devices (Auto axis types, so sharding constraints work).

  Args:
    shape: mesh shape, may hold one -1 (see :func:`resolve_mesh_shape`).
    axis_names: must include "data" and "model".
    devices: defaults to ``jax.devices()``.

  Raises:
    ValueError: bad shape or names.
  """
  if "data" not in axis_names or "model" not in axis_names:
    raise ValueError(f"mesh.axis_names={tuple(axis_names)} must include 'data' and 'model'.")
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(shape, len(devices))
  device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, tuple(axis_names), axis_types=(AxisType.Auto,) * len(shape))


def _divisible_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops mesh axes from ``spec`` for dimensions they do not divide."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
    out.append(axes if names and dim % size == 0 else None)
  return P(*out)


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
      mesh_specs, shapes, is_leaf=lambda s: isinstance(s, P))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """[B, T] arrays: rows over ``data``."""
  return NamedSharding(mesh, P("data", None))


def memory_sharding(mesh: Mesh) -> Any:
  """Shardings of a models.Memory: mems_LxBxMxD and mlen_B rows over ``data``."""
  from transformer_xl import models  # local import: models does not need sharding
  return models.Memory(mems_LxBxMxD=NamedSharding(mesh, P(None, "data", None, None)),
                       mlen_B=NamedSharding(mesh, P("data")))


def replicated(mesh: Mesh) -> NamedSharding:
  """Scalars and small state: a full copy on every device."""
  return NamedSharding(mesh, P())
