"""Exports every step of some configs with ``jax.export`` (test_lowering.py's worker).

Run as ``python tests/lowering_worker.py N JOB...`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``; a JOB is
``configs/NAME.py[:PRESET]@MESH@DTYPE@IMPL`` (MESH "preset" or "gpu8": one
host of 8 GPUs, the devices on ``fsdp`` as far as the batch divides, the
rest on ``model``).  Prints
one JSON line per (job, step, platform): ``{"job", "step", "platform", "ok",
"error"}``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def load(spec: str):
  path, _, preset = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("cfg", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


def run(job: str, n_devices: int) -> None:
  from jax import export  # noqa: PLC0415

  from transformer_xl import default_config, sharding
  from transformer_xl.training import lowering  # noqa: PLC0415

  spec, mesh_kind, dtype, impl = job.split("@")
  config = load(spec)
  if mesh_kind == "gpu8":  # fsdp over what the batch allows, the rest on "model"
    fsdp = math.gcd(config.train.global_batch, n_devices)
    config.mesh.axis_names = ("data", "fsdp", "model")
    config.mesh.shape = (1, fsdp, n_devices // fsdp)
    config.model.remat = "full"
  config.model.update(dtype=dtype, attention_impl=impl)
  shape = default_config.validate(config, n_devices)
  mesh = sharding.make_mesh(shape, config.mesh.axis_names)
  model_cfg = lowering.resolved_model_config(config, lowering.vocab_sizes()[config.data.dataset])
  for step in lowering.STEPS:
    for platform in ("tpu", "cuda"):  # one at a time: the kernel's branches are per platform
      row = {"job": job, "step": step, "platform": platform, "ok": True, "error": ""}
      try:
        fn, args = lowering.abstract_step(config, model_cfg, mesh, step)
        exported = export.export(
            fn,
            platforms=(platform,),
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
        assert exported.platforms == (platform,)
      except Exception as err:  # reported per step; the test fails with the job's name
        row.update(
            ok=False,
            error=f"{type(err).__name__}: {err}"[:3000],
            traceback=traceback.format_exc()[-3000:],
        )
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  n = int(sys.argv[1])
  for job_arg in sys.argv[2:]:
    run(job_arg, n)
