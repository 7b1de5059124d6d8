"""Evaluation speed: Transformer-XL's state reuse against the vanilla Transformer (Table 9).

Run from the repository root::

  python benchmarks/eval_speed.py [--attn_lens=128,256,512,1024] [--json=FILE]
  python benchmarks/eval_speed.py --paper      # 800,1800,2800,3800 and a 12-layer model:
                                               # for an accelerator
  python benchmarks/eval_speed.py --smoke      # a tiny model, two lengths, seconds (tests)

Dai et al. 2019, Sec. 4.5 and Table 9, time the evaluation of the vanilla
Transformer of Al-Rfou et al. (2018) against Transformer-XL's at the same
attention length L, per scored token on one GPU: the vanilla model scores
each token with a fresh forward pass over the L tokens before it (a window
that slides by one token), Transformer-XL scores a whole segment per pass and
reuses the cached hidden states of the previous segments.  The paper: L =
3,800: 1,874x slower; 2,800: 1,409x; 1,800: 773x; 800: 363x.

Here, for each L, with the same model (same parameters), the same batch, on
the same device, in one run:

* **Transformer-XL**: ``eval_steps.make_eval_step`` (the step of
  ``evaluate.Evaluator`` with ``eval.method="segments"``) on segments of
  ``--tgt_len`` tokens with a memory of L - tgt_len (``same_length`` off, so
  the keys of a segment are exactly the L positions of memory and segment),
  the memory carried from step to step (state reuse).  Scored tokens per
  step: batch * tgt_len.
* **vanilla**: ``eval_steps.make_window_step`` (the step of the Evaluator with
  ``eval.method="sliding"``, ``eval.window`` = L, ``eval.stride`` = 1): each
  row a fresh window of L tokens, no memory; one scored token per row, i.e.
  batch per step.  (The step computes the softmax at all L positions and the
  Evaluator keeps the last; the reference computes only the last: at the
  default vocabulary of 256 that is a few percent of the step.)  The reference
  implementation (kimiyoung/transformer-xl) evaluates the vanilla model
  with tgt_len = 1, mem_len = 0 and L - 1 tokens of extended context: the same windows
  (``data.SlidingWindowIterator``).

Timing: inputs are random token ids placed on the device before timing (no
input pipeline is timed); each step is compiled and run ``--warmup`` times
outside the timed region; the fastest of three single timed steps sets the
number of steps per repeat (so that a repeat lasts at least ``--min_repeat_s``
seconds); then ``--repeats`` repeats, each ending with
``jax.block_until_ready`` on the outputs.  Reported:
the median over repeats of the time per scored token, tokens/s, and the
slowdown = vanilla time per token / Transformer-XL time per token.  The
table prints the paper's ratios beside ours; ``--json`` saves everything
with the machine (CPU or device, load average, versions).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
import common  # noqa: E402

REPO = common.REPO
if REPO not in sys.path:
  sys.path.insert(0, REPO)
PACKAGES = ("jax", "jaxlib", "flax", "numpy")  # versions saved with the results

# Table 9 of Dai et al. 2019: attention length -> how much slower Al-Rfou et al. is.
PAPER_SLOWDOWN = {3800: 1874, 2800: 1409, 1800: 773, 800: 363}

# Model and lengths of each preset; flags given explicitly override them.
PRESETS = {
    "cpu": dict(
        attn_lens="128,256,512,1024",
        n_layer=4,
        d_model=128,
        n_head=4,
        d_head=32,
        d_inner=512,
        vocab=256,
        tgt_len=32,
        batch=8,
        repeats=5,
        min_repeat_s=1.0,
    ),
    # enwik8's 12-layer model (configs/enwik8_12l.py) with its vocabulary; Table 9's lengths.
    "paper": dict(
        attn_lens="800,1800,2800,3800",
        n_layer=12,
        d_model=512,
        n_head=8,
        d_head=64,
        d_inner=2048,
        vocab=256,
        tgt_len=128,
        batch=8,
        repeats=5,
        min_repeat_s=2.0,
    ),
    "smoke": dict(
        attn_lens="32,384",
        n_layer=1,
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=64,
        vocab=32,
        tgt_len=8,
        batch=2,
        repeats=3,
        min_repeat_s=0.2,
    ),
}


class UsageError(ValueError):
  """Bad command-line input; printed as one ``error: ...`` line."""


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    raise UsageError(message)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (cpu, --paper, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, bad values (lengths not > tgt_len, sizes < 1).
  """
  p = _Parser(description=__doc__.split("\n\n")[0])
  p.add_argument(
      "--paper",
      action="store_true",
      help="Table 9's lengths 800,1800,2800,3800 and a 12-layer d_model 512 model",
  )
  p.add_argument("--smoke", action="store_true", help="tiny model, two lengths (seconds)")
  p.add_argument("--attn_lens", help="comma list of attention lengths L")
  for name in (
      "n_layer",
      "d_model",
      "n_head",
      "d_head",
      "d_inner",
      "vocab",
      "tgt_len",
      "batch",
      "repeats",
  ):
    p.add_argument(f"--{name}", type=int)
  p.add_argument("--min_repeat_s", type=float, help="seconds per timed repeat (at least)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write arguments, machine and results here")
  args = p.parse_args(argv)
  if args.paper and args.smoke:
    raise UsageError("--paper and --smoke exclude each other.")
  preset = PRESETS["paper" if args.paper else "smoke" if args.smoke else "cpu"]
  for k, v in preset.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  try:
    args.attn_lens = [int(s) for s in str(args.attn_lens).split(",") if s.strip()]
  except ValueError:
    raise UsageError(f"--attn_lens={args.attn_lens!r}: expected a comma list of ints.") from None
  sizes = (
      "n_layer",
      "d_model",
      "n_head",
      "d_head",
      "d_inner",
      "vocab",
      "tgt_len",
      "batch",
      "repeats",
  )
  bad = [k for k in sizes if getattr(args, k) < 1]
  if bad or args.warmup < 0 or not args.min_repeat_s > 0:
    raise UsageError(
        f"{', '.join('--' + k for k in bad) or '--warmup/--min_repeat_s'} must be positive."
    )
  if not args.attn_lens or any(L <= args.tgt_len for L in args.attn_lens):
    raise UsageError(
        f"every attention length must exceed --tgt_len={args.tgt_len} (the memory "
        f"is L - tgt_len); got {args.attn_lens}."
    )
  return args


