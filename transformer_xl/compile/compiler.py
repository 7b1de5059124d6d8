"""A config's steps compiled by the TPU compiler on a machine without a TPU.

``libtpu`` (the ``[tpu-compile]`` extra) has a compile-only client:
``jax.experimental.topologies.get_topology_desc`` gives the devices of a
named TPU topology with no hardware, and ``jax.jit(step).lower(*abstract
arguments).compile()`` on a mesh of them runs the real TPU compiler
(XLA:TPU and Mosaic for Pallas kernels) with nothing executed (MaxText's
``train_compile.py`` does the same).  ``analyse`` compiles a config's
steps (``training.lowering.abstract_step``: the train step, the eval step,
the generation steps, with the config's mesh and shardings) and reads
what the compiled program says about one device: its memory, its matrix
FLOPs, bytes and collectives per step (``hlo.count``), and the roofline
ceiling of its speed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import time
from collections.abc import Callable
from typing import Any

from transformer_xl import errors
from transformer_xl.compile import chips as chips_lib
from transformer_xl.compile import fit, hlo

EXTRA = "pip install 'transformer_xl[tpu-compile]'"
GPU_EXTRA = "pip install 'transformer_xl[gpu-compile]'"


class CompileError(errors.UserError):
  """Bad input to the compile command (one ``error:`` line)."""


def libtpu_path() -> str:
  """The libtpu shared library: $TPU_LIBRARY_PATH, else the ``libtpu``
  package's ``libtpu.so``.

  Raises:
    CompileError: neither exists (names the extra that installs it).
  """
  path = os.environ.get("TPU_LIBRARY_PATH")
  if path:
    if not os.path.isfile(path):
      raise CompileError(f"TPU_LIBRARY_PATH={path} is not a file; unset it or {EXTRA}")
    return path
  spec = importlib.util.find_spec("libtpu")
  if spec is None or not spec.submodule_search_locations:
    raise CompileError(
        f"the TPU compiler (libtpu) is not installed: {EXTRA} (a CPU machine is enough)"
    )
  path = os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
  if not os.path.isfile(path):
    raise CompileError(f"the libtpu package has no libtpu.so at {path}: reinstall it, {EXTRA}")
  return path


def check_compiler(slice_: chips_lib.Slice) -> None:
  """Raises CompileError (naming the extra) if the compiler for ``slice_``
  is not installed: libtpu for a TPU, jax's CUDA 12 plugin for a GPU."""
  if slice_.chip.platform == "tpu":
    libtpu_path()
  elif importlib.util.find_spec("jax_cuda12_plugin") is None:
    raise CompileError(
        f"compiling for {slice_.name} needs jax's CUDA plugin: {GPU_EXTRA} (no GPU needed)"
    )


def gpu_devices(slice_: chips_lib.Slice) -> list:
  """The compile-only devices of ``slice_`` (H100s) from jax's CUDA plugin.

  Raises:
    CompileError: the plugin is missing or refuses the topology.
  """
  check_compiler(slice_)
  from jax.experimental import topologies  # noqa: PLC0415

  try:
    topo = topologies.get_topology_desc(
        platform="cuda", topology=slice_.topology, target_config=chips_lib.h100_target_config()
    )
  except Exception as err:  # noqa: BLE001 (the plugin's own message)
    raise CompileError(
        f"jax's CUDA plugin does not build {slice_.name} ({slice_.topology}): {err}"
    ) from None
  return list(topo.devices)


