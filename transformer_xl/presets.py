"""Cloud TPU slice presets: mesh, dtype and rematerialisation for a slice.

Selected with a config argument, e.g.
``--config=configs/enwik8_24l.py:v3-32``.  The paper's large models were
trained on the slices the reference TPU scripts use: 2x16 cores for enwik8
and text8 (v3-32), 4x16 for WikiText-103 (v3-64), 32x16 for One Billion
Word (v3-512); v4 equivalents have half as many JAX devices (one per chip).

A preset puts every device on the ``fsdp`` axis (data parallel, with the
parameters and Adam moments sharded over the same devices; when the device
count does not divide d_model, all but a small ``model`` axis), computes in
bfloat16 with float32 parameters, and rematerialises each layer so the 24
layers of activations of the large models fit in HBM.
"""

from __future__ import annotations

import ml_collections

# Slice name -> number of JAX devices (TensorCores on v2/v3, chips on v4/v5p).
SLICE_DEVICES = {
    "v3-8": 8,
    "v3-32": 32,
    "v3-64": 64,
    "v3-128": 128,
    "v3-256": 256,
    "v3-512": 512,
    "v4-8": 4,
    "v4-32": 16,
    "v4-64": 32,
    "v4-128": 64,
    "v4-256": 128,
    "v4-512": 256,
    "v5p-8": 4,
    "v5p-32": 16,
    "v5p-64": 32,
    "v5p-128": 64,
}


def apply_slice(config: ml_collections.ConfigDict, preset: str | None) -> ml_collections.ConfigDict:
  """Configures ``config`` for the TPU slice ``preset`` (None or "" = unchanged).

  Sets mesh ("data", "fsdp", "model") = (1, devices / m, m), model.dtype
  bfloat16 and model.remat "full" (``shard_over``).  m is 1 when the device
  count divides d_model and the global batch (so the ``fsdp`` axis shards
  every parameter's d_model dimension and every row has one device);
  otherwise the smallest m that divides both the device count and n_head
  and leaves an ``fsdp`` size that divides d_model and the batch
  (lm1b_large on a v3-512: d_model 1280, 512 devices -> (1, 256, 2)), since
  a mesh axis that does not divide a dimension leaves it replicated.  The eval batch stays the
  config's (the evaluator pads it to the device count with empty rows).

  Raises:
    ValueError: unknown preset, or a global batch the data-parallel devices
      do not divide, or no such m.
  """
  if not preset:
    return config
  if preset not in SLICE_DEVICES:
    raise ValueError(
        f"Unknown TPU slice preset {preset!r}; choose one of "
        f"{sorted(SLICE_DEVICES)} (e.g. --config=configs/enwik8_24l.py:v3-32)."
    )
  return shard_over(config, SLICE_DEVICES[preset], f"a {preset}")


def shard_over(
    config: ml_collections.ConfigDict, n: int, where: str = ""
) -> ml_collections.ConfigDict:
  """Configures ``config`` for ``n`` TPU devices as a slice preset does.

  Sets mesh ("data", "fsdp", "model") = (1, n / m, m), model.dtype
  bfloat16 and model.remat "full", with the smallest m that divides n and
  n_head and leaves an ``fsdp`` size that divides both d_model and
  train.global_batch (``apply_slice``; ``python -m transformer_xl.compile
  --topology=...`` uses it for a topology that is not the config's preset).

  Raises:
    ValueError: no such m (the message names ``where``, e.g. "a v4-128").
  """
  where = where or f"{n} devices"
  d_model, n_head = config.model.d_model, config.model.n_head
  batch = config.train.global_batch
  # model axes m that split the heads and leave an fsdp axis dividing d_model, smallest first
  axes = [m for m in range(1, n + 1) if n % m == 0 and n_head % m == 0 and d_model % (n // m) == 0]
  if not axes:
    raise ValueError(
        f"no mesh of the {n} devices of {where} shards d_model={d_model} "
        f"with n_head={n_head}; set --config.mesh.shape yourself."
    )
  with_batch = next((m for m in axes if batch % (n // m) == 0), None)
  if with_batch is None:
    n_data = n // axes[0]
    raise ValueError(
        f"train.global_batch={batch} cannot be split over the "
        f"{n_data} data-parallel devices of {where}; pick a slice whose device "
        f"count divides it, or --config.train.global_batch={-(-batch // n_data) * n_data}."
    )
  n_fsdp = n // with_batch
  config.mesh.axis_names = ("data", "fsdp", "model")
  config.mesh.shape = (1, n_fsdp, with_batch)
  config.model.dtype = "bfloat16"
  config.model.remat = "full"
  return config


def per_device_batch(config: ml_collections.ConfigDict, n_devices: int) -> int:
  """Training rows per data-parallel device: global_batch / (n_devices / the
  size of the ``model`` axis, which splits heads rather than rows)."""
  shape = dict(zip(config.mesh.axis_names, config.mesh.shape))
  return config.train.global_batch * shape.get("model", 1) // n_devices