def make_config(args: argparse.Namespace, attn_len: int):
  """The config of one attention length L (tokens): the model of ``args``
  (attn_type 0, a dense softmax, no dropout), eval segments of tgt_len with a
  memory of L - tgt_len (no same_length), and a sliding window of L with
  stride 1, ``args.batch`` rows / windows for both (Sec. 4.5, Table 9).

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
      cutoffs=(),
      attn_type=0,
  )
  c.eval.update(
      method="segments",
      tgt_len=args.tgt_len,
      mem_len=attn_len - args.tgt_len,
      same_length=False,
      clamp_len=0,
      window=attn_len,
      stride=1,
      global_batch=args.batch,
  )
  return c


def measure(args: argparse.Namespace, attn_len: int) -> dict:
  """Times both evaluations at one attention length L (tokens) on the first
  device, with the same random parameters (float32).

  Returns:
    {"attn_len", "tgt_len", "mem_len", "same_length", "window", "n_params",
     "xl" and "vanilla": {"median_s_per_token" (seconds per scored token),
     "tokens_per_sec", "steps_per_repeat", "tokens_per_step",
     "repeat_seconds", "s_per_token"}, "slowdown" (vanilla seconds per
     token / Transformer-XL's), "paper_slowdown" (Table 9, or None)}.

  Raises:
    default_config.ConfigError: model sizes or lengths that the config
      validation rejects.
  """
  import flax.linen as nn
  import jax
  import numpy as np

  from transformer_xl import default_config, sharding
  from transformer_xl.inference import eval_steps
  from transformer_xl.model import memory as memory_lib
  from transformer_xl.model import models

  config = make_config(args, attn_len)
  default_config.validate(config, 1)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  train_cfg = default_config.model_config(config, args.vocab)
  params = nn.unbox(
      models.init_params(models.TransformerXL(train_cfg), jax.random.PRNGKey(args.seed))
  )
  params = jax.device_put(params, sharding.replicated(mesh))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  rng = np.random.default_rng(args.seed)
  b, t = args.batch, args.tgt_len
  bs, rows = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)

  # Transformer-XL: segments of tgt_len, memory L - tgt_len, carried.
  ecfg = eval_steps.eval_model_config(config, train_cfg)
  xl_step = eval_steps.make_eval_step(models.TransformerXL(ecfg), mesh)
  xl_batches = [
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
  init_memory = jax.jit(
      lambda: memory_lib.init_memory(ecfg, b), out_shardings=memory_lib.shardings(ecfg, mesh)
  )
  run_xl = common.eval_loop(xl_step, params, init_memory(), xl_batches)

  # Vanilla: a fresh window of L tokens per scored token.
  wcfg = eval_steps.window_model_config(config, train_cfg)
  assert wcfg.tgt_len == attn_len and wcfg.mem_len == 0
  window_step = eval_steps.make_window_step(models.TransformerXL(wcfg), mesh, config.eval.stride)
  win_batches = [
      jax.device_put(
          {
              "inputs": rng.integers(0, args.vocab, (b, attn_len), dtype=np.int32),
              "targets": rng.integers(0, args.vocab, (b, attn_len), dtype=np.int32),
              "front_pad": np.zeros((b,), np.int32),
          },
          {"inputs": bs, "targets": bs, "front_pad": rows},
      )
      for _ in range(2)
  ]
  wstate = {"i": 0}

  def run_window(n):
    nll = None
    for _ in range(n):
      nll = window_step(params, win_batches[wstate["i"] % len(win_batches)])
      wstate["i"] += 1
    jax.block_until_ready(nll)

  xl_times, xl_n = common.time_repeats(run_xl, args.warmup, args.repeats, args.min_repeat_s)
  win_times, win_n = common.time_repeats(run_window, args.warmup, args.repeats, args.min_repeat_s)
  xl = common.per_token_summary(xl_times, xl_n, b * t)
  vanilla = common.per_token_summary(win_times, win_n, b)  # stride 1: one scored token per window
  return {
      "attn_len": attn_len,
      "tgt_len": ecfg.tgt_len,
      "mem_len": ecfg.mem_len,
      "same_length": ecfg.same_length,
      "window": wcfg.tgt_len,
      "n_params": n_params,
      "xl": xl,
      "vanilla": vanilla,
      "slowdown": vanilla["median_s_per_token"] / xl["median_s_per_token"],
      "paper_slowdown": PAPER_SLOWDOWN.get(attn_len),
  }


def machine_info() -> dict:
  """The machine (``common.machine_info``), its first JAX device and the JAX
  platform ("cpu", "gpu", "tpu"), recorded with the results."""
  import jax

  info = common.machine_info(PACKAGES)
  info.update(device=str(jax.devices()[0].device_kind), platform=jax.devices()[0].platform)
  return info


def format_table(rows: list) -> str:
  """The slowdown table (markdown): one row per L (``measure``'s dicts),
  scored tokens/s of both, our slowdown and Table 9's (Dai et al. 2019)."""
  out = [
      "| attn len L | Transformer-XL tokens/s (tgt_len, mem L - tgt_len) | vanilla tokens/s "
      "(window L, stride 1) | slowdown (ours) | slowdown (paper, Table 9) |",
      "|---:|---:|---:|---:|---:|",
  ]
  num = lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.1f}"
  for r in rows:
    paper = f"{r['paper_slowdown']:,}x" if r["paper_slowdown"] else "-"
    out.append(
        f"| {r['attn_len']:,} | {num(r['xl']['tokens_per_sec'])} ({r['tgt_len']}, "
        f"{r['mem_len']:,}) | {num(r['vanilla']['tokens_per_sec'])} | "
        f"{num(r['slowdown'])}x | {paper} |"
    )
  return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  try:
    args = parse_args(argv)
  except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  info = machine_info()
  print(
      f"{info['date']}  {info['cpu']}, {info['cpu_count']} CPUs; device {info['device']} "
      f"({info['platform']}); load average {' '.join(map(str, info['loadavg_start']))}",
      flush=True,
  )
  print(
      f"model: {args.n_layer} layers, d_model {args.d_model}, {args.n_head}x{args.d_head} "
      f"heads, d_inner {args.d_inner}, vocab {args.vocab} (dense softmax), attn_type 0, "
      f"float32; batch {args.batch}; Transformer-XL segments of {args.tgt_len}",
      flush=True,
  )
  rows = []
  for L in args.attn_lens:
    r = measure(args, L)
    rows.append(r)
    print(
        f"  L={L:,}: Transformer-XL {r['xl']['median_s_per_token'] * 1e3:.4f} ms/token "
        f"({r['xl']['steps_per_repeat']} steps/repeat), vanilla "
        f"{r['vanilla']['median_s_per_token'] * 1e3:.3f} ms/token "
        f"({r['vanilla']['steps_per_repeat']} steps/repeat): {r['slowdown']:,.1f}x",
        flush=True,
    )
  info["loadavg_end"] = common.loadavg()
  table = format_table(rows)
  print()
  print(table)
  print()
  print(
      "paper (Dai et al. 2019, Table 9, per-token time on one GPU): "
      + "; ".join(f"{L:,}: {s:,}x" for L, s in sorted(PAPER_SLOWDOWN.items(), reverse=True))
  )
  print(
      f"parameters: {rows[0]['n_params']:,}; median of {args.repeats} repeats (>= "
      f"{args.min_repeat_s} s each) after compilation and {args.warmup} warm-up steps; load "
      f"average {info['loadavg_start'][0]} -> {info['loadavg_end'][0]} (1 min)"
  )
  if args.json:
    common.write_json(
        args.json, {"args": vars(args), "machine": info, "rows": rows, "table": table}
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
