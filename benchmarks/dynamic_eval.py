"""The cost of dynamic evaluation (Krause et al. 2019) in tokens/s against static evaluation.

Run from the repository root::

  python benchmarks/dynamic_eval.py [--batch=10] [--n_layer=4 --d_model=128 ...] [--json=FILE]
  python benchmarks/dynamic_eval.py --paper    # wt103_large's model and the authors' wt103
                                               # lengths: for an accelerator
  python benchmarks/dynamic_eval.py --smoke    # a tiny model, seconds (tests)

Dynamic evaluation (``transformer_xl/inference/dynamic_eval.py``) scores
each evaluation segment and then updates the parameters with that
segment's gradient: a forward, a backward and the update per segment, one
segment after the other, instead of static evaluation's forward.  Here,
with one model (the same random parameters, float32), on the same device,
in one run, five jitted steps are timed:

* (a) **static, batch B**: ``eval_steps.make_eval_step`` (the step of
  ``evaluate.Evaluator``), B rows (default 10, the reference's
  ``eval_batch_size``, ``eval.global_batch``);
* (b) **static, batch 1**;
* (c) **dynamic update, batch 1** (the authors' setting,
  ``eval.dynamic.global_batch = 1``): ``DynamicEvaluator.make_step("update")``,
  score, gradient and update fused (rule ``--rule``, default "rms");
* (d) **dynamic update, batch B**: B rows sharing one update per segment;
* (e) **statistics, batch 1**: ``make_step("stats")``, the pass that sums
  the squared gradients before dynamic evaluation ("rms" only needs it).

Every step scores B x tgt_len tokens and runs on segments of ``--tgt_len``
with a memory of ``--mem_len`` (``same_length``, ``clamp_len``: the eval
model of ``eval_steps.eval_model_config``).  Reported: tokens/s of each and
the ratios (c)/(b), (d)/(a) and (c)/(a) of tokens/s (below 1: dynamic
evaluation is slower), and (e)/(b).  Memory: the parameter count and bytes,
and the parameters-sized state of dynamic evaluation, 4 x the parameter
bytes (the loaded parameters, the adapted ones, ``ss`` and ``m``, all
float32: computed, not measured); XLA's estimate of each compiled step's
temporaries (``memory_analysis``; the activations, a training step's for
the dynamic steps); and on an accelerator the device's peak bytes in use
over the whole run (all five steps' states are alive together).

Timing (as ``eval_speed.py``, ``common.py``): inputs are random token ids
placed on the device before timing (no input pipeline is timed); the
memory (and the dynamic state: parameters, ``m``, ``ss``) is carried from
step to step, donated as in evaluation; each step is compiled and run
``--warmup`` times outside the timed region; the fastest of three single
steps sets the steps per repeat (a repeat lasts about ``--min_repeat_s``,
less where a single step's own overhead made it look slower); then ``--repeats`` repeats of each step, taken in turn
(repeat 1 of (a) to (e), then repeat 2, ...: a change of load on a shared
machine reaches all five alike), each ending with ``jax.block_until_ready``
on the outputs; the median over repeats.  The update steps start from
statistics of a few untimed statistics steps (``--stats_steps``), so that
their update has the scale it has in use; the random parameters and tokens
make the numbers' values meaningless, not their speed.  The JSON (by
default ``benchmarks/results/dynamic_eval_<date>_<time>_<host>.json``;
``--smoke``: a temporary directory) holds the settings, the machine (CPU
or device, load average before and after, versions, commit) and every
number.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
import common  # noqa: E402

REPO = common.REPO
if REPO not in sys.path:
  sys.path.insert(0, REPO)
PACKAGES = ("jax", "jaxlib", "flax", "numpy")  # versions saved with the results

# The steps timed, in the order of the table: (key, label, batch "B" or "1", kind).
STEPS = (
    ("static_b", "(a) static", "B", "static"),
    ("static_1", "(b) static", "1", "static"),
    ("update_1", "(c) dynamic update", "1", "update"),
    ("update_b", "(d) dynamic update", "B", "update"),
    ("stats_1", "(e) statistics pass", "1", "stats"),
)
# The ratios of tokens/s reported: name -> (numerator, denominator).
RATIOS = {
    "update_1/static_1": ("update_1", "static_1"),  # (c)/(b): the authors' batch, both at 1
    "update_b/static_b": ("update_b", "static_b"),  # (d)/(a): both at B
    "update_1/static_b": ("update_1", "static_b"),  # (c)/(a): the authors' setting vs static's
    "stats_1/static_1": ("stats_1", "static_1"),  # (e)/(b)
}

# Model, lengths and timing of each preset; flags given explicitly override them.
PRESETS = {
    # configs/quickstart.py's model and eval lengths, PTB's vocabulary (dense softmax).
    "cpu": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        d_head=32,
        d_inner=512,
        vocab=10_000,
        cutoffs="",
        div_val=1,
        tgt_len=32,
        mem_len=128,
        clamp_len=0,
        batch=10,
        repeats=5,
        min_repeat_s=1.0,
    ),
    # configs/wt103_large.py (285,170,506 parameters, adaptive input and softmax) with its eval
    # lengths, which are the authors' wt103 dynamic-evaluation lengths.
    "paper": dict(
        n_layer=18,
        d_model=1024,
        n_head=16,
        d_head=64,
        d_inner=4096,
        vocab=267_735,
        cutoffs="20000,40000,200000",
        div_val=4,
        tgt_len=128,
        mem_len=1600,
        clamp_len=1000,
        batch=10,
        repeats=5,
        min_repeat_s=2.0,
    ),
    "smoke": dict(
        n_layer=1,
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=64,
        vocab=64,
        cutoffs="",
        div_val=1,
        tgt_len=8,
        mem_len=16,
        clamp_len=0,
        batch=2,
        repeats=3,
        min_repeat_s=0.1,
    ),
}
SIZES = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab", "div_val", "tgt_len")
SIZES += ("batch", "repeats")


class UsageError(ValueError):
  """Bad command-line input; printed as one ``error: ...`` line."""


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    raise UsageError(message)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (cpu, --paper, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, bad values (sizes < 1, negative lengths or
      rates, cutoffs that are not a comma list of ints).
  """
  p = _Parser(description=__doc__.split("\n\n")[0])
  p.add_argument(
      "--paper",
      action="store_true",
      help="wt103_large's model (285M parameters) at tgt_len 128, mem_len 1600: an accelerator",
  )
  p.add_argument("--smoke", action="store_true", help="tiny model (seconds)")
  for name in SIZES + ("mem_len", "clamp_len"):
    p.add_argument(f"--{name}", type=int)
  p.add_argument("--cutoffs", help="adaptive softmax cutoffs, a comma list ('' = dense)")
  p.add_argument(
      "--same_length",
      action=argparse.BooleanOptionalAction,
      default=True,
      help="eval same_length (default on, as every config's eval)",
  )
  p.add_argument("--rule", default="rms", choices=("rms", "sgd"), help="the update rule")
  p.add_argument("--lr", type=float, default=1e-5, help="dynamic evaluation's learning rate")
  p.add_argument("--decay", type=float, default=0.001, help='"rms": decay toward the loaded')
  p.add_argument("--eps", type=float, default=1e-4, help='"rms": added to sqrt(ss)')
  p.add_argument("--stats_steps", type=int, default=4, help="untimed steps giving the ss used")
  p.add_argument("--min_repeat_s", type=float, help="seconds per timed repeat (about)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
      "--json",
      default="",
      help="write arguments, machine and results here (default: benchmarks/results/"
      "dynamic_eval_<date>_<time>_<host>.json; --smoke: a temporary directory)",
  )
  args = p.parse_args(argv)
  if args.paper and args.smoke:
    raise UsageError("--paper and --smoke exclude each other.")
  preset = PRESETS["paper" if args.paper else "smoke" if args.smoke else "cpu"]
  for k, v in preset.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  try:
    args.cutoffs = [int(s) for s in str(args.cutoffs).split(",") if s.strip()]
  except ValueError:
    raise UsageError(f"--cutoffs={args.cutoffs!r}: expected a comma list of ints.") from None
  bad = [f"--{k}" for k in SIZES if getattr(args, k) < 1]
  bad += [
      f"--{k}" for k in ("mem_len", "clamp_len", "warmup", "stats_steps") if getattr(args, k) < 0
  ]
  bad += [f"--{k}" for k in ("lr", "decay") if not getattr(args, k) >= 0]
  bad += [f"--{k}" for k in ("eps", "min_repeat_s") if not getattr(args, k) > 0]
  if bad:
    raise UsageError(
        f"{', '.join(bad)}: sizes, --batch and --repeats must be >= 1, lengths, --warmup "
        "and --stats_steps >= 0, --lr and --decay >= 0, --eps and --min_repeat_s > 0."
    )
  return args


