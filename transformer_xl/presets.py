"""Cloud TPU slice presets: mesh, dtype and rematerialisation for a slice.

Selected with a config argument, e.g.
``--config=configs/enwik8_24l.py:v3-32``.  The paper's large models were
trained on the slices the reference TPU scripts use: 2x16 cores for enwik8
and text8 (v3-32), 4x16 for WikiText-103 (v3-64), 32x16 for One Billion
Word (v3-512); v4 equivalents have half as many JAX devices (one per chip).

A preset puts every device on the ``fsdp`` axis (data parallel, with the
parameters and Adam moments sharded over the same devices), computes in
bfloat16 with float32 parameters, and rematerialises each layer so the 24
layers of activations of the large models fit in HBM.
"""
from __future__ import annotations

import ml_collections

# Slice name -> number of JAX devices (TensorCores on v2/v3, chips on v4/v5p).
SLICE_DEVICES = {
    "v3-8": 8, "v3-32": 32, "v3-64": 64, "v3-128": 128, "v3-256": 256, "v3-512": 512,
    "v4-8": 4, "v4-32": 16, "v4-64": 32, "v4-128": 64, "v4-256": 128, "v4-512": 256,
    "v5p-8": 4, "v5p-32": 16, "v5p-64": 32, "v5p-128": 64,
}


def apply_slice(config: ml_collections.ConfigDict, preset: str | None) -> ml_collections.ConfigDict:
  """Configures ``config`` for the TPU slice ``preset`` (None or "" = unchanged).

  Sets mesh ("data", "fsdp", "model") = (1, devices, 1), model.dtype
  bfloat16 and model.remat "full".  The eval batch stays the config's
  (the evaluator pads it to the device count with empty rows).

  Raises:
    ValueError: unknown preset, or a global batch the slice does not divide
      (the message gives the per-device batch options).
  """
  if not preset:
    return config
  if preset not in SLICE_DEVICES:
    raise ValueError(f"Unknown TPU slice preset {preset!r}; choose one of "
                     f"{sorted(SLICE_DEVICES)} (e.g. --config=configs/enwik8_24l.py:v3-32).")
  n = SLICE_DEVICES[preset]
  if config.train.global_batch % n:
    raise ValueError(f"train.global_batch={config.train.global_batch} cannot be split over the "
                     f"{n} devices of a {preset}; pick a slice whose device count divides it.")
  config.mesh.axis_names = ("data", "fsdp", "model")
  config.mesh.shape = (1, n, 1)
  config.model.dtype = "bfloat16"
  config.model.remat = "full"
  return config


def per_device_batch(config: ml_collections.ConfigDict, n_devices: int) -> int:
  """Training rows per device: global_batch / data-parallel devices."""
  return config.train.global_batch // n_devices
