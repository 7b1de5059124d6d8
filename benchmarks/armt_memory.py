"""The cost of the associative memory (ARMT, Rodkin et al. 2024) against Transformer-XL's and the memory tokens'.

Run from the repository root::

  python benchmarks/armt_memory.py [--num_mem_tokens=10 --d_mem=16,64 --mem_backprop_depth=1]
                                   [--mem_len=32] [--n_layer=4 --d_model=128 ... --batch=16]
                                   [--json=F]
  python benchmarks/armt_memory.py --smoke    # a tiny model, seconds (tests)

The associative memory (``model.memory="armt"``,
``transformer_xl/model/memory/armt.py``, ``AssociativeMemory``;
docs/guide/armt.md) appends N = ``num_mem_tokens`` learned memory tokens to
every segment (the layers run on T + N positions) and gives every layer a
matrix A [d_key, d_model] and a normaliser z [d_key], d_key = 6 d_mem
(DPFP features, nu = 3): every position reads ``phi(h W_q) A / (phi(h W_q)
. z)`` before the layer, and the layer's outputs at the N memory-token
positions write A and z with a delta rule after it.  The memory tokens of
the Recurrent Memory Transformer (``model.tokens.num_mem_tokens``,
docs/guide/memory_tokens.md) carry N vectors instead: read at the start of
a segment, written at its end (the layers run on N + T + N positions).
Here, with one model size on one device in one run, every variant below is
timed in two jitted steps (as ``knn_memory.py`` and
``compressive_memory.py``, with their machinery in ``common.py``):

* **train**: the package's training step (``train_step.make_train_step``:
  forward, backward, gradient clipping and Adam; dropout as the config's),
  the train state and its memory carried and donated from step to step;
  with ``train.mem_backprop_depth`` k > 0 (the ``_k{k}`` variants) the step
  runs a window of k + 1 segments, the gradient flowing back through the
  memory the k earlier ones write, and scores the newest (``train_step``):
  its tokens per step are B x T, the new segment's, its work k + 1
  segments' forward and backward;
* **eval**: the evaluation segment step (``eval_steps.make_eval_step``,
  ``eval_steps.eval_model_config``: no dropout, segments of T with the
  variant's memory; the eval ``same_length`` of ``--same_length`` for
  ``xl``, off for the variants without XL memory, which refuse it; the
  ``_k{k}`` variants' eval step is their k = 0 twin's, timed again).

Variants (N, d_mem and k from the flags; the defaults give the issue's):
``xl``, Transformer-XL with memory M = ``--mem_len`` (the baseline of every
ratio); ``xl_m0``, the same model without memory (mem_len 0); for each N of
``--num_mem_tokens``: ``tokens_n{N}``, the memory tokens with mem_len 0;
for each N and each M of ``--d_mem``: ``armt_n{N}_d{M}``, ARMT with mem_len
0 (as the authors use it); and with ``--mem_backprop_depth`` k > 0 (default
1) ``armt_n{N}_d{M}_k{k}`` at the largest N and M, and
``tokens_n{N}_k{k}`` at the largest N: how both must train (ARMT's writes,
the tokens' too, learn only through the gradient across segments; at k = 0
``W_v`` stays at its zeros and ARMT reads nothing).

Reported per variant and step: tokens/s (median over repeats) and its ratio
to ``xl``'s; the same ratio in tokens per second of this process's CPU time
(``time.process_time`` around each repeat; on a shared CPU less affected by
the other processes than the wall time, meaningless on an accelerator); the
recurrent state, bytes per batch row, counted from the state's leaves: XL's
cache ``mems_LxBxMxD`` (L x M x d_model float32; none at M = 0), the memory
tokens' ``mem_tokens_BxNxD`` (N x d_model float32) and ``mem_tokens_fresh_B``
(a bool), ARMT's ``armt_A_LxBxKxD``, ``armt_z_LxBxK`` (per layer d_key x
d_model + d_key float32) and ``armt_first_LxB`` (a bool per layer);
``mlen_B`` (4 bytes per row, in every variant) is not counted, as in the
other memory benchmarks; its ratio to XL's; XLA's
``compiled.memory_analysis()`` of the step: temporaries and arguments (MiB;
None where the backend gives none); the parameter count (XL's plus, for the
tokens, ``mem_tokens`` N x d_model; for ARMT, ``armt_mem_tokens`` N x
d_model and per layer W_q, W_k [d_model, d_mem], W_v [d_model, d_model],
the gate's d_model + 1).

Timing (``common.measure_memory_variants``): the model's default
initialisation (``--seed``); random token ids placed on the device before
timing (no input pipeline); each step compiled once (``lower().compile()``:
the analysed executable is the one timed), then run ``--warmup`` times
untimed (the memory fills); the fastest of three single steps sets the steps
per repeat (about ``--min_repeat_s`` seconds); then ``--repeats`` repeats of
every variant and step taken in turn (repeat 1 of all, then repeat 2, ...: a
change of load on a shared machine reaches them alike), each ending with
``jax.block_until_ready``; the median.  The JSON (by default
``benchmarks/results/armt_memory_<date>_<time>_<host>.json``; ``--smoke``:
a temporary directory) holds the settings, the machine (CPU or device, load
average before and after, versions, commit) and every number.

Default model: ``configs/ablation_wt2.py:xl`` (4 layers, d_model 128, 4x32
heads, d_inner 512, adaptive input and softmax over WikiText-2's 33,278
words, cutoffs 2000 / 8000, div_val 2; tgt_len 32, batch 16, Adam at 1e-3,
clipping 0.25), with a synthetic vocabulary of that size: no data is read.
The memories: N = 10 (the authors' BABILong ``MEMORY_SIZE``), d_mem in {16,
64} (64: their ``D_MEM``), the correction on, k = 1.
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

# Each preset: common's model, batch and timing, and the memories' sizes.
PRESETS = {
    "default": dict(
        common.DEFAULT_PRESET,
        mem_len=32,
        num_mem_tokens="10",
        d_mem="16,64",
        mem_backprop_depth=1,
    ),
    "smoke": dict(
        common.SMOKE_PRESET,
        mem_len=8,
        num_mem_tokens="2",
        d_mem="2,4",
        mem_backprop_depth=1,
    ),
}
SIZES = common.MODEL_SIZES + ("mem_len", "batch", "repeats")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (default, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, sizes < 1, memory-token counts or d_mem that
      are not a non-empty comma list of ints >= 1, a negative
      ``--mem_backprop_depth``, cutoffs that are not a comma list of ints.
  """
  p = common.Parser(description=__doc__.split("\n\n")[0])
  common.add_model_flags(p, SIZES)
  p.add_argument("--num_mem_tokens", help="memory tokens N (both memories), a comma list")
  p.add_argument("--d_mem", help="ARMT's d_mem M (d_key = 6 M), a comma list")
  p.add_argument(
      "--mem_backprop_depth",
      type=int,
      help="k of the _k{k} train variants (backpropagation through k segments; 0: none)",
  )
  common.add_timing_flags(p, "armt_memory")
  args = p.parse_args(argv)
  common.apply_preset(args, PRESETS)
  for name in ("num_mem_tokens", "d_mem"):
    values = sorted(set(common.int_list(name, getattr(args, name))))
    if not values or values[0] < 1:
      raise UsageError(
          f"--{name}={','.join(map(str, values))}: give a comma list of integers >= 1."
      )
    setattr(args, name, values)
  common.check_sizes(args, SIZES)
  if args.mem_backprop_depth < 0:
    raise UsageError(f"--mem_backprop_depth={args.mem_backprop_depth}: must be >= 0 (0: none).")
  return args


