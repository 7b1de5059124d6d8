"""The cost of the compressive memory (Rae et al. 2020) against Transformer-XL's memory.

Run from the repository root::

  python benchmarks/compressive_memory.py [--mem_len=32 --cmem_len=32 --ratios=2,4]
                                          [--n_layer=4 --d_model=128 ... --batch=16] [--json=F]
  python benchmarks/compressive_memory.py --smoke    # a tiny model, seconds (tests)

The compressive memory (``model.memory="compressive"``,
``transformer_xl/model/memory.py``, ``CompressiveMemory``) keeps, beside
the M = ``mem_len`` states of Transformer-XL's memory, Nc = ``cmem_len``
compressed slots: each segment the T states the memory drops are
compressed at rate c into T / c slots (``cmem_fn``), the attention reads
[compressed; memory; segment] (Nc + M + T keys), and training adds the
attention-reconstruction loss (Sec. 3.2: two content attentions of the
segment over the dropped states and over their compression).  Here, with
one model size on one device in one run, every variant below is timed in
two jitted steps:

* **train**: the package's training step (``train_step.make_train_step``:
  forward, backward with the reconstruction loss as an auxiliary loss,
  gradient clipping and Adam; dropout as the config's), the train state and
  its memory carried and donated from step to step;
* **eval**: the evaluation segment step (``eval_steps.make_eval_step``,
  ``eval_steps.eval_model_config``: no dropout, segments of T with the
  variant's memory; the eval ``same_length`` of ``--same_length``).

Variants (M, Nc and the rates c from the flags; the defaults give the
issue's): ``xl``, Transformer-XL with memory M (the baseline of every
ratio); ``cmem_c{c}``, the compressive memory M + Nc at rate c, 1-D
convolution (kernel = stride = c, the paper's best); ``cmem_c{c}_max_pool``
at the largest c, whose compression has no parameters and no matmul (its
difference from the convolution is the compression network's share);
``xl_range_c{c}``, Transformer-XL with M + c Nc, the temporal range of the
compressive memory at rate c; ``xl_keys``, Transformer-XL with M + Nc, the
same number of keys (attention cost) as the compressive memory.

Reported per variant and step: tokens/s (median over repeats) and its
ratio to ``xl``'s; the same ratio in tokens per second of this process's
CPU time (``time.process_time`` around each repeat; on a shared CPU less
affected by the other processes than the wall time, meaningless on an
accelerator); the recurrent state, bytes per batch row
(``mems_LxBxMxD``: L x (Nc + M) x d_model values, float32), and its ratio;
XLA's ``compiled.memory_analysis()`` of the step: temporaries and
arguments (MiB; None where the backend gives none); the parameter count.

Timing (as ``dynamic_eval.py``, ``common.py``): the model's default
initialisation (``--seed``); random token ids placed on the device before
timing (no input pipeline); each step compiled once (``lower().compile()``:
the analysed executable is the one timed), then run ``--warmup`` times
untimed (the memory fills); the fastest of three single steps sets the
steps per repeat (about ``--min_repeat_s`` seconds); then ``--repeats``
repeats of every variant and step taken in turn (repeat 1 of all, then
repeat 2, ...: a change of load on a shared machine reaches them alike),
each ending with ``jax.block_until_ready``; the median.  The JSON (by
default ``benchmarks/results/compressive_memory_<date>_<time>_<host>.json``;
``--smoke``: a temporary directory) holds the settings, the machine (CPU or
device, load average before and after, versions, commit) and every number.

Default model: ``configs/ablation_wt2.py:xl`` (4 layers, d_model 128,
4x32 heads, d_inner 512, adaptive input and softmax over WikiText-2's
33,278 words, cutoffs 2000 / 8000, div_val 2; tgt_len 32, batch 16, Adam
at 1e-3, clipping 0.25), with a synthetic vocabulary of that size: no data
is read.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
import common  # noqa: E402

REPO = common.REPO
if REPO not in sys.path:
  sys.path.insert(0, REPO)
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")  # versions saved with the results
ABLATION = os.path.join(REPO, "configs", "ablation_wt2.py")
PHASES = ("train", "eval")

# Model, lengths and timing of each preset; flags given explicitly override them.  "default":
# configs/ablation_wt2.py:xl's model and training batch (WikiText-2's vocabulary, adaptive).
PRESETS = {
    "default": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        d_head=32,
        d_inner=512,
        vocab=33_278,
        cutoffs="2000,8000",
        div_val=2,
        tgt_len=32,
        mem_len=32,
        cmem_len=32,
        ratios="2,4",
        batch=16,
        repeats=5,
        min_repeat_s=1.0,
    ),
    "smoke": dict(
        n_layer=1,
        d_model=16,
        n_head=2,
        d_head=8,
        d_inner=32,
        vocab=64,
        cutoffs="",
        div_val=1,
        tgt_len=8,
        mem_len=8,
        cmem_len=4,
        ratios="2",
        batch=2,
        repeats=3,
        min_repeat_s=0.05,
    ),
}
SIZES = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab", "div_val", "tgt_len")
SIZES += ("mem_len", "cmem_len", "batch", "repeats")


class UsageError(ValueError):
  """Bad command-line input; printed as one ``error: ...`` line."""


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    raise UsageError(message)


def _int_list(flag: str, text: str) -> list[int]:
  try:
    return [int(s) for s in str(text).split(",") if s.strip()]
  except ValueError:
    raise UsageError(f"--{flag}={text!r}: expected a comma list of ints.") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (default, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, sizes < 1, rates < 2 or not dividing
      ``--tgt_len``, cutoffs that are not a comma list of ints.
  """
  p = _Parser(description=__doc__.split("\n\n")[0])
  p.add_argument("--smoke", action="store_true", help="tiny model (seconds)")
  for name in SIZES:
    p.add_argument(f"--{name}", type=int)
  p.add_argument("--cutoffs", help="adaptive softmax cutoffs, a comma list ('' = dense)")
  p.add_argument("--ratios", help="compression rates c, a comma list (each divides --tgt_len)")
  p.add_argument(
      "--same_length",
      action=argparse.BooleanOptionalAction,
      default=True,
      help="eval same_length (default on, as configs/ablation_wt2.py's eval)",
  )
  p.add_argument("--min_repeat_s", type=float, help="seconds per timed repeat (about)")
  p.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
      "--json",
      default="",
      help="write arguments, machine and results here (default: benchmarks/results/"
      "compressive_memory_<date>_<time>_<host>.json; --smoke: a temporary directory)",
  )
  args = p.parse_args(argv)
  preset = PRESETS["smoke" if args.smoke else "default"]
  for k, v in preset.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  args.cutoffs = _int_list("cutoffs", args.cutoffs)
  args.ratios = sorted(set(_int_list("ratios", args.ratios)))
  bad = [f"--{k}" for k in SIZES if getattr(args, k) < 1]
  bad += ["--warmup"] if args.warmup < 0 else []
  bad += ["--min_repeat_s"] if not args.min_repeat_s > 0 else []
  if bad:
    raise UsageError(
        f"{', '.join(bad)}: sizes, lengths, --batch and --repeats must be >= 1, --warmup >= 0, "
        "--min_repeat_s > 0."
    )
  wrong = [c for c in args.ratios if c < 2 or args.tgt_len % c]
  if not args.ratios or wrong:
    raise UsageError(
        f"--ratios={','.join(map(str, args.ratios))}: give compression rates c >= 2 that "
        f"divide --tgt_len={args.tgt_len} (each segment's evicted states are compressed c at "
        "a time)."
    )
  return args


