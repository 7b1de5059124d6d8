"""The compile command's work: devices, checks, compilation, table and JSON.

``run`` resolves the slice (``--topology`` or the config's preset),
checks the config for its device count (``default_config.validate``) and
the compiler's install before anything is compiled, compiles the steps
(``compiler.analyse``) and prints one block per step (``format_step``)
and writes the JSON that ``scripts/tpu_compile_table.py`` makes the
table of every config from.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import sys
from typing import Any

from transformer_xl import errors
from transformer_xl.compile import chips as chips_lib
from transformer_xl.compile import compiler, fit, flops

GENERATE = ("generate_segment", "generate_token", "generate_chunk")
STATUS_DOES_NOT_FIT = 3


def _steps(names: list[str]) -> tuple[str, ...]:
  from transformer_xl.training import lowering  # noqa: PLC0415

  out: list[str] = []
  for name in names:
    expanded = GENERATE if name == "generate" else (name,)
    for step in expanded:
      if step not in lowering.STEPS:
        raise compiler.CompileError(
            f"--steps: unknown step {name!r}; use train, eval, generate or one of {lowering.STEPS}"
        )
      if step not in out:
        out.append(step)
  return tuple(out)


def resolve_slice(
    config: Any, spec: str, topology: str | None, overridden: tuple[str, ...] = ()
) -> chips_lib.Slice:
  """The slice to compile for: ``--topology``, else the config's preset.

  With a topology other than the preset, the mesh is the preset rule's for
  its device count (``presets.shard_over``); a config without a preset
  keeps its own mesh when its product is the device count, else gets the
  preset rule too.  ``model.dtype`` and ``model.remat`` given on the
  command line (``overridden``: the --config.* keys) stay as given.

  Raises:
    CompileError: no topology and no preset, or an unknown one.
  """
  from transformer_xl import presets  # noqa: PLC0415

  preset = spec.partition(":")[2].split(",")[-1]
  preset = preset if preset in presets.SLICE_DEVICES else ""
  try:
    slice_ = chips_lib.parse(topology or preset) if (topology or preset) else None
  except chips_lib.TopologyError as err:
    raise compiler.CompileError(str(err)) from None
  if slice_ is None:
    raise compiler.CompileError(
        f"--config={spec} names no slice preset: give --topology (e.g. --topology=v5e-16) or a "
        f"preset, e.g. --config={spec.partition(':')[0]}:v4-32"
    )
  n_mesh = 1
  for s in config.mesh.shape:
    n_mesh *= max(int(s), 1)
  if topology and (preset or (-1 not in tuple(config.mesh.shape) and n_mesh != slice_.devices)):
    kept = {k: config.model[k] for k in ("dtype", "remat") if f"model.{k}" in overridden}
    try:
      presets.shard_over(config, slice_.devices, f"{slice_.name} ({slice_.topology})")
    except ValueError as err:
      raise compiler.CompileError(str(err)) from None
    config.model.update(kept)  # the command line's own dtype and remat win
  return slice_


def _vocab(config: Any, vocab: int | None) -> int:
  from transformer_xl.training import lowering  # noqa: PLC0415

  sizes = lowering.vocab_sizes()
  if vocab is not None:
    if vocab < 2:
      raise compiler.CompileError(f"--vocab={vocab} must be >= 2")
    return vocab
  if config.data.dataset in sizes:
    return sizes[config.data.dataset]
  from transformer_xl.data import synthetic  # noqa: PLC0415

  if synthetic.is_synthetic(config.data.dataset):  # the task's own vocabulary
    return synthetic.TaskSettings.from_data_config(config.data).n_token
  if config.data.get("tokenizer") == "sentencepiece" and config.data.get("vocab_size", 0) > 0:
    return int(config.data.vocab_size)  # the pieces SentencePiece is asked to learn
  raise compiler.CompileError(
      f"no fixed vocabulary size is known for data.dataset={config.data.dataset!r} with "
      f"data.tokenizer={config.data.get('tokenizer')!r}: pass --vocab=N (e.g. GPT-2's "
      "tokenizer: 50257)"
  )


def gib_text(x: float) -> str:
  """Bytes as GiB: 2 decimals, 3 significant digits below 0.1 GiB."""
  g = x / fit.GIB
  return f"{g:.2f}" if g >= 0.1 or g == 0 else f"{g:.3g}"


def _si(x: float, unit: str) -> str:
  for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(x) >= factor:
      return f"{x / factor:.3g} {prefix}{unit}"
  return f"{x:.3g} {unit}"


def setting_flags(rep: dict, configured: dict) -> str:
  """The --config.* flags that turn the configured setting into rep's."""
  parts = []
  if rep["remat"] != configured["remat"]:
    parts.append(f"--config.model.remat={rep['remat']}")
  if rep["attn_block"] != configured["attn_block"]:
    parts.append(f"--config.model.attn_block={rep['attn_block']}")
  if rep.get("batch_chunk", 1) != configured.get("batch_chunk", 1):
    parts.append(f"--config.train.batch_chunk={rep['batch_chunk']}")
  return " ".join(parts)