def variants(args: argparse.Namespace) -> list[dict]:
  """The variants timed, in the table's order: {"key", "label", "memory",
  "mem_len", "num_mem_tokens", "d_mem", "mem_backprop_depth"} (0 where
  none); the first is the baseline."""
  m, k = args.mem_len, args.mem_backprop_depth
  n_top, d_top = max(args.num_mem_tokens), max(args.d_mem)

  def v(key, label, memory, mem_len=0, n=0, d=0, depth=0):
    return dict(
        key=key,
        label=label,
        memory=memory,
        mem_len=mem_len,
        num_mem_tokens=n,
        d_mem=d,
        mem_backprop_depth=depth,
    )

  tokens = lambda n, depth: v(
      f"tokens_n{n}" + (f"_k{depth}" if depth else ""),
      f"memory tokens N={n}" + (f", k={depth}" if depth else ""),
      "xl",
      n=n,
      depth=depth,
  )
  armt = lambda n, d, depth: v(
      f"armt_n{n}_d{d}" + (f"_k{depth}" if depth else ""),
      f"ARMT N={n}, d_mem={d}" + (f", k={depth}" if depth else ""),
      "armt",
      n=n,
      d=d,
      depth=depth,
  )
  out = [v("xl", f"XL M={m} (baseline)", "xl", mem_len=m), v("xl_m0", "XL M=0", "xl")]
  out += [tokens(n, 0) for n in args.num_mem_tokens]
  out += [armt(n, d, 0) for n in args.num_mem_tokens for d in args.d_mem]
  if k:
    out += [tokens(n_top, k), armt(n_top, d_top, k)]
  return out