def variants(args: argparse.Namespace) -> list[dict]:
  """The variants timed, in the table's order: {"key", "label", "memory",
  "mem_len", "cmem_len", "cmem_ratio", "cmem_fn"}; the first is the baseline."""
  m, nc, top = args.mem_len, args.cmem_len, max(args.ratios)
  xl = lambda key, label, mem_len: dict(
      key=key, label=label, memory="xl", mem_len=mem_len, cmem_len=0, cmem_ratio=1, cmem_fn="conv"
  )
  cm = lambda c, fn, suffix: dict(
      key=f"cmem_c{c}{suffix}",
      label=f"compressive M={m} + Nc={nc}, c={c}, {fn}",
      memory="compressive",
      mem_len=m,
      cmem_len=nc,
      cmem_ratio=c,
      cmem_fn=fn,
  )
  out = [xl("xl", f"XL M={m} (baseline)", m)]
  out += [cm(c, "conv", "") for c in args.ratios]
  out += [cm(top, "max_pool", "_max_pool")]
  out += [
      xl(f"xl_range_c{c}", f"XL M={m + c * nc} (range of c={c})", m + c * nc) for c in args.ratios
  ]
  out += [xl("xl_keys", f"XL M={m + nc} (keys of Nc + M)", m + nc)]
  return out


