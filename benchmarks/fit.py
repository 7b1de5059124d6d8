r"""Fit before you rent: does a config's train step and eval step fit in its devices' memory?

Compiles the real steps for the slice's device count on simulated CPU
devices, executes nothing, and prints XLA's per-device memory analysis
against the memory of one device of the slice::

  python benchmarks/fit.py --config=configs/enwik8_24l.py:v3-32
  python benchmarks/fit.py --config=configs/enwik8_24l.py:v3-32 --config.model.remat=none
  python benchmarks/fit.py --config=configs/enwik8_12l.py --devices=8 --device_kind=v3 \
      --config.mesh.shape='(2, 4)'
  python benchmarks/fit.py --config=configs/wt103_base.py     # no preset: one H100
  python benchmarks/fit.py --all                              # every paper config (README table)

What is compiled, exactly as training and evaluation build it:

* **train**: ``train.make_train_step`` with the shardings of
  ``train_state.abstract_train_state`` (parameters, Adam moments, memory),
  lowered with ``jax.ShapeDtypeStruct`` inputs of the global batch
  (``train.global_batch`` x ``model.tgt_len``).  No parameter is allocated.
* **eval**: ``evaluate.make_eval_step`` with ``evaluate.eval_model_config``
  (the eval tgt_len, mem_len, clamp_len and same_length), parameters with
  the training shardings and ``eval.global_batch`` rows padded to the
  data-parallel size, as the ``Evaluator`` pads them
  (``eval.method="sliding"``: ``evaluate.make_window_step``).

The devices: ``--config=FILE:PRESET`` (a slice preset, ``transformer_xl/presets.py``)
gives the device count (``presets.SLICE_DEVICES``) and the device kind (the
part before the "-": v3, v4, v5p); a config without a preset runs on
``--devices`` (default 1) of ``--device_kind`` (default h100).  This script
re-executes itself with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
(set before jax is imported) for each config.  Vocabulary sizes are the real
corpora's (:func:`vocab_sizes`), so no data are read.

Memory per device, from ``compiled.memory_analysis()`` (bytes, shown in
GiB = 2**30 bytes): arguments, outputs, the outputs aliased to donated
arguments (the train state, the eval memory), temporaries and generated
code; total = arguments + outputs - aliased + temporaries + code.  The
verdict compares the total with one device's memory
(:data:`DEVICE_MEMORY_GIB`, or ``--device_memory``):

* FITS: total <= (1 - ``--margin``) x device memory (margin 10%);
* TIGHT: within the margin below the device memory, which the CPU
  analysis cannot settle (see the caveats);
* DOES NOT FIT: total > device memory.

When a step is TIGHT or does not fit, the script looks for the cheapest
setting that FITS: first the most frugal candidate (``model.remat="full"``
and the smallest block of the blockwise attention); if even that does not
fit, no remat or block size will and it says so; otherwise it tries the
candidates from the least recomputation up (remat policies "none", "dots",
"save_proj", "save_qkv_proj", "full" of ``models.REMAT_POLICIES``, each with
the config's ``model.attn_block`` and then smaller blocks; eval: blocks
only) and prints the first that fits as ``--config.model.remat=...
--config.model.attn_block=...``.

Caveats: the numbers are XLA's compile-time buffer assignment for the CPU
backend with the slice's device count, not a measurement on a TPU or GPU.
The TPU and GPU compilers fuse, lay out and schedule differently (and the
runtime reserves some memory), hence the margin.  Compiling the large
configs takes minutes each on a small CPU machine.

Any config value can be overridden as with ``transformer_xl.main``:
``--config.<section>.<key>=value`` (with ``--all``: for every config).
Every run writes a JSON (``--json``, default
``benchmarks/results/fit_<date>_<time>_<host>.json``) with the machine,
versions and every number.  Bad input (unknown config file, preset, key or
device kind) stops with one ``error: ...`` line and exit status 1.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")
GIB = 2**30

# Memory of one JAX device, GiB: a TPU v2/v3 TensorCore, a v4/v5p chip (Cloud
# TPU system architecture pages: v2 8 GiB and v3 16 GiB of HBM per core, v4
# 32 GiB and v5p 95 GB per chip), an NVIDIA H100 (80 GB of HBM3; a CUDA
# process gets somewhat less, which --margin covers).
DEVICE_MEMORY_GIB = {"v2": 8, "v3": 16, "v4": 32, "v5p": 95, "h100": 80}

# Every paper config on the slice the README recommends (``--all``): the
# large ones with their preset; enwik8_12l (batch 22, no preset divides it)
# on a v3-8 with the README's (data, model) = (2, 4) mesh; the base models,
# which have no preset, on one H100 (the config's own mesh, float32), and
# lm1b_base also on the 4 GPUs of the reference's lm1b_base_gpu.sh.
ALL_CONFIGS = (
    ("configs/enwik8_12l.py", ("--devices=8", "--device_kind=v3",
                               "--config.mesh.shape=(2, 4)")),
    ("configs/enwik8_24l.py:v3-32", ()),
    ("configs/text8_24l.py:v3-32", ()),
    ("configs/wt103_base.py", ()),
    ("configs/wt103_large.py:v3-64", ()),
    ("configs/lm1b_base.py", ()),
    ("configs/lm1b_base.py", ("--devices=4",)),
    ("configs/lm1b_large.py:v3-512", ()),
    ("configs/ptb.py", ()),
)

# Candidate settings when a step does not fit, from the least recomputation up.
REMAT_ORDER = ("none", "dots", "save_proj", "save_qkv_proj", "full")
BLOCK_SIZES = (256, 128, 64, 32)  # queries per block; those < tgt_len, at most 3


class FitError(Exception):
  """Bad input: the message is printed as one ``error: ...`` line."""


def vocab_sizes() -> dict[str, int]:
  """Vocabulary size of each corpus (``data.CORPUS_NAMES``) whose size is
  fixed: enwik8 (all 256 byte values), text8 (27 characters), and the
  documented sizes of PTB (10,000), WikiText-2 (33,278), WikiText-103
  (267,735) and One Billion Word (793,471; the reference's vocabulary
  file), taken from ``transformer_xl.data``."""
  from transformer_xl.data import lm1b, ptb_wikitext
  return {"enwik8": 256, "text8": 27,
          "ptb": ptb_wikitext.PTB.expected.vocab_size,
          "wikitext2": ptb_wikitext.WIKITEXT2.expected.vocab_size,
          "wikitext103": ptb_wikitext.WIKITEXT103.expected.vocab_size,
          "lm1b": lm1b.LM1B_VOCAB_SIZE}


# ---------------------------------------------------------------------------
# Configs: loading (as ml_collections' config_flags does), overrides, devices.
# ---------------------------------------------------------------------------

def load_config(spec: str):
  """``path[:arg]`` -> the ConfigDict of ``get_config(arg)`` (``get_config()``
  without an arg), as ``--config`` of ``transformer_xl.main`` reads it.

  Raises:
    FitError: no such file, no get_config, an argument the config does not
      take, or the config's own error (e.g. an unknown preset).
  """
  path, _, arg = spec.partition(":")
  full = path if os.path.isabs(path) else os.path.join(REPO, path)
  if not os.path.isfile(full):
    raise FitError(f"config file not found: {path} (e.g. --config=configs/enwik8_24l.py:v3-32)")
  module_spec = importlib.util.spec_from_file_location(
      "fit_config_" + re.sub(r"\W", "_", os.path.basename(path)), full)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as err:  # a broken config file: say which
    raise FitError(f"cannot load {path}: {type(err).__name__}: {err}") from None
  if not hasattr(module, "get_config"):
    raise FitError(f"{path} has no get_config()")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except TypeError as err:
    if arg and "argument" in str(err):
      raise FitError(f"{path} takes no argument (no slice preset), got {arg!r}: use "
                     f"--config={path} with --devices=N --device_kind=KIND (and "
                     "--config.mesh.* overrides)") from None
    raise FitError(f"{spec}: {err}") from None
  except ValueError as err:  # e.g. presets.apply_slice: unknown preset, batch not divisible
    raise FitError(str(err)) from None


def _parse_value(text: str, current: Any, key: str) -> Any:
  """``text`` as the type of the key's current value (bool, int, float,
  tuple, str)."""
  try:
    if isinstance(current, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
    if isinstance(current, (tuple, list)):
      value = ast.literal_eval(text)
      if not isinstance(value, (tuple, list)):
        raise ValueError(text)
      return tuple(value)
  except (ValueError, SyntaxError):
    raise FitError(f"--config.{key}={text!r}: expected a value of type {type(current).__name__} "
                   f"like the current value {current!r}") from None
  return text


def apply_overrides(config, overrides: list[tuple[str, str]]) -> None:
  """Sets ``--config.<key>=<value>`` overrides on a locked ConfigDict.

  Raises:
    FitError: an unknown key, or a value of the wrong type.
  """
  for key, text in overrides:
    *parents, last = key.split(".")
    node = config
    try:
      for part in parents:
        node = node[part]
      current = node[last]
    except (KeyError, AttributeError, TypeError):
      raise FitError(f"unknown config key --config.{key} (every key is listed in "
                     "transformer_xl/default_config.py)") from None
    try:
      node[last] = _parse_value(text, current, key)
    except (TypeError, ValueError) as err:
      raise FitError(f"--config.{key}={text!r}: {err}") from None


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """Separates ``--config.<key>=<value>`` (or ``--config.<key> <value>``)
  from the other arguments."""
  rest, overrides, i = [], [], 0
  while i < len(argv):
    arg = argv[i]
    m = re.fullmatch(r"--config\.([\w.]+)(?:=(.*))?", arg, re.S)
    if m and m.group(2) is None and i + 1 < len(argv):
      overrides.append((m.group(1), argv[i + 1]))
      i += 2
      continue
    if m and m.group(2) is not None:
      overrides.append((m.group(1), m.group(2)))
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


@dataclasses.dataclass
class Job:
  """One config to analyse: where it comes from and on which devices."""

  spec: str                      # path[:preset]
  overrides: list                # [(key, value text)]
  devices: int
  device_kind: str
  device_memory_gib: float
  vocab: int
  search: bool = True
  max_tries: int = 12
  margin: float = 0.1            # FITS below (1 - margin) x device memory

  @property
  def slice_name(self) -> str:
    preset = self.spec.partition(":")[2]
    return preset or (f"{self.devices} x {self.device_kind}" if self.devices > 1
                      else self.device_kind)


def make_job(spec: str, overrides: list[tuple[str, str]], devices: Optional[int],
             device_kind: Optional[str], device_memory: Optional[float],
             vocab: Optional[int], search: bool, max_tries: int, margin: float = 0.1) -> Job:
  """Checks a config on its devices in this process (no compilation) and
  returns its Job.

  Raises:
    FitError: bad config, preset, override, device kind or count, or an
      invalid config for the device count (default_config.validate's message).
  """
  from transformer_xl import default_config, presets
  config = load_config(spec)
  apply_overrides(config, overrides)
  preset = spec.partition(":")[2]
  if preset and preset in presets.SLICE_DEVICES:
    kind = device_kind or preset.split("-")[0]
    n = devices or presets.SLICE_DEVICES[preset]
  else:
    kind, n = device_kind or "h100", devices or 1
  if kind not in DEVICE_MEMORY_GIB and device_memory is None:
    raise FitError(f"--device_kind={kind!r}: choose one of {sorted(DEVICE_MEMORY_GIB)} "
                   "or give --device_memory=GiB")
  if n < 1:
    raise FitError(f"--devices={n} must be >= 1")
  if not 0 <= margin < 1:
    raise FitError(f"--margin={100 * margin:g} must be in [0, 100) percent")
  try:
    default_config.validate(config, n)
  except default_config.ConfigError as err:
    raise FitError(f"{spec} on {n} device(s): " + str(err).replace("\n", " ")) from None
  sizes = vocab_sizes()
  if vocab is None and config.data.dataset not in sizes:
    raise FitError(f"no fixed vocabulary size is known for data.dataset="
                   f"{config.data.dataset!r}; pass --vocab=N")
  return Job(spec=spec, overrides=list(overrides), devices=n, device_kind=kind,
             device_memory_gib=(device_memory if device_memory is not None
                                else DEVICE_MEMORY_GIB[kind]),
             vocab=vocab or sizes[config.data.dataset], search=search, max_tries=max_tries,
             margin=margin)


# ---------------------------------------------------------------------------
# The worker: compile and analyse (runs with N simulated devices).
# ---------------------------------------------------------------------------

def memory_report(compiled) -> dict:
  """Per-device bytes of a compiled step (``compiled.memory_analysis()``)
  and their total = arguments + outputs - aliased + temporaries + code.

  Raises:
    RuntimeError: the backend gives no memory analysis.
  """
  ma = compiled.memory_analysis()
  if ma is None:
    raise RuntimeError("this backend gives no memory analysis")
  rep = {"argument_bytes": ma.argument_size_in_bytes, "output_bytes": ma.output_size_in_bytes,
         "alias_bytes": ma.alias_size_in_bytes, "temp_bytes": ma.temp_size_in_bytes,
         "generated_code_bytes": ma.generated_code_size_in_bytes}
  rep["total_bytes"] = (rep["argument_bytes"] + rep["output_bytes"] - rep["alias_bytes"]
                        + rep["temp_bytes"] + rep["generated_code_bytes"])
  return rep


class StepCompiler:
  """Compiles a config's train or eval step on the devices of this process
  for given (remat, attn_block), and returns its memory report."""

  def __init__(self, config, vocab: int):
    import jax
    from transformer_xl import default_config, sharding
    self.config = config
    self.mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names,
                                   devices=jax.devices())
    self.model_cfg = default_config.model_config(config, vocab)
    if self.model_cfg.attn_block < 0:  # "per backend": an accelerator's choice, not
      self.model_cfg = dataclasses.replace(self.model_cfg, attn_block=0)  # these CPUs'
    if self.model_cfg.scan_unroll < 0:  # likewise: one layer per scan iteration
      self.model_cfg = dataclasses.replace(self.model_cfg, scan_unroll=1)

  def n_params(self) -> int:
    import jax
    import numpy as np
    from transformer_xl import models
    shapes = jax.eval_shape(lambda r: models.init_params(models.TransformerXL(self.model_cfg), r),
                            jax.random.PRNGKey(0))
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

  def compile(self, step: str, remat: str, attn_block: int) -> dict:
    """Lower + compile ``step`` ("train" or "eval") with model.remat and
    model.attn_block replaced; returns memory_report plus compile seconds."""
    import jax
    import jax.numpy as jnp
    from transformer_xl import evaluate, models, sharding, train, train_state
    c, mesh = self.config, self.mesh
    mcfg = dataclasses.replace(self.model_cfg, remat=remat, attn_block=attn_block)
    model = models.TransformerXL(mcfg)
    tx = train_state.make_optimizer(c.train)
    abstract, shardings = train_state.abstract_train_state(model, tx, c.train.global_batch, mesh)
    rows, row_sh = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)

    def spec(shape, dtype, sh):
      return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

    t0 = time.perf_counter()
    if step == "train":
      fn = train.make_train_step(model, tx, mesh, shardings, c.train.batch_chunk,
                                 c.train.seed, c.train.loss_span)
      b, t = c.train.global_batch, mcfg.tgt_len
      batch = {"inputs": spec((b, t), jnp.int32, rows), "targets": spec((b, t), jnp.int32, rows),
               "weights": spec((b, t), jnp.float32, rows), "reset": spec((b,), jnp.bool_, row_sh)}
      lowered = fn.lower(abstract, batch)
    else:
      n_data = sharding.data_parallel_size(mesh)
      b = -(-c.eval.global_batch // n_data) * n_data  # the Evaluator's padding
      if c.eval.method == "sliding":
        wcfg = evaluate.window_model_config(c, mcfg)
        fn = evaluate.make_window_step(models.TransformerXL(wcfg), mesh, c.eval.stride)
        t = wcfg.tgt_len
        batch = {"inputs": spec((b, t), jnp.int32, rows),
                 "targets": spec((b, t), jnp.int32, rows),
                 "front_pad": spec((b,), jnp.int32, row_sh)}
        lowered = fn.lower(abstract.params, batch)
      else:
        ecfg = evaluate.eval_model_config(c, mcfg)
        fn = evaluate.make_eval_step(models.TransformerXL(ecfg), mesh)
        t = ecfg.tgt_len
        mem_shapes = jax.eval_shape(lambda: models.init_memory(ecfg, b))
        memory = jax.tree_util.tree_map(lambda x, sh: spec(x.shape, x.dtype, sh), mem_shapes,
                                        sharding.memory_sharding(mesh))
        batch = {"inputs": spec((b, t), jnp.int32, rows),
                 "targets": spec((b, t), jnp.int32, rows), "reset": spec((b,), jnp.bool_, row_sh)}
        lowered = fn.lower(abstract.params, memory, batch)
    rep = memory_report(lowered.compile())
    rep.update(remat=remat, attn_block=attn_block, batch=b, tgt_len=t,
               compile_seconds=round(time.perf_counter() - t0, 1))
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


def search_fit(try_setting, step: str, remat: str, attn_block: int, tgt_len: int,
               target: float, max_tries: int, log=print) -> dict:
  """Finds the first (remat, attn_block) of :func:`candidates` whose total
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
  the candidates of :func:`search_fit`) on this process's devices."""
  import jax
  config = load_config(job.spec)
  apply_overrides(config, job.overrides)
  if jax.device_count() != job.devices:
    raise RuntimeError(f"expected {job.devices} devices, jax has {jax.device_count()} "
                       "(XLA_FLAGS must be set before jax is imported)")
  comp = StepCompiler(config, job.vocab)
  capacity = job.device_memory_gib * GIB
  target = capacity * (1 - job.margin)
  out = {"job": dataclasses.asdict(job), "mesh": dict(comp.mesh.shape),
         "dtype": comp.model_cfg.dtype, "n_params": comp.n_params(), "steps": {}}
  for step in ("train", "eval"):
    m = comp.model_cfg
    t0 = time.perf_counter()
    rep = comp.compile(step, m.remat, m.attn_block)
    verdict = classify(rep["total_bytes"], capacity, job.margin)
    log(f"  {job.spec} {step}: {rep['total_bytes'] / GIB:.2f} GiB of "
        f"{job.device_memory_gib:g} GiB per device, {verdict} "
        f"(compiled in {time.perf_counter() - t0:.0f} s)")
    res = {"as_configured": rep, "verdict": verdict}
    if verdict != "FITS" and job.search:
      res["search"] = search_fit(lambda r, b, s=step: comp.compile(s, r, b), step, m.remat,
                                 m.attn_block, rep["tgt_len"], target, job.max_tries, log)
    out["steps"][step] = res
  return out