def make_config(args: argparse.Namespace):
  """The config of ``args``: the model (attn_type 0, no dropout, float32; with
  cutoffs, tie_projs (False, True, ...) as WikiText-103's configs), eval
  segments of tgt_len with a memory of mem_len, ``args.batch`` rows, and
  dynamic evaluation's settings (batch 1 as the authors).

  Returns:
    ml_collections.ConfigDict (``default_config.get_config()`` updated).
  """
  from transformer_xl import default_config

  c = default_config.get_config()
  c.model.update(
      n_layer=args.n_layer,
      d_model=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=args.tgt_len,
      mem_len=args.tgt_len,
      cutoffs=tuple(args.cutoffs),
      div_val=args.div_val,
      tie_weight=True,
      tie_projs=(False,) + (True,) * len(args.cutoffs) if args.cutoffs else (),
      attn_type=0,
  )
  c.eval.update(
      method="segments",
      tgt_len=args.tgt_len,
      mem_len=args.mem_len,
      same_length=args.same_length,
      clamp_len=args.clamp_len,
      global_batch=args.batch,
  )
  c.eval.dynamic.update(rule=args.rule, lr=args.lr, decay=args.decay, eps=args.eps, global_batch=1)
  return c


def dynamic_loop(step, state, memory, batches: list, weights_BxT) -> Callable[[int], None]:
  """``run(n)``: n calls of ``nll, state, memory = step(state, memory, batch,
  weights_BxT)`` (``DynamicEvaluator.make_step``'s step, state and memory
  donated) over ``batches`` in turn, the state and memory carried from call
  to call and over runs; each run blocks until its last results are ready.
  ``run.last`` holds the last call's outputs (nll_BxT, state, memory)."""
  import jax

  holder = {"state": state, "memory": memory, "i": 0}

  def run(n: int) -> None:
    st, mem, nll = holder["state"], holder["memory"], None
    for _ in range(n):
      nll, st, mem = step(st, mem, batches[holder["i"] % len(batches)], weights_BxT)
      holder["i"] += 1
    jax.block_until_ready((nll, st, mem))
    holder["state"], holder["memory"] = st, mem
    run.last = (nll, st, mem)  # type: ignore[attr-defined]

  return run