def topology_devices(slice_: chips_lib.Slice, num_slices: int = 1) -> list:
  """The JAX devices of ``num_slices`` slices of ``slice_``, compile only
  (GPUs: ``gpu_devices``, one slice).

  Raises:
    CompileError: libtpu is missing, or it refuses the topology.
  """
  if slice_.chip.platform == "cuda":
    if num_slices != 1:
      raise CompileError("--num_slices applies to TPU slices; give H100 hosts as h100:HOSTSx8")
    return gpu_devices(slice_)
  os.environ.setdefault("TPU_LIBRARY_PATH", libtpu_path())
  # Compile only: no TPU to lock (libtpu otherwise holds /tmp/libtpu_lockfile, one process at a
  # time) and no metadata server to ask for one.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  from jax.experimental import topologies  # noqa: PLC0415 (after TPU_LIBRARY_PATH)

  kwargs: dict[str, Any] = {}
  if slice_.chip.megacore:
    kwargs.update(chip_config_name="megacore")
  if num_slices > 1 or slice_.chip.megacore:
    # As Cloud TPU hosts them (MaxText's accelerator_to_spec_map): 2x2x1 chips per host;
    # a 3-D torus wraps from 4 chips a side, a 2-D one (v5e, v6e) only as a full 16x16 pod.
    sides = [int(s) for s in slice_.topology.split(":")[1].split("x")]
    wrap_from = 4 if len(sides) == 3 else 16
    kwargs.update(chips_per_host_bounds=(min(sides[0], 2), min(sides[1], 2), 1))
    kwargs.update(num_slices=num_slices, wrap=tuple(s >= wrap_from for s in (sides + [1])[:3]))
  try:
    topo = topologies.get_topology_desc(topology_name=slice_.topology, platform="tpu", **kwargs)
  except Exception as err:  # noqa: BLE001 (libtpu's own message)
    raise CompileError(
        f"libtpu does not build the topology {slice_.topology} ({slice_.name}): {err}"
    ) from None
  devices = list(topo.devices)
  if len(devices) != slice_.devices * num_slices:
    raise CompileError(
        f"libtpu gave {len(devices)} devices for {slice_.topology} x {num_slices}, expected "
        f"{slice_.devices * num_slices}"
    )
  return devices


@dataclasses.dataclass
class Setting:
  """How a step is compiled: remat policy, attention block, micro-batches."""

  remat: str
  attn_block: int
  batch_chunk: int = 1


class StepCompiler:
  """Compiles a config's steps on given devices with a ``Setting``."""

  def __init__(self, config: Any, vocab: int, devices: list):
    from transformer_xl import sharding  # noqa: PLC0415 (jax after the topology's env)
    from transformer_xl.training import lowering  # noqa: PLC0415

    self.config = config
    self.mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names, devices=devices)
    # "per backend" settings (-1) as an accelerator's, not this CPU's
    self.model_cfg = lowering.resolved_model_config(config, vocab)

  def n_params(self) -> int:
    """The model's parameter count (shapes only)."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from transformer_xl.model import models  # noqa: PLC0415

    shapes = jax.eval_shape(
        lambda r: models.init_params(models.TransformerXL(self.model_cfg), r), jax.random.PRNGKey(0)
    )
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

  def compile(self, step: str, setting: Setting, counts: bool = False) -> dict:
    """Lower + compile ``step`` (one of ``lowering.STEPS``) with ``setting``;
    returns ``fit.memory_report`` plus the setting, the batch, the compile
    seconds and, with ``counts``, XLA's cost analysis and ``hlo.count``."""
    import jax  # noqa: PLC0415

    from transformer_xl.training import lowering  # noqa: PLC0415

    mcfg = dataclasses.replace(self.model_cfg, remat=setting.remat, attn_block=setting.attn_block)
    chunk = self.config.train.batch_chunk
    self.config.train.batch_chunk = setting.batch_chunk  # what abstract_step reads; restored below
    try:
      t0 = time.perf_counter()
      fn, args = lowering.abstract_step(self.config, mcfg, self.mesh, step)
      try:
        compiled = fn.lower(*args).compile()
      except jax.errors.JaxRuntimeError as err:
        vmem = vmem_overflow(str(err))
        if vmem:  # a Pallas kernel's blocks do not fit the core's VMEM: a limit of the kernel
          raise CompileError(
              f"the {step} step's fused attention kernel (model.attention_impl='pallas') needs "
              f"{vmem[0]} of VMEM, the chip has {vmem[1]} (it holds the K = mem_len + tgt_len "
              "keys, values and position rows of a head whole): use "
              "--config.model.attention_impl=xla, or a shorter mem_len for this step"
          ) from err
        if "RESOURCE_EXHAUSTED" not in str(err):
          raise CompileError(
              f"the compiler could not compile the {step} step (remat={setting.remat}, "
              f"attn_block={setting.attn_block}, batch_chunk={setting.batch_chunk}): "
              + " ".join(str(err).split())[:600]
              + " (--debug shows the traceback)"
          ) from err
        compiled, refusal = None, str(err)
      except Exception as err:  # Mosaic (Pallas TPU kernels) raises its own errors
        if "Mosaic failed to compile" not in str(err):
          raise
        raise CompileError(
            f"Mosaic could not compile the {step} step's Pallas kernel: "
            + " ".join(str(err).split())[:400]
            + " (use --config.model.attention_impl=xla; --debug shows the traceback)"
        ) from err
      seconds = time.perf_counter() - t0
    finally:
      self.config.train.batch_chunk = chunk
    if compiled is None:  # the TPU compiler refuses a program larger than HBM
      rep = refused_report(refusal, argument_bytes(args))
    else:
      rep = fit.memory_report(compiled)
    batch = args[-1]["inputs"].shape if isinstance(args[-1], dict) else args[2].shape
    rep.update(
        dataclasses.asdict(setting),
        batch=batch[0],
        tgt_len=batch[-1] if len(batch) > 1 else 1,
        compile_seconds=round(seconds, 1),
    )
    if counts and compiled is not None:
      cost = compiled.cost_analysis() or {}
      rep["xla_cost_analysis"] = {
          k: float(cost[k]) for k in ("flops", "bytes accessed", "transcendentals") if k in cost
      }
      rep["counts"] = hlo.count(compiled.as_text()).as_dict()
    return rep