# ---------------------------------------------------------------------------
# The parent: jobs in subprocesses, the table, the JSON.
# ---------------------------------------------------------------------------

def _version(pkg: str) -> str:
  try:
    return importlib.metadata.version(pkg)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def machine_info() -> dict:
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f
                  if line.startswith("model name")), cpu)
  except OSError:
    pass
  return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "host": platform.node(), "cpu": cpu, "cpu_count": os.cpu_count(),
          "loadavg": [round(x, 2) for x in os.getloadavg()],
          "python": platform.python_version(),
          "versions": {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax")}}


def run_job(job: Job) -> dict:
  """Runs :func:`analyse` for ``job`` in a subprocess with job.devices
  simulated CPU devices; returns its result.

  Raises:
    FitError: the subprocess failed (its output is above the message).
  """
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={job.devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  with tempfile.TemporaryDirectory() as tmp:
    job_file, result_file = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
    with open(job_file, "w") as f:
      json.dump(dataclasses.asdict(job), f)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), f"--worker={job_file}",
                           f"--result_file={result_file}"], env=env, cwd=REPO)
    if proc.returncode != 0:
      raise FitError(f"compiling {job.spec} failed (exit code {proc.returncode}; its output "
                     "is above)")
    with open(result_file) as f:
      return json.load(f)