def _temp_mib(fn, *args) -> float | None:
  """XLA's estimate of a jitted step's temporary memory (MiB) at these
  arguments (``compiled.memory_analysis()``; a second compilation, nothing
  is run or donated); None where the backend gives none."""
  try:
    analysis = fn.lower(*args).compile().memory_analysis()
  except Exception:  # noqa: BLE001 -- an estimate only; the timing goes on
    return None
  return None if analysis is None else analysis.temp_size_in_bytes / 2**20


def measure(args: argparse.Namespace) -> dict:
  """Times the five steps (module docstring) on the first device with the
  same random parameters (float32).

  Returns:
    {"model": {"n_params", "param_bytes", "param_mib", "dynamic_state_bytes"
    and "dynamic_state_mib" (4 x the parameters', computed), "tgt_len", "mem_len", "clamp_len", "same_length"},
    "settings": the dynamic settings, "results": {key of ``STEPS``:
    {"batch", "median_s_per_token" (seconds per scored token),
    "tokens_per_sec", "ms_per_segment", "steps_per_repeat",
    "tokens_per_step", "repeat_seconds", "s_per_token", "temp_mib" (XLA's
    estimate or None), "last_nll_finite"}}, "ratios": {name of ``RATIOS``:
    tokens/s over tokens/s}, "device_peak_mib" (the device's peak in use,
    or None where it reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes or lengths the config validation
      rejects.
  """
  import flax.linen as nn
  import jax
  import numpy as np

  from transformer_xl import default_config, sharding
  from transformer_xl.inference import dynamic_eval, eval_steps, evaluate
  from transformer_xl.model import memory as memory_lib
  from transformer_xl.model import models

  config = make_config(args)
  default_config.validate(config, 1)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  train_cfg = default_config.model_config(config, args.vocab)
  params = nn.unbox(
      models.init_params(models.TransformerXL(train_cfg), jax.random.PRNGKey(args.seed))
  )
  params = jax.device_put(params, sharding.replicated(mesh))
  leaves = jax.tree_util.tree_leaves(params)
  n_params = sum(int(np.prod(x.shape)) for x in leaves)
  param_bytes = sum(int(x.nbytes) for x in leaves)

  evaluator = evaluate.Evaluator(config, train_cfg, None, mesh)
  settings = dynamic_eval.DynamicSettings.from_config(config)
  dyn = dynamic_eval.DynamicEvaluator(evaluator, settings)
  ecfg = evaluator.cfg
  static_step = eval_steps.make_eval_step(evaluator.model, mesh)
  update_step = dyn.make_step("update", params)
  stats_step = dyn.make_step("stats", params)

  rng = np.random.default_rng(args.seed)
  t = args.tgt_len
  bs, rows = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)
  mem_sharding = memory_lib.shardings(ecfg, mesh)

  def batches(b: int) -> list:
    return [
        jax.device_put(
            {
                "inputs": rng.integers(0, args.vocab, (b, t), dtype=np.int32),
                "targets": rng.integers(0, args.vocab, (b, t), dtype=np.int32),
                "reset": np.zeros((b,), bool),
            },
            {"inputs": bs, "targets": bs, "reset": rows},
        )
        for _ in range(4)
    ]

  def memory(b: int):
    return jax.jit(lambda: memory_lib.init_memory(ecfg, b), out_shardings=mem_sharding)()

  sizes = {"B": args.batch, "1": 1}
  data = {k: batches(b) for k, b in sizes.items()}
  weights = {k: jax.device_put(np.ones((b, t), np.float32), bs) for k, b in sizes.items()}

  # The statistics the update steps start from: a few untimed statistics steps.
  warm = dynamic_loop(
      stats_step, dyn.initial_state(params, None), memory(1), data["1"], weights["1"]
  )
  if args.stats_steps:
    warm(args.stats_steps)
    ss = warm.last[1].ss  # type: ignore[attr-defined]
  else:
    ss = None
  runs, temp = {}, {}
  for key, _, size, kind in STEPS:
    mem = memory(sizes[size])
    if kind == "static":
      temp[key] = _temp_mib(static_step, params, mem, data[size][0])
      runs[key] = common.eval_loop(static_step, params, mem, data[size])
    else:
      step = update_step if kind == "update" else stats_step
      state = dyn.initial_state(params, ss if kind == "update" else None)
      temp[key] = _temp_mib(step, state, mem, data[size][0], weights[size])
      runs[key] = dynamic_loop(step, state, mem, data[size], weights[size])
  del warm
  timed = common.time_interleaved(runs, args.warmup, args.repeats, args.min_repeat_s)

  results = {}
  for key, _, size, kind in STEPS:
    times, n = timed[key]
    r = common.per_token_summary(times, n, sizes[size] * t)
    r["batch"] = sizes[size]
    r["ms_per_segment"] = r["median_s_per_token"] * sizes[size] * t * 1e3
    r["temp_mib"] = temp[key]
    if kind != "static":
      r["last_nll_finite"] = bool(np.all(np.isfinite(np.asarray(runs[key].last[0]))))
    results[key] = r
  ratios = {
      name: results[num]["tokens_per_sec"] / results[den]["tokens_per_sec"]
      for name, (num, den) in RATIOS.items()
  }
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return {
      "model": {
          "n_params": n_params,
          "param_bytes": param_bytes,
          "param_mib": param_bytes / 2**20,
          "dynamic_state_bytes": 4 * param_bytes,
          "dynamic_state_mib": 4 * param_bytes / 2**20,
          "tgt_len": ecfg.tgt_len,
          "mem_len": ecfg.mem_len,
          "clamp_len": ecfg.clamp_len,
          "same_length": ecfg.same_length,
      },
      "settings": settings.to_json(),
      "results": results,
      "ratios": ratios,
      "device_peak_mib": (
          stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None
      ),
  }