_SIZE = r"([0-9.]+)([KMGT]?)i?B?"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(number: str, unit: str) -> int:
  return int(float(number) * _UNITS[unit])


def argument_bytes(args: tuple) -> int:
  """Bytes of one device's shards of a step's abstract arguments."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  total = 0
  for leaf in jax.tree_util.tree_leaves(args):
    if isinstance(leaf, jax.ShapeDtypeStruct):
      shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
      total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
  return total


def vmem_overflow(message: str) -> tuple[str, str] | None:
  """(needed, available) when the compiler's message says a kernel's VMEM
  (the TPU core's scratchpad, 16 to 128 MiB) overflowed, else None.  Two
  forms: "Used 19.05M of 16.00M vmem" and "Allocation (size=25165824) would
  exceed memory (size=16777216) :: ... space=vmem"."""
  one_line = " ".join(message.split())
  if not re.search(r"memory space vmem|space=vmem", one_line):
    return None
  used = re.search(r"Used ([0-9.]+)([KMG]?) of ([0-9.]+)([KMG]?) vmem", one_line)
  if used:
    return f"{used.group(1)} {used.group(2)}iB", f"{used.group(3)} {used.group(4)}iB"
  alloc = re.search(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)", one_line)
  if alloc:
    return tuple(f"{int(x) / 2**20:.2f} MiB" for x in alloc.groups())  # type: ignore[return-value]
  return "more", "it has"


def refused_report(message: str, arguments: int) -> dict:
  """The memory report of a step the TPU compiler refused as larger than
  HBM (RESOURCE_EXHAUSTED: "the total memory required for HLO temporaries
  (54.29G) exceeds available HBM (15.75G)", or "Used X of Y hbm"): its
  temporaries from the message (libtpu's sizes are binary: G = GiB), its
  arguments from the abstract arguments' shards, outputs taken as aliased.
  ``total_bytes`` is then a lower bound; ``refused`` holds the message."""
  one_line = " ".join(message.split())
  temps = re.search(
      r"HLO temporaries \(" + _SIZE + r"\) exceeds available HBM \(" + _SIZE, one_line
  )
  used = re.search(r"Used " + _SIZE + " of " + _SIZE + " hbm", one_line)
  temp, available = 0, None
  if temps:
    temp, available = _bytes(*temps.groups()[:2]), _bytes(*temps.groups()[2:])
  elif used:
    temp, available = _bytes(*used.groups()[:2]) - arguments, _bytes(*used.groups()[2:])
  rep = {
      "argument_bytes": arguments,
      "output_bytes": 0,
      "alias_bytes": 0,
      "temp_bytes": max(temp, 0),
      "generated_code_bytes": 0,
  }
  rep["total_bytes"] = arguments + rep["temp_bytes"]
  rep["refused"] = one_line[:500]
  rep["compiler_hbm_bytes"] = available
  return rep


def search(
    comp: StepCompiler, step: str, target: float, max_tries: int, log: Callable[[str], None]
) -> dict:
  """``fit.search_fit`` over remat / attn_block; for the train step, when
  even the most frugal of those does not fit, ``train.batch_chunk``
  doubled (the same gradient in more micro-batches) up to the rows per
  data-parallel device.  Returns search_fit's dict (``fix`` may carry a
  batch_chunk)."""
  from transformer_xl import sharding  # noqa: PLC0415

  m = comp.model_cfg
  chunk = comp.config.train.batch_chunk
  res = fit.search_fit(
      lambda r, b: comp.compile(step, Setting(r, b, chunk)),
      step,
      m.remat,
      m.attn_block,
      m.tgt_len if step == "train" else comp.config.eval.tgt_len,
      target,
      max_tries,
      log,
  )
  if res["fix"] is not None or step != "train":
    return res
  frugal = res["tried"][0] if res["tried"] else {"remat": m.remat, "attn_block": m.attn_block}
  rows = comp.config.train.global_batch // sharding.data_parallel_size(comp.mesh)
  c = chunk * 2
  while c <= rows and len(res["tried"]) < max_tries:
    if rows % c == 0:
      rep = comp.compile(step, Setting(frugal["remat"], frugal["attn_block"], c))
      res["tried"].append(rep)
      log(
          f"    {step}: remat={rep['remat']}, attn_block={rep['attn_block']}, batch_chunk={c}: "
          f"{rep['total_bytes'] / fit.GIB:.2f} GiB"
      )
      if fit.fits(rep, target):
        res["fix"] = rep
        return res
    c *= 2
  return res


def analyse(
    config: Any,
    vocab: int,
    devices: list,
    chip: chips_lib.Chip,
    steps: tuple[str, ...],
    margin: float = 0.1,
    do_search: bool = True,
    max_tries: int = 12,
    log: Callable[[str], None] = print,
) -> dict:
  """Compiles ``steps`` of ``config`` on ``devices`` and reads each one.

  Per step: the memory report (per device; ``fit.memory_report``) and its
  verdict against ``chip.hbm_gib`` (``fit.verdict``), with the search for
  a setting that fits when it does not; XLA's cost analysis; the matrix
  FLOPs, bytes accessed and collectives per step (``hlo.count``: loops
  counted as often as they run); the roofline ceiling (``fit.roofline``)
  from the chip's peaks.

  Returns:
    {"mesh", "dtype", "n_params", "chip": the chip's numbers, "steps":
    {step: {"as_configured", "verdict", "search"?, "roofline"}}}.
  """
  comp = StepCompiler(config, vocab, devices)
  capacity = chip.hbm_gib * fit.GIB
  out = {
      "mesh": dict(comp.mesh.shape),
      "dtype": comp.model_cfg.dtype,
      "attention_impl": comp.model_cfg.attention_impl,
      "n_params": comp.n_params(),
      "chip": dataclasses.asdict(chip),
      "steps": {},
  }
  m = comp.model_cfg
  for step in steps:
    rep = comp.compile(step, Setting(m.remat, m.attn_block, config.train.batch_chunk), counts=True)
    verdict = fit.verdict(rep, capacity, margin)
    counts = rep.get("counts")
    ceiling = counts and fit.roofline(
        counts["matmul_flops"], counts["bytes_accessed"], chip.peak_flops, chip.hbm_bytes_per_s
    )
    log(
        f"  {step}: {rep['total_bytes'] / fit.GIB:.2f} GiB of {chip.hbm_gib:g} GiB per device, "
        f"{verdict} (compiled in {rep['compile_seconds']:.0f} s)"
    )
    res = {"as_configured": rep, "verdict": verdict, "roofline": ceiling}
    if verdict != "FITS" and do_search and step in ("train", "eval"):
      res["search"] = search(comp, step, capacity * (1 - margin), max_tries, log)
    out["steps"][step] = res
  return out