def _gib(x: float) -> str:
  """Bytes as GiB: 2 decimals, 3 significant digits below 0.1 GiB."""
  g = x / GIB
  return f"{g:.2f}" if g >= 0.1 or g == 0 else f"{g:.3g}"


def _flags(rep: dict, configured: dict) -> str:
  """The --config.model.* flags that turn the configured setting into rep's."""
  parts = []
  if rep["remat"] != configured["remat"]:
    parts.append(f"--config.model.remat={rep['remat']}")
  if rep["attn_block"] != configured["attn_block"]:
    parts.append(f"--config.model.attn_block={rep['attn_block']}")
  return " ".join(f"`{p}`" for p in parts)


def verdict_text(step_result: dict, margin: float) -> tuple[str, str]:
  """(FITS / TIGHT / DOES NOT FIT, what makes it fit) for one step's result."""
  verdict = step_result["verdict"]
  if verdict == "FITS":
    return verdict, ""
  search = step_result.get("search")
  if search is None:
    return verdict, "not searched (--no_search)"
  if not search["tried"]:
    return verdict, ("already the most frugal remat / attn_block setting: fewer rows or "
                     "less state per device (more devices, or arguments sharded further)")
  fix = search["fix"]
  if fix is None:
    low = search["tried"][0]
    return verdict, (f"no remat / attn_block setting gets below {100 * (1 - margin):g}% "
                     f"(remat={low['remat']}, attn_block={low['attn_block']}: "
                     f"{_gib(low['total_bytes'])} GiB): fewer rows or less state per device "
                     "(more devices, or arguments sharded further)")
  note = "" if search["cheapest"] else "; --max_tries reached, a cheaper one may fit"
  flags = _flags(fix, step_result["as_configured"])
  return verdict, f"{flags} ({_gib(fix['total_bytes'])} GiB{note})"


