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
import os
import sys
from collections.abc import Callable, Sequence

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
import common  # noqa: E402

REPO = common.REPO
if REPO not in sys.path:
  sys.path.insert(0, REPO)
UsageError = common.UsageError

# Each preset: common's model, batch and timing (smoke: one layer), and the memory's sizes.
PRESETS = {
    "default": dict(
        common.DEFAULT_PRESET,
        mem_len=32,
        cmem_len=32,
        ratios="2,4",
    ),
    "smoke": dict(
        common.SMOKE_PRESET,
        n_layer=1,
        mem_len=8,
        cmem_len=4,
        ratios="2",
    ),
}
SIZES = common.MODEL_SIZES + ("mem_len", "cmem_len", "batch", "repeats")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (default, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, sizes < 1, rates < 2 or not dividing
      ``--tgt_len``, cutoffs that are not a comma list of ints.
  """
  p = common.Parser(description=__doc__.split("\n\n")[0])
  common.add_model_flags(p, SIZES)
  p.add_argument("--ratios", help="compression rates c, a comma list (each divides --tgt_len)")
  common.add_timing_flags(p, "compressive_memory")
  args = p.parse_args(argv)
  common.apply_preset(args, PRESETS)
  args.ratios = sorted(set(common.int_list("ratios", args.ratios)))
  common.check_sizes(args, SIZES)
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


def make_config(args: argparse.Namespace, variant: dict):
  """The config of one variant: ``configs/ablation_wt2.py:xl`` (optimizer,
  clipping, dropout) with the sizes of ``args``, the variant's memory, eval
  segments of ``tgt_len`` with the variant's ``mem_len``, and batch ``args.batch``
  (``common.memory_config``).

  Returns:
    ml_collections.ConfigDict.
  """
  c = common.memory_config(args, variant["memory"], variant["mem_len"])
  if variant["memory"] == "compressive":  # the XL variants keep the section's defaults
    c.model.compressive.update({k: variant[k] for k in ("cmem_len", "cmem_ratio", "cmem_fn")})
  return c


def measure(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
  """Compiles and times every variant's train and eval steps (module
  docstring) on the first device (``common.measure_memory_variants``).

  Returns:
    {"variants": [``variants``' dicts with "n_params", "state_bytes_per_row"
    (the memory's float32 values per row, bytes), "state_shape_LxBxMxD",
    "train" and "eval": each ``common.per_token_summary``'s dict plus
    "temp_mib", "argument_mib", "output_mib" (``common.memory_analysis``),
    "cpu_tokens_per_sec", "repeat_cpu_seconds" and, for train, "last_loss"
    and "last_recon" (the last step's cross-entropy and reconstruction loss,
    nats; None without one)}], "ratios": {phase: {variant key:
    {"tokens_per_sec", "cpu_tokens_per_sec", "state_bytes_per_row",
    "temp_mib"}: the variant's over the baseline's}}, "device_peak_mib"
    (None where the device reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
  """

  def describe(v, state, memory):
    mems = state.memory.mems_LxBxMxD
    fields = {
        "state_bytes_per_row": int(mems.nbytes) // args.batch,
        "state_shape_LxBxMxD": list(mems.shape),
    }
    return state, memory, fields

  def finish(v, train_run, eval_run):
    recon = train_run.last.get(f"aux_loss/{_recon_name()}")
    v["train"]["last_recon"] = None if recon is None else float(recon)

  return common.measure_memory_variants(args, variants(args), make_config, describe, finish, log)


def _recon_name() -> str:
  from transformer_xl.model import memory as memory_lib

  return memory_lib.compressive.RECON_LOSS


def format_table(res: dict) -> str:
  """The table (markdown): one row per variant, its memory slots (Nc + M),
  temporal range (M + c Nc), parameters, state KiB per row, and per step
  tokens/s with its ratio to the baseline's (wall time, and this
  process's CPU time), and XLA's temporaries and arguments (MiB)."""
  out = [
      "| variant | slots Nc+M | range | params | state KiB/row " + common.PHASE_COLUMNS,
      "|---|---:|---:|---:|---:|" + common.PHASE_ALIGN,
  ]
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
    out.append("| " + " | ".join(cells + common.phase_cells(v, base)) + " |")
  return "\n".join(out)


def _model_line(args: argparse.Namespace) -> str:
  return (
      common.model_description(args) + "; "
      f"memory M={args.mem_len}, compressed Nc="
      f"{args.cmem_len} at c in {args.ratios}; eval same_length {args.same_length}"
  )


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  return common.memory_benchmark_main(
      argv, parse_args, _model_line, measure, format_table, "compressive_memory"
  )


if __name__ == "__main__":
  sys.exit(main())