def make_config(args: argparse.Namespace, variant: dict):
  """The config of one variant (``common.memory_config``:
  ``configs/ablation_wt2.py:xl`` with the sizes of ``args``, eval segments
  of ``tgt_len`` with memory ``mem_len``, batch ``args.batch``) with the
  memory tokens (``model.tokens.num_mem_tokens``) or ARMT's settings
  (``model.armt``: N, d_mem, the correction on) and
  ``train.mem_backprop_depth``; without XL memory (mem_len 0) the eval's
  ``same_length`` is off (the config validation refuses it: it would mask
  every key of a segment's first position).

  Returns:
    ml_collections.ConfigDict.
  """
  c = common.memory_config(args, variant["memory"], variant["mem_len"])
  if variant["memory"] == "armt":
    c.model.armt.update(
        num_mem_tokens=variant["num_mem_tokens"], d_mem=variant["d_mem"], correction=True
    )
  else:  # 0: none (XL)
    c.model.tokens.update(num_mem_tokens=variant["num_mem_tokens"])
  c.train.update(mem_backprop_depth=variant["mem_backprop_depth"])
  if not variant["mem_len"]:  # same_length needs keys beyond the segment: none without memory
    c.eval.same_length = False
  return c


def measure(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
  """Compiles and times every variant's train and eval steps (module
  docstring) on the first device (``common.measure_memory_variants``).

  Returns:
    {"variants": [``variants``' dicts with "n_params";
    "state_bytes_per_row" (every state leaf but ``mlen_B``, bytes per row),
    "xl_cache_bytes_per_row" (``mems_LxBxMxD``), "variant_bytes_per_row"
    (the memory's own leaves: the tokens' or ARMT's; 0 for XL),
    "state_leaves" ({leaf: [shape, dtype]}, ``mems_LxBxMxD`` and the
    memory's own); "train" and "eval": each ``common.per_token_summary``'s
    dict plus "temp_mib", "argument_mib", "output_mib"
    (``common.memory_analysis``), "cpu_tokens_per_sec",
    "repeat_cpu_seconds" and, for train, "last_loss" (the last step's
    cross-entropy, nats)], "ratios": {phase: {variant key:
    {"tokens_per_sec", "cpu_tokens_per_sec", "state_bytes_per_row",
    "temp_mib"}: the variant's over the baseline's}}, "device_peak_mib"
    (None where the device reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
  """
  b = args.batch

  def describe(v, state, memory):
    mems = state.memory.mems_LxBxMxD
    own = state.memory.variant_state
    cache_bytes = int(mems.nbytes) // b
    own_bytes = sum(int(x.nbytes) for x in own.values()) // b
    leaves = {"mems_LxBxMxD": mems, **own}
    fields = {
        "state_bytes_per_row": cache_bytes + own_bytes,
        "xl_cache_bytes_per_row": cache_bytes,
        "variant_bytes_per_row": own_bytes,
        "state_leaves": {k: [list(x.shape), str(x.dtype)] for k, x in leaves.items()},
    }
    return state, memory, fields

  return common.measure_memory_variants(args, variants(args), make_config, describe, None, log)


def format_table(res: dict) -> str:
  """The table (markdown): one row per variant, its XL memory M, memory
  tokens N, d_mem, backpropagation depth k, parameters, state KiB per row
  and its ratio to the baseline's, and per step tokens/s with its ratio to
  the baseline's (wall time, and this process's CPU time), and XLA's
  temporaries and arguments (MiB)."""
  out = [
      "| variant | M | N | d_mem | k | params | state KiB/row | state vs XL "
      + common.PHASE_COLUMNS,
      "|---|---:|---:|---:|---:|---:|---:|---:|" + common.PHASE_ALIGN,
  ]
  base = res["variants"][0]
  dash = lambda x: str(x) if x else "-"
  for v in res["variants"]:
    cells = [
        v["label"],
        str(v["mem_len"]),
        dash(v["num_mem_tokens"]),
        dash(v["d_mem"]),
        str(v["mem_backprop_depth"]),
        f"{v['n_params']:,}",
        f"{v['state_bytes_per_row'] / 1024:,.1f}",
        f"{v['state_bytes_per_row'] / base['state_bytes_per_row']:,.2f}x",
    ]
    out.append("| " + " | ".join(cells + common.phase_cells(v, base)) + " |")
  return "\n".join(out)


def _model_line(args: argparse.Namespace) -> str:
  return (
      common.model_description(args) + "; "
      f"baseline XL M={args.mem_len}; memory tokens and "
      f"ARMT (mem_len 0) with N in {args.num_mem_tokens}, ARMT d_mem in {args.d_mem} "
      f"(correction on); train mem_backprop_depth 0 and {args.mem_backprop_depth} (_k "
      f"variants); eval same_length {args.same_length}"
  )


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  return common.memory_benchmark_main(
      argv, parse_args, _model_line, measure, format_table, "armt_memory"
  )


if __name__ == "__main__":
  sys.exit(main())