def format_table(results: list[dict]) -> str:
  """Markdown: one row per config and step, per-device GiB."""
  rows = ["| config | slice | mesh | step | remat | attn_block | arguments | outputs "
          "| aliased | temporaries | total | device | % of device | verdict "
          "| what makes it fit |",
          "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
  for res in results:
    job = res["job"]
    mesh = "(" + ", ".join(f"{k} {v}" for k, v in res["mesh"].items()) + ")"
    for step, sr in res["steps"].items():
      rep = sr["as_configured"]
      verdict, fix = verdict_text(sr, job["margin"])
      pct = 100 * rep["total_bytes"] / (job["device_memory_gib"] * GIB)
      rows.append(
          f"| `{job['spec']}` | {Job(**job).slice_name} | {mesh} | {step} | {rep['remat']} "
          f"| {rep['attn_block']} | {_gib(rep['argument_bytes'])} | {_gib(rep['output_bytes'])} "
          f"| {_gib(rep['alias_bytes'])} | {_gib(rep['temp_bytes'])} "
          f"| **{_gib(rep['total_bytes'])}** | {job['device_memory_gib']:g} | {pct:.0f}% "
          f"| {verdict} | {fix} |")
  return "\n".join(rows)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str]]]:
  rest, overrides = split_overrides(argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", default="",
                 help="configs/FILE.py[:PRESET], as for transformer_xl.main")
  p.add_argument("--all", action="store_true",
                 help="every paper config on its slice (benchmarks/fit.py ALL_CONFIGS)")
  p.add_argument("--devices", type=int, default=None,
                 help="simulated devices (default: the preset's count, else 1)")
  p.add_argument("--device_kind", default=None,
                 help=f"one of {sorted(DEVICE_MEMORY_GIB)} (default: the preset's, else h100)")
  p.add_argument("--device_memory", type=float, default=None,
                 help="memory of one device in GiB (default: by --device_kind: "
                      + ", ".join(f"{k} {v}" for k, v in DEVICE_MEMORY_GIB.items()) + ")")
  p.add_argument("--vocab", type=int, default=None,
                 help="vocabulary size (default: the dataset's, fit.vocab_sizes)")
  p.add_argument("--margin", type=float, default=10.0,
                 help="percent of the device memory kept free for FITS (below: TIGHT)")
  p.add_argument("--no_search", action="store_true",
                 help="only the config as given: no remat / attn_block search")
  p.add_argument("--max_tries", type=int, default=12,
                 help="compilations per step at most while searching for a fit")
  p.add_argument("--json", default="",
                 help="write the results here (default: "
                      "benchmarks/results/fit_<date>_<time>_<host>.json)")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--result_file", default="", help=argparse.SUPPRESS)
  args = p.parse_args(rest)
  if not args.worker and bool(args.config) == bool(args.all):
    p.error("give --config=configs/FILE.py[:PRESET] or --all")
  if args.all and (args.devices or args.device_kind):
    p.error("--devices / --device_kind apply to one --config, not --all")
  return args, overrides


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args, overrides = parse_args(argv)
  sys.path.insert(0, REPO)
  if args.worker:  # the subprocess: jax sees the simulated devices
    with open(args.worker) as f:
      job = Job(**json.load(f))
    job.overrides = [tuple(o) for o in job.overrides]
    res = analyse(job, log=lambda s: print(s, flush=True))
    with open(args.result_file, "w") as f:
      json.dump(res, f)
    return 0

  try:
    specs = ([(spec, list(extra)) for spec, extra in ALL_CONFIGS] if args.all
             else [(args.config, [])])
    jobs = []
    for spec, extra in specs:
      rest, extra_overrides = split_overrides(extra)
      opts = dict(a.lstrip("-").split("=", 1) for a in rest)
      devices = int(opts["devices"]) if "devices" in opts else args.devices
      jobs.append(make_job(spec, extra_overrides + overrides, devices,
                           opts.get("device_kind", args.device_kind), args.device_memory,
                           args.vocab, not args.no_search, args.max_tries,
                           args.margin / 100))
    info = machine_info()
    print(f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs, load average "
          f"{' '.join(map(str, info['loadavg']))}; jax {info['versions']['jax']}", flush=True)
    results = []
    for job in jobs:
      print(f"compiling {job.spec} on {job.devices} simulated device(s) "
            f"({job.slice_name}, {job.device_memory_gib:g} GiB each) ...", flush=True)
      results.append(run_job(job))
  except FitError as err:
    sys.exit(f"error: {err}")

  table = format_table(results)
  print()
  print(table)
  print()
  print("GiB per device (2**30 bytes) from XLA's compile-time memory analysis on simulated CPU "
        "devices, not measured on the accelerator; total = arguments + outputs - aliased + "
        f"temporaries + generated code; FITS below {100 - args.margin:g}% of the device, TIGHT "
        "up to 100%.")
  path = args.json
  if not path:
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", info["host"] or "host")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    path = os.path.join(RESULTS_DIR, f"fit_{stamp}_{host}.json")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump({"args": {k: v for k, v in vars(args).items()
                        if k not in ("worker", "result_file")},
               "overrides": overrides, "machine": info, "results": results, "table": table},
              f, indent=2)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
