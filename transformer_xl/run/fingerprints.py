"""Fingerprints of arrays, computed on the devices: what a checkpoint's
integrity record holds (integrity.py).

A uint32 hash of each array's bits, mixed with each element's position and
summed, so that a changed element (one flipped bit included) or two
changed elements change it except with probability 2**-32; no array is
copied to the host, and a sharded array stays where it is.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 that mixes every bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _leaf_fingerprint(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(uint32 fingerprint, bool all-finite) of one array of any shape.

  Every element's bit pattern is mixed with its flat index and the results
  are summed modulo 2**32, so a changed element (one flipped bit included)
  changes the sum except with probability 2**-32, and so do two changed
  elements (unlike a plain sum or xor of the bits).  Element-wise work and
  one reduction: no reshape, so a sharded array stays where it is.
  """
  if x.dtype == jnp.bool_:
    bits = x.astype(jnp.uint32)
  elif x.dtype.itemsize == 8:
    pair = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    bits = pair[..., 0] ^ _fmix32(pair[..., 1] + jnp.uint32(0x27D4EB2F))
  else:
    utype = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, utype).astype(jnp.uint32)
  index = jnp.zeros(x.shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(x.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, dim) * jnp.uint32(stride % 2**32)
    stride *= x.shape[dim]
  mixed = _fmix32(bits ^ _fmix32(index + jnp.uint32(0x9E3779B9)))
  total = jnp.sum(mixed, dtype=jnp.uint32)
  finite = (
      jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.ones((), jnp.bool_)
  )
  return total, finite


@functools.cache
def _fingerprint_fn(out_sharding):
  def fn(leaves):
    pairs = [_leaf_fingerprint(x) for x in leaves]
    return (
        jnp.stack([p[0] for p in pairs]) if pairs else jnp.zeros((0,), jnp.uint32),
        jnp.stack([p[1] for p in pairs]) if pairs else jnp.zeros((0,), jnp.bool_),
    )

  return jax.jit(fn, out_shardings=out_sharding)


def fingerprint(tree: Any) -> tuple[dict[str, int], dict[str, bool]]:
  """Fingerprints and finiteness of every array of a pytree, computed on device.

  Args:
    tree: a pytree of jax.Arrays (global arrays of one mesh, or arrays on
      one device) or numpy arrays.

  Returns:
    ({leaf path: uint32 fingerprint as int}, {leaf path: all elements finite}),
    the paths as ``jax.tree_util.keystr`` writes them (e.g.
    ``.params['word_emb']['emb_layers_0']``).  The same on every process
    (the results are replicated).
  """
  paths_leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [jax.tree_util.keystr(p) for p, _ in paths_leaves]
  leaves = [x for _, x in paths_leaves]
  mesh = next(
      (x.sharding.mesh for x in leaves if isinstance(getattr(x, "sharding", None), NamedSharding)),
      None,
  )
  out = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None
  fps, finite = _fingerprint_fn(out)(leaves)
  fps, finite = np.asarray(fps), np.asarray(finite)
  return ({p: int(v) for p, v in zip(paths, fps)}, {p: bool(v) for p, v in zip(paths, finite)})