def _ablation_config():
  spec = importlib.util.spec_from_file_location("ablation_wt2", ABLATION)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("xl")


def make_config(args: argparse.Namespace, variant: dict):
  """The config of one variant: ``configs/ablation_wt2.py:xl`` (optimizer,
  clipping, dropout) with the sizes of ``args``, the variant's memory, eval
  segments of ``tgt_len`` with the variant's ``mem_len``, and batch ``args.batch``.

  Returns:
    ml_collections.ConfigDict.
  """
  c = _ablation_config()
  c.model.update(
      n_layer=args.n_layer,
      d_model=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      tgt_len=args.tgt_len,
      cutoffs=tuple(args.cutoffs),
      div_val=args.div_val,
      tie_projs=(False,) + (True,) * len(args.cutoffs) if args.cutoffs else (),
      memory=variant["memory"],
      mem_len=variant["mem_len"],
  )
  if variant["memory"] == "compressive":  # the XL variants keep the section's defaults
    c.model.compressive.update({k: variant[k] for k in ("cmem_len", "cmem_ratio", "cmem_fn")})
  c.train.update(global_batch=args.batch, batch_chunk=1)
  c.eval.update(
      method="segments",
      tgt_len=args.tgt_len,
      mem_len=variant["mem_len"],
      same_length=args.same_length,
      clamp_len=0,
      global_batch=args.batch,
  )
  return c


def _analysis(compiled) -> dict:
  """XLA's memory analysis of a compiled step, in MiB: {"temp_mib",
  "argument_mib", "output_mib"}, each None where the backend gives none."""
  try:
    a = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 -- an estimate only; the timing goes on
    a = None
  names = {"temp_mib": "temp", "argument_mib": "argument", "output_mib": "output"}
  return {
      k: (None if a is None else getattr(a, f"{n}_size_in_bytes", None) / 2**20)
      for k, n in names.items()
  }


def train_loop(step, state, batches: list) -> Callable[[int], None]:
  """``run(n)``: n calls of ``state, metrics = step(state, batch)`` (the
  train step, state donated) over ``batches`` in turn, the state carried
  from call to call and over runs; each run blocks until its last results
  are ready.  ``run.last`` holds the last call's metrics."""
  import jax

  holder = {"state": state, "i": 0}

  def run(n: int) -> None:
    st, metrics = holder["state"], None
    for _ in range(n):
      st, metrics = step(st, batches[holder["i"] % len(batches)])
      holder["i"] += 1
    jax.block_until_ready((st, metrics))
    holder["state"] = st
    run.last = metrics  # type: ignore[attr-defined]

  return run


def time_interleaved(
    runs: dict, warmup: int, repeats: int, min_repeat_s: float
) -> dict[str, tuple[list, list, int]]:
  """``common.time_interleaved`` that also reads this process's CPU time
  (``time.process_time``: all its threads, XLA:CPU's pool included) around
  each repeat: on a shared CPU the wall time of a repeat includes the time
  other processes held the cores, its CPU time less so.  (On an accelerator
  the CPU time is the host's, not the computation's.)

  Returns:
    {name: (wall seconds of each repeat, CPU seconds of each, steps per repeat)}."""
  steps = {name: common.calibrate(run, warmup, min_repeat_s) for name, run in runs.items()}
  wall: dict = {name: [] for name in runs}
  cpu: dict = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      c0, t0 = time.process_time(), time.perf_counter()
      run(steps[name])
      wall[name].append(time.perf_counter() - t0)
      cpu[name].append(time.process_time() - c0)
  return {name: (wall[name], cpu[name], steps[name]) for name in runs}