def fix_text(step_result: dict, margin: float) -> str:
  """What makes a step fit, in words (empty when it fits)."""
  if step_result["verdict"] == "FITS":
    return ""
  search = step_result.get("search")
  if search is None:
    return "not searched"
  if search["fix"] is None:
    return (
        f"no remat / attn_block / batch_chunk setting gets below {100 * (1 - margin):g}% of HBM: "
        "more devices (a larger slice), or fewer rows per device"
    )
  fix = search["fix"]
  return f"{setting_flags(fix, step_result['as_configured'])} ({gib_text(fix['total_bytes'])} GiB)"


def model_flops(config: Any, model_cfg: Any, step: str, rows: int, tgt_len: int) -> float:
  """Model FLOPs of one step on one device (``flops.step_flops_per_token``)."""
  from transformer_xl.inference import eval_steps  # noqa: PLC0415

  if step == "train":
    cfg, train = model_cfg, True
  else:
    cfg, train = eval_steps.eval_model_config(config, model_cfg), False
  cfg = dataclasses.replace(cfg, tgt_len=tgt_len)
  return flops.step_flops_per_token(cfg, rows, train) * rows * tgt_len


def format_step(step: str, res: dict, chip: chips_lib.Chip, margin: float) -> str:
  """The printed block of one step."""
  rep, counts, ceil = res["as_configured"], res["as_configured"].get("counts"), res["roofline"]
  lines = [
      f"{step}: {rep['batch']} rows (all devices) x {rep['tgt_len']} tokens per step "
      f"(remat={rep['remat']}, attn_block={rep['attn_block']}, batch_chunk={rep['batch_chunk']}), "
      f"compiled in {rep['compile_seconds']:.0f} s",
      f"  memory per device: arguments {gib_text(rep['argument_bytes'])} + outputs "
      f"{gib_text(rep['output_bytes'])} - aliased {gib_text(rep['alias_bytes'])} + temporaries "
      f"{gib_text(rep['temp_bytes'])} + code {gib_text(rep['generated_code_bytes'])} = "
      f"{gib_text(rep['total_bytes'])} GiB of {chip.hbm_gib:g} GiB: {res['verdict']}",
  ]
  fix = fix_text(res, margin)
  if "refused" in rep:
    lines.append(
        "  the TPU compiler refused it: "
        + rep["refused"].split("RESOURCE_EXHAUSTED: ")[-1][:300]
        + " (the total above is its temporaries plus the arguments' shards: a lower bound)"
    )
  if fix:
    lines.append(f"  what makes it fit: {fix}")
  if counts is None:
    return "\n".join(lines)
  lines.append(
      f"  per device per step: {_si(counts['matmul_flops'], 'FLOP')} (matrix products), "
      f"{_si(counts['bytes_accessed'], 'B')} accessed"
  )
  coll = [
      f"{op} {int(c['count'])} ({_si(c['bytes'], 'B')})"
      for op, c in counts["collectives"].items()
      if c["count"]
  ]
  lines.append(f"  collectives per step: {', '.join(coll) if coll else 'none'}")
  mfu = res.get("max_mfu")
  lines.append(
      f"  roofline ceiling: >= {ceil['bound_seconds'] * 1e3:.3g} ms per step "
      f"({ceil['bound']}-bound; compute {ceil['compute_seconds'] * 1e3:.3g} ms, memory "
      f"{ceil['memory_seconds'] * 1e3:.3g} ms)"
      + (f", MFU <= {100 * mfu:.0f}%" if mfu is not None else "")
  )
  return "\n".join(lines)


