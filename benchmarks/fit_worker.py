"""The worker of ``fit.py``: compiles a config's train and eval steps on this
process's (simulated CPU) devices, reads XLA's per-device memory analysis,
and, when a step does not fit, searches the remat / attention-block
settings for one that does.

``fit.py --worker=JOB`` runs ``analyse`` in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``.  JAX is imported
inside the functions, so the parent process can import this module.
"""

from __future__ import annotations

import dataclasses
import math
import time

from fit_config import GIB, Job, apply_overrides, load_config

# Candidate settings when a step does not fit, from the least recomputation up.
REMAT_ORDER = ("none", "dots", "save_proj", "save_qkv_proj", "full")
BLOCK_SIZES = (256, 128, 64, 32)  # queries per block; those < tgt_len, at most 3


def memory_report(compiled) -> dict:
  """Per-device bytes of a compiled step (``compiled.memory_analysis()``)
  and their total = arguments + outputs - aliased + temporaries + code.

  Raises:
    RuntimeError: the backend gives no memory analysis.
  """
  ma = compiled.memory_analysis()
  if ma is None:
    raise RuntimeError("this backend gives no memory analysis")
  rep = {
      "argument_bytes": ma.argument_size_in_bytes,
      "output_bytes": ma.output_size_in_bytes,
      "alias_bytes": ma.alias_size_in_bytes,
      "temp_bytes": ma.temp_size_in_bytes,
      "generated_code_bytes": ma.generated_code_size_in_bytes,
  }
  rep["total_bytes"] = (
      rep["argument_bytes"]
      + rep["output_bytes"]
      - rep["alias_bytes"]
      + rep["temp_bytes"]
      + rep["generated_code_bytes"]
  )
  return rep


class StepCompiler:
  """Compiles a config's train or eval step on the devices of this process
  for given (remat, attn_block), and returns its memory report."""

  def __init__(self, config, vocab: int):
    import jax

    from transformer_xl import sharding
    from transformer_xl.training import lowering

    self.config = config
    self.mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names, devices=jax.devices())
    # "per backend" settings (-1) as an accelerator's, not these CPUs'
    self.model_cfg = lowering.resolved_model_config(config, vocab)

  def n_params(self) -> int:
    """The model's parameter count (shapes only, nothing allocated)."""
    import jax
    import numpy as np

    from transformer_xl.model import models

    shapes = jax.eval_shape(
        lambda r: models.init_params(models.TransformerXL(self.model_cfg), r), jax.random.PRNGKey(0)
    )
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

  def compile(self, step: str, remat: str, attn_block: int) -> dict:
    """Lower + compile ``step`` ("train" or "eval") with model.remat and
    model.attn_block replaced; returns memory_report plus compile seconds."""
    from transformer_xl.training import lowering

    mcfg = dataclasses.replace(self.model_cfg, remat=remat, attn_block=attn_block)
    t0 = time.perf_counter()
    fn, args = lowering.abstract_step(self.config, mcfg, self.mesh, step)
    rep = memory_report(fn.lower(*args).compile())
    batch = args[-1]["inputs"].shape
    rep.update(
        remat=remat,
        attn_block=attn_block,
        batch=batch[0],
        tgt_len=batch[1],
        compile_seconds=round(time.perf_counter() - t0, 1),
    )
    return rep


def candidates(step: str, remat: str, attn_block: int, tgt_len: int) -> list[tuple[str, int]]:
  """(remat, attn_block) settings to try when ``step`` does not fit as
  configured, from the least recomputation up; the first is the most
  frugal one (remat "full", the smallest block), tried first to learn
  whether anything fits at all.  Empty when the configured setting is the
  most frugal one.  eval: block sizes only (no backward pass, remat changes
  nothing)."""
  blocks = [b for b in BLOCK_SIZES if b < tgt_len and b != attn_block][:3]
  block_options = [attn_block] + blocks
  remats = REMAT_ORDER if step == "train" else (remat,)
  ordered = [(r, b) for r in remats for b in block_options if (r, b) != (remat, attn_block)]
  if not ordered:
    return []
  frugal = (remats[-1], min(block_options, key=lambda b: b if b > 0 else math.inf))
  if frugal == (remat, attn_block):  # the configured setting is the most frugal already
    return []
  return [frugal] + [o for o in ordered if o != frugal]