def measure(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
  """Compiles and times every variant's train and eval steps (module
  docstring) on the first device.

  Returns:
    {"variants": [``variants``' dicts with "n_params", "state_bytes_per_row"
    (the memory's float32 values per row, bytes), "train" and "eval": each
    ``common.per_token_summary``'s dict plus "temp_mib", "argument_mib",
    "output_mib" (``_analysis``) and, for train, "last_loss" and
    "last_recon" (the last step's cross-entropy and reconstruction loss,
    nats; None without one)}], "ratios": {phase: {variant key: {"tokens_per_sec",
    "state_bytes_per_row", "temp_mib"}: the variant's over the baseline's}},
    "device_peak_mib" (None where the device reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from transformer_xl import default_config, sharding
  from transformer_xl.inference import eval_steps
  from transformer_xl.model import memory as memory_lib
  from transformer_xl.model import models
  from transformer_xl.training import train_state, train_step

  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  rng = np.random.default_rng(args.seed)
  b, t = args.batch, args.tgt_len
  bs, rows = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)
  tokens = [rng.integers(0, args.vocab, (b, t + 1), dtype=np.int32) for _ in range(4)]

  def batches(with_weights: bool) -> list:
    out = []
    for x in tokens:
      batch = {"inputs": x[:, :-1], "targets": x[:, 1:], "reset": np.zeros((b,), bool)}
      shard = {"inputs": bs, "targets": bs, "reset": rows}
      if with_weights:
        batch["weights"], shard["weights"] = np.ones((b, t), np.float32), bs
      out.append(jax.device_put(batch, shard))
    return out

  train_batches, eval_batches = batches(True), batches(False)
  runs, found = {}, []
  for v in variants(args):
    config = make_config(args, v)
    default_config.validate(config, 1)
    train_cfg = default_config.model_config(config, args.vocab)
    model = models.TransformerXL(train_cfg)
    tx = train_state.make_optimizer(config.train, train_cfg)
    _, shardings = train_state.abstract_train_state(model, tx, b, mesh)
    state = train_state.create_train_state(
        model, tx, b, mesh, jax.random.PRNGKey(args.seed), shardings
    )
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    log(f"compiling {v['key']} ({n_params:,} parameters) ...")
    step = train_step.make_train_step(
        model,
        tx,
        mesh,
        shardings,
        1,
        config.train.seed,
        config.train.loss_span,
        config.train.aux_loss_weight,
    )
    train_exe = step.lower(state, train_batches[0]).compile()
    eval_cfg = eval_steps.eval_model_config(config, train_cfg)
    eval_step = eval_steps.make_eval_step(models.TransformerXL(eval_cfg), mesh)
    memory = jax.jit(
        lambda cfg=eval_cfg: memory_lib.init_memory(cfg, b),
        out_shardings=memory_lib.shardings(eval_cfg, mesh),
    )()
    params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), state.params)  # not donated
    eval_exe = eval_step.lower(params, memory, eval_batches[0]).compile()
    mems = state.memory.mems_LxBxMxD
    found.append(
        {
            **v,
            "n_params": n_params,
            "state_bytes_per_row": int(mems.nbytes) // b,
            "state_shape_LxBxMxD": list(mems.shape),
            "train": _analysis(train_exe),
            "eval": _analysis(eval_exe),
        }
    )
    runs[("train", v["key"])] = train_loop(train_exe, state, train_batches)
    runs[("eval", v["key"])] = common.eval_loop(eval_exe, params, memory, eval_batches)
  log("timing ...")
  timed = time_interleaved(runs, args.warmup, args.repeats, args.min_repeat_s)

  base = found[0]["key"]
  for v in found:
    for phase in PHASES:
      times, cpu_times, n = timed[(phase, v["key"])]
      v[phase].update(common.per_token_summary(times, n, b * t))
      v[phase]["cpu_tokens_per_sec"] = b * t * n / statistics.median(cpu_times)
      v[phase]["repeat_cpu_seconds"] = [round(x, 4) for x in cpu_times]
    last = runs[("train", v["key"])].last
    v["train"]["last_loss"] = float(last["loss"])
    recon = last.get(f"aux_loss/{_recon_name()}")
    v["train"]["last_recon"] = None if recon is None else float(recon)
  by_key = {v["key"]: v for v in found}
  ratios = {}
  for phase in PHASES:
    ref = by_key[base]
    ratios[phase] = {
        v["key"]: {
            "tokens_per_sec": v[phase]["tokens_per_sec"] / ref[phase]["tokens_per_sec"],
            "cpu_tokens_per_sec": (
                v[phase]["cpu_tokens_per_sec"] / ref[phase]["cpu_tokens_per_sec"]
            ),
            "state_bytes_per_row": v["state_bytes_per_row"] / ref["state_bytes_per_row"],
            "temp_mib": (
                None
                if v[phase]["temp_mib"] is None or not ref[phase]["temp_mib"]
                else v[phase]["temp_mib"] / ref[phase]["temp_mib"]
            ),
        }
        for v in found
    }
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return {
      "variants": found,
      "ratios": ratios,
      "device_peak_mib": (
          stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None
      ),
  }


def _recon_name() -> str:
  from transformer_xl.model import memory as memory_lib

  return memory_lib.compressive.RECON_LOSS


def machine_info() -> dict:
  """The machine (``common.machine_info``), the commit, its first JAX device
  and the JAX platform ("cpu", "gpu", "tpu"), recorded with the results."""
  import jax

  info = common.machine_info(PACKAGES)
  info.update(common.git_commit())
  info.update(device=str(jax.devices()[0].device_kind), platform=jax.devices()[0].platform)
  return info


def format_table(res: dict) -> str:
  """The table (markdown): one row per variant, its memory slots (Nc + M),
  temporal range (M + c Nc), parameters, state KiB per row, and per step
  tokens/s with its ratio to the baseline's (wall time, and this
  process's CPU time), and XLA's temporaries and arguments (MiB)."""
  out = [
      "| variant | slots Nc+M | range | params | state KiB/row | train tokens/s | train vs XL "
      "| train vs XL, CPU time | train temp / args MiB | eval tokens/s | eval vs XL "
      "| eval vs XL, CPU time | eval temp / args MiB |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  num = lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
  mib = lambda x: "-" if x is None else f"{x:,.1f}"
  base = res["variants"][0]
  for v in res["variants"]:
    slots = v["cmem_len"] + v["mem_len"]
    span = v["mem_len"] + v["cmem_ratio"] * v["cmem_len"]
    cells = [
        v["label"],
        f"{v['cmem_len']}+{v['mem_len']}" if v["cmem_len"] else str(slots),
        str(span),
        f"{v['n_params']:,}",
        f"{v['state_bytes_per_row'] / 1024:,.1f}",
    ]
    for phase in PHASES:
      x, ref = v[phase], base[phase]
      cells += [
          num(x["tokens_per_sec"]),
          f"{x['tokens_per_sec'] / ref['tokens_per_sec']:.3f}x",
          f"{x['cpu_tokens_per_sec'] / ref['cpu_tokens_per_sec']:.3f}x",
          f"{mib(x['temp_mib'])} / {mib(x['argument_mib'])}",
      ]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  try:
    args = parse_args(argv)
  except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  from transformer_xl import default_config

  info = machine_info()
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs; device {info['device']} "
      f"({info['platform']}); load average {' '.join(map(str, info['loadavg_start']))}; "
      f"commit {info['commit'][:12]}",
      flush=True,
  )
  cut = f"adaptive, cutoffs {args.cutoffs}, div_val {args.div_val}" if args.cutoffs else "dense"
  print(
      f"model: {args.n_layer} layers, d_model {args.d_model}, {args.n_head}x{args.d_head} heads, "
      f"d_inner {args.d_inner}, vocab {args.vocab:,} ({cut}), attn_type 0, float32; segments "
      f"of {args.tgt_len}, batch {args.batch}; memory M={args.mem_len}, compressed Nc="
      f"{args.cmem_len} at c in {args.ratios}; eval same_length {args.same_length}",
      flush=True,
  )
  try:
    res = measure(args, log=lambda s: print(s, flush=True))
  except default_config.ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  info["loadavg_end"] = common.loadavg()
  table = format_table(res)
  print()
  print(table)
  print()
  print(
      f"median of {args.repeats} repeats (>= {args.min_repeat_s} s each, all variants and steps "
      f"in turn) after compilation and {args.warmup} warm-up steps; load average "
      f"{info['loadavg_start'][0]} -> {info['loadavg_end'][0]} (1 min); temporaries: XLA's "
      "memory_analysis of each compiled step"
  )
  path = args.json
  if not path:
    folder = (
        tempfile.mkdtemp(prefix="compressive_memory_smoke_") if args.smoke else common.RESULTS_DIR
    )
    path = common.default_json_path(platform.node(), "compressive_memory_", folder)
  common.write_json(path, {"args": vars(args), "machine": info, **res, "table": table})
  return 0


if __name__ == "__main__":
  sys.exit(main())