def run(
    config: Any,
    spec: str,
    topology: str | None,
    num_slices: int,
    step_names: list[str],
    vocab: int | None,
    margin: float,
    do_search: bool,
    max_tries: int,
    json_path: str | None,
    debug: bool,
) -> int:
  """The compile command (``python -m transformer_xl.compile``); returns
  the exit status (0 fits, 3 does not fit); bad input exits 1 with one
  ``error:`` line."""
  from transformer_xl import default_config  # noqa: PLC0415

  try:
    if not 0 <= margin < 1:
      raise compiler.CompileError(f"--margin={100 * margin:g} must be in [0, 100) percent")
    if num_slices < 1:
      raise compiler.CompileError(f"--num_slices={num_slices} must be >= 1")
    if max_tries < 1:
      raise compiler.CompileError(f"--max_tries={max_tries} must be >= 1")
    steps = _steps(step_names)
    overridden = tuple(
        a[len("--config.") :].split("=")[0] for a in sys.argv[1:] if a.startswith("--config.")
    )
    with config.unlocked():
      slice_ = resolve_slice(config, spec, topology, overridden)
    n = slice_.devices * num_slices
    default_config.validate(config, n, device_kind=f"TPU {slice_.chip.name}")
    n_vocab = _vocab(config, vocab)
    compiler.check_compiler(slice_)
    devices = compiler.topology_devices(slice_, num_slices)
  except errors.UserError as err:
    if debug:
      raise
    sys.exit(f"error: {' '.join(str(err).split())}")
  except ValueError as err:  # a mesh the devices cannot fill (sharding.check_mesh)
    if debug:
      raise
    sys.exit(f"error: {' '.join(str(err).split())}")

  chip = slice_.chip
  where = f"{slice_.name} ({slice_.topology}{f' x {num_slices} slices' if num_slices > 1 else ''})"
  print(
      f"compiling {spec} for {where}: {n} devices of {chip.name} ({chip.hbm_gib:g} GiB HBM, "
      f"{chip.peak_flops / 1e12:g} TFLOP/s bf16, {chip.hbm_bytes_per_s / 1e9:g} GB/s per device), "
      f"nothing executed; "
      f"mesh {tuple(config.mesh.shape)} {tuple(config.mesh.axis_names)}",
      flush=True,
  )
  try:
    result = compiler.analyse(
        config, n_vocab, devices, chip, steps, margin, do_search, max_tries,
        log=lambda s: print(s, flush=True),
    )  # fmt: skip
  except errors.UserError as err:  # the compiler refused a step (not for its size)
    if debug:
      raise
    sys.exit(f"error: {' '.join(str(err).split())}")
  from transformer_xl.training import lowering  # noqa: PLC0415

  model_cfg = lowering.resolved_model_config(config, n_vocab)
  n_data = result["mesh"].get("data", 1) * result["mesh"].get("fsdp", 1)
  for step, res in result["steps"].items():
    rep = res["as_configured"]
    if step in ("train", "eval") and res["roofline"]:
      rows = max(rep["batch"] // n_data, 1)  # per device
      mf = model_flops(config, model_cfg, step, rows, rep["tgt_len"])
      res["model_flops"] = mf
      res["max_mfu"] = min(1.0, mf / (res["roofline"]["bound_seconds"] * chip.peak_flops))
    print()
    print(format_step(step, res, chip, margin))
  print()
  by = "the TPU compiler (libtpu)" if chip.platform == "tpu" else "XLA:GPU (jax's CUDA plugin)"
  print(
      f"Memory: XLA's compile-time buffer assignment of {by}, per device; "
      "FLOPs, bytes and collectives: counted in the compiled program, loops as often as they run. "
      "The roofline is a ceiling from the chip's published peaks, not a measurement."
  )
  out = {
      "config": spec,
      "overrides": [a for a in sys.argv[1:] if a.startswith("--config.")],
      "topology": slice_.topology,
      "slice": slice_.name,
      "num_slices": num_slices,
      "devices": n,
      "margin": margin,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {"host": platform.node(), "cpu": _cpu_name(), "cpu_count": os.cpu_count()},
      "versions": _versions(),
      **result,
  }
  path = json_path or _default_json(spec, slice_)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  print(f"wrote {path}")
  fits = all(r["verdict"] != "DOES NOT FIT" for r in result["steps"].values())
  return 0 if fits else STATUS_DOES_NOT_FIT


def _default_json(spec: str, slice_: chips_lib.Slice) -> str:
  name = re.sub(r"\W+", "_", os.path.basename(spec.partition(":")[0]).removesuffix(".py"))
  return f"compile_{name}_{re.sub(r'[^0-9a-zA-Z]+', '-', slice_.topology)}.json"


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _versions() -> dict:
  import importlib.metadata as md  # noqa: PLC0415

  out = {}
  for pkg in ("jax", "jaxlib", "libtpu", "flax"):
    try:
      out[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
      out[pkg] = None
  return out