def search_fit(
    try_setting,
    step: str,
    remat: str,
    attn_block: int,
    tgt_len: int,
    target: float,
    max_tries: int,
    log=print,
) -> dict:
  """Finds the first (remat, attn_block) of ``candidates`` whose total
  is at most ``target`` bytes.

  ``try_setting(remat, attn_block)`` returns a memory report (a dict with
  "total_bytes").  The most frugal candidate goes first: if it does not
  fit, nothing will and the search stops there; if it does, the others
  follow from the least recomputation up, and the first that fits is the
  answer (the frugal one if none of them fits, or if ``max_tries``
  compilations are used up first).

  Returns:
    {"fix": the report of the setting that makes it fit, or None;
     "cheapest": False when ``max_tries`` cut the search short (a setting
     with less recomputation may fit too); "tried": every report}.
  """
  tried = []
  cands = candidates(step, remat, attn_block, tgt_len)
  if not cands:
    return {"fix": None, "cheapest": True, "tried": tried}

  def attempt(r, b, note=""):
    rep = try_setting(r, b)
    tried.append(rep)
    log(f"    {step}: remat={r}, attn_block={b}{note}: {rep['total_bytes'] / GIB:.2f} GiB")
    return rep

  frugal = attempt(*cands[0], note=" (the most frugal)")
  if frugal["total_bytes"] > target:
    return {"fix": None, "cheapest": True, "tried": tried}
  for r, b in cands[1:]:
    if len(tried) >= max_tries:
      return {"fix": frugal, "cheapest": False, "tried": tried}
    rep = attempt(r, b)
    if rep["total_bytes"] <= target:
      return {"fix": rep, "cheapest": True, "tried": tried}
  return {"fix": frugal, "cheapest": True, "tried": tried}


def classify(total: float, capacity: float, margin: float) -> str:
  """FITS (total <= (1 - margin) x capacity), TIGHT (<= capacity) or DOES NOT FIT."""
  if total <= capacity * (1 - margin):
    return "FITS"
  return "TIGHT" if total <= capacity else "DOES NOT FIT"


def analyse(job: Job, log=print) -> dict:
  """Compiles the job's train and eval steps (and, when one does not fit,
  the candidates of ``search_fit``) on this process's devices."""
  import jax

  config = load_config(job.spec)
  apply_overrides(config, job.overrides)
  if jax.device_count() != job.devices:
    raise RuntimeError(
        f"expected {job.devices} devices, jax has {jax.device_count()} "
        "(XLA_FLAGS must be set before jax is imported)"
    )
  comp = StepCompiler(config, job.vocab)
  capacity = job.device_memory_gib * GIB
  target = capacity * (1 - job.margin)
  out = {
      "job": dataclasses.asdict(job),
      "mesh": dict(comp.mesh.shape),
      "dtype": comp.model_cfg.dtype,
      "n_params": comp.n_params(),
      "steps": {},
  }
  for step in ("train", "eval"):
    m = comp.model_cfg
    t0 = time.perf_counter()
    rep = comp.compile(step, m.remat, m.attn_block)
    verdict = classify(rep["total_bytes"], capacity, job.margin)
    log(
        f"  {job.spec} {step}: {rep['total_bytes'] / GIB:.2f} GiB of "
        f"{job.device_memory_gib:g} GiB per device, {verdict} "
        f"(compiled in {time.perf_counter() - t0:.0f} s)"
    )
    res = {"as_configured": rep, "verdict": verdict}
    if verdict != "FITS" and job.search:
      res["search"] = search_fit(
          lambda r, b, s=step: comp.compile(s, r, b),
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