def machine_info() -> dict:
  """The machine (``common.machine_info``), the commit, its first JAX device
  and the JAX platform ("cpu", "gpu", "tpu"), recorded with the results."""
  import jax

  info = common.machine_info(PACKAGES)
  info.update(common.git_commit())
  info.update(device=str(jax.devices()[0].device_kind), platform=jax.devices()[0].platform)
  return info


def format_table(res: dict, batch: int) -> str:
  """The table (markdown): one row per step of ``STEPS``, its rows, tokens/s,
  ms per segment, tokens/s as a share of static evaluation's at batch 1 and
  at batch ``batch``, and XLA's estimate of its temporaries."""
  out = [
      "| step | rows | tokens/s | ms per segment | vs static, 1 row | "
      f"vs static, {batch} rows | temporaries MiB (XLA) |",
      "|---|---:|---:|---:|---:|---:|---:|",
  ]
  num = lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
  r = res["results"]
  for key, label, _, _ in STEPS:
    x = r[key]
    temp = "-" if x["temp_mib"] is None else f"{x['temp_mib']:,.1f}"
    out.append(
        f"| {label} | {x['batch']} | {num(x['tokens_per_sec'])} | {x['ms_per_segment']:.2f} | "
        f"{x['tokens_per_sec'] / r['static_1']['tokens_per_sec']:.3f}x | "
        f"{x['tokens_per_sec'] / r['static_b']['tokens_per_sec']:.3f}x | {temp} |"
    )
  return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  from transformer_xl import default_config

  try:
    args = parse_args(argv)
  except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  info = machine_info()
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs; device {info['device']} "
      f"({info['platform']}); load average {' '.join(map(str, info['loadavg_start']))}; "
      f"commit {info['commit'][:12]}",
      flush=True,
  )
  cut = f"adaptive softmax {args.cutoffs}, div_val {args.div_val}" if args.cutoffs else "dense"
  print(
      f"model: {args.n_layer} layers, d_model {args.d_model}, {args.n_head}x{args.d_head} "
      f"heads, d_inner {args.d_inner}, vocab {args.vocab:,} ({cut} softmax), attn_type 0, "
      f"float32; eval segments of {args.tgt_len}, memory {args.mem_len}, clamp_len "
      f"{args.clamp_len}, same_length {args.same_length}; batch B = {args.batch}; dynamic "
      f"rule {args.rule} (lr {args.lr}, decay {args.decay}, eps {args.eps})",
      flush=True,
  )
  try:
    res = measure(args)
  except default_config.ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  info["loadavg_end"] = common.loadavg()
  table = format_table(res, args.batch)
  print()
  print(table)
  print()
  ra = res["ratios"]
  print(
      f"tokens/s ratios: (c)/(b) dynamic/static at 1 row {ra['update_1/static_1']:.3f} "
      f"({1 / ra['update_1/static_1']:.2f}x slower); (d)/(a) at {args.batch} rows "
      f"{ra['update_b/static_b']:.3f} ({1 / ra['update_b/static_b']:.2f}x slower); (c)/(a) "
      f"the authors' 1 row against static's {args.batch} {ra['update_1/static_b']:.3f} "
      f"({1 / ra['update_1/static_b']:.2f}x slower); (e)/(b) statistics "
      f"{ra['stats_1/static_1']:.3f}"
  )
  m = res["model"]
  peak = res["device_peak_mib"]
  print(
      f"parameters: {m['n_params']:,} ({m['param_mib']:,.1f} MiB float32); dynamic "
      f"evaluation's parameters-sized state 4 x that = {m['dynamic_state_mib']:,.1f} MiB "
      f"(computed); device peak in use "
      f"{'not reported' if peak is None else f'{peak:,.0f} MiB (the whole run)'}"
  )
  print(
      f"median of {args.repeats} repeats (>= {args.min_repeat_s} s each, the steps in turn) "
      f"after compilation and {args.warmup} warm-up steps; load average "
      f"{info['loadavg_start'][0]} -> {info['loadavg_end'][0]} (1 min)"
  )
  if not all(r.get("last_nll_finite", True) for r in res["results"].values()):
    print("warning: a dynamic step's last NLL is not finite (random model; --lr lower?)")
  path = args.json
  if not path:
    folder = tempfile.mkdtemp(prefix="dynamic_eval_smoke_") if args.smoke else common.RESULTS_DIR
    path = common.default_json_path(platform.node(), "dynamic_eval_", folder)
  common.write_json(path, {"args": vars(args), "machine": info, **res, "table": table})
  return 0


if __name__ == "__main__":
  sys.exit(main())
