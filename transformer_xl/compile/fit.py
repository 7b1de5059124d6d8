"""Does a compiled step fit its device, and if not, which setting does.

The memory of a compiled step per device (``compiled.memory_analysis()``),
its verdict against a device's memory, and the search over the remat
policies and attention block sizes for the first setting that fits; with
the roofline ceiling of a step's time.  Used by ``python -m
transformer_xl.compile`` (the TPU compiler) and ``benchmarks/fit.py``
(the TPU compiler, or simulated CPU devices without libtpu).
"""

from __future__ import annotations

import math

GIB = 2**30  # bytes

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
  "total_bytes"; one with "refused", a program the compiler refused as too
  large, never fits).  The most frugal candidate goes first: if it does not
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
  if not fits(frugal, target):
    return {"fix": None, "cheapest": True, "tried": tried}
  for r, b in cands[1:]:
    if len(tried) >= max_tries:
      return {"fix": frugal, "cheapest": False, "tried": tried}
    rep = attempt(r, b)
    if fits(rep, target):
      return {"fix": rep, "cheapest": True, "tried": tried}
  return {"fix": frugal, "cheapest": True, "tried": tried}


def classify(total: float, capacity: float, margin: float) -> str:
  """FITS (total <= (1 - margin) x capacity), TIGHT (<= capacity) or DOES NOT FIT."""
  if total <= capacity * (1 - margin):
    return "FITS"
  return "TIGHT" if total <= capacity else "DOES NOT FIT"


def fits(rep: dict, target: float) -> bool:
  """A memory report's total is at most ``target`` bytes; one the compiler
  refused as too large (its total only a lower bound) never fits."""
  return rep["total_bytes"] <= target and "refused" not in rep


def verdict(rep: dict, capacity: float, margin: float) -> str:
  """``classify`` of a memory report; DOES NOT FIT for one the compiler refused."""
  return "DOES NOT FIT" if "refused" in rep else classify(rep["total_bytes"], capacity, margin)


def roofline(flops: float, bytes_accessed: float, peak_flops: float, bandwidth: float) -> dict:
  """The step-time bound of one device and the MFU it allows.

  A lower bound on the step's time, not a measurement: the time of the
  step's FLOPs at the chip's peak or of its bytes at the HBM bandwidth,
  whichever is longer (the roofline model, Williams et al. 2009), ignoring
  collectives, latency and everything the compiler cannot overlap.

  Args:
    flops: FLOPs of one step on one device.
    bytes_accessed: bytes read and written by that step on that device.
    peak_flops: the device's peak FLOP/s (bf16).
    bandwidth: the device's HBM bytes/s.

  Returns:
    {"compute_seconds", "memory_seconds", "bound_seconds", "bound": "compute"
    or "memory", "max_mfu": flops / (bound_seconds x peak_flops), at most 1}.
  """
  compute, memory = flops / peak_flops, bytes_accessed / bandwidth
  bound = max(compute, memory)
  return {
      "compute_seconds": compute,
      "memory_seconds": memory,
      "bound_seconds": bound,
      "bound": "compute" if compute >= memory else "memory",
      "max_mfu": (compute / bound) if bound > 0 else 0.0,
  }
