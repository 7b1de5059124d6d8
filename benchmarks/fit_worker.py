"""The worker of ``fit.py``: compiles a config's train and eval steps, reads
XLA's per-device memory analysis, and, when a step does not fit, searches
the remat / attention-block settings for one that does
(``transformer_xl.compile.fit``).

A TPU device kind (v2 ... v6e) is compiled by the TPU compiler for its
slice when libtpu is installed, H100s (up to 8) by XLA:GPU when jax's CUDA
plugin is (``transformer_xl.compile.compiler``; no accelerator needed);
anything else, or a machine without them, on this
process's simulated CPU devices: ``fit.py --worker=JOB`` runs ``analyse``
in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``.  JAX is imported
inside the functions, so the parent process can import this module.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import common
from fit_config import GIB, Job, apply_overrides, load_config

if common.REPO not in sys.path:  # this checkout's transformer_xl
  sys.path.insert(0, common.REPO)

# The verdicts and the search live in the package (python -m transformer_xl.compile uses them).
from transformer_xl.compile.fit import (  # noqa: E402,F401
    BLOCK_SIZES,
    REMAT_ORDER,
    candidates,
    classify,
    memory_report,
    search_fit,
)
from transformer_xl.compile.fit import verdict as fit_verdict  # noqa: E402


def compile_slice(job: Job):
  """The slice of ``job`` when its real compiler is here: a TPU kind with
  libtpu, H100s with jax's CUDA plugin (``transformer_xl.compile``, no
  accelerator needed); else None (simulated CPU devices)."""
  from transformer_xl.compile import chips, compiler

  if job.device_kind not in chips.CHIPS:
    return None
  try:
    slice_ = chips.for_devices(job.device_kind, job.devices)
    compiler.check_compiler(slice_)
  except (chips.TopologyError, compiler.CompileError):
    return None
  return slice_


def analyse(job: Job, log=print) -> dict:
  """Compiles the job's train and eval steps (and, when one does not fit,
  the candidates of ``search_fit``) on this process's devices."""
  import jax

  config = load_config(job.spec)
  apply_overrides(config, job.overrides)
  from transformer_xl.compile import compiler

  slice_ = compile_slice(job)
  if slice_ is not None:  # the accelerator's own compiler, no accelerator needed
    devices = compiler.topology_devices(slice_)
    compiled_by = (
        f"the TPU compiler (libtpu), {slice_.topology}"
        if slice_.chip.platform == "tpu"
        else f"XLA:GPU (jax's CUDA plugin), {slice_.devices} x {slice_.chip.name}"
    )
  else:
    devices = jax.devices()
    compiled_by = f"XLA:CPU on {len(devices)} simulated devices"
  if len(devices) != job.devices:
    raise RuntimeError(
        f"expected {job.devices} devices, have {len(devices)} "
        "(XLA_FLAGS must be set before jax is imported)"
    )
  log(f"  compiled by {compiled_by}")
  comp = compiler.StepCompiler(config, job.vocab, devices)
  chunk = config.train.batch_chunk
  compile_step = lambda step, remat, block: comp.compile(
      step, compiler.Setting(remat, block, chunk)
  )
  capacity = job.device_memory_gib * GIB
  target = capacity * (1 - job.margin)
  out = {
      "job": dataclasses.asdict(job),
      "mesh": dict(comp.mesh.shape),
      "dtype": comp.model_cfg.dtype,
      "n_params": comp.n_params(),
      "compiled_by": compiled_by,
      "steps": {},
  }
  for step in ("train", "eval"):
    m = comp.model_cfg
    t0 = time.perf_counter()
    rep = compile_step(step, m.remat, m.attn_block)
    verdict = fit_verdict(rep, capacity, job.margin)
    log(
        f"  {job.spec} {step}: {rep['total_bytes'] / GIB:.2f} GiB of "
        f"{job.device_memory_gib:g} GiB per device, {verdict} "
        f"(compiled in {time.perf_counter() - t0:.0f} s)"
    )
    res = {"as_configured": rep, "verdict": verdict}
    if verdict != "FITS" and job.search:
      res["search"] = search_fit(
          lambda r, b, s=step: compile_step(s, r, b),
          step,
          m.remat,
          m.attn_block,
          rep["tgt_len"],
          target,
          job.max_tries,
          log,
      )
    out["steps"][step] = res
  return out
