"""The cost of every memory variant against Transformer-XL's, at an equal memory budget, in one run.

Run from the repository root::

  python benchmarks/memory_variants.py [--mem_len=24] [--cmem_len=12 --cmem_ratio=4
                                       --cmem_fn=max_pool] [--num_neighbors=16 --knn_layer=-2]
                                       [--armt_tokens=10] [--mem_backprop_depth=1]
                                       [--n_layer=4 --d_model=128 ... --batch=16] [--json=F]
  python benchmarks/memory_variants.py --smoke    # a tiny model, seconds (tests)

The five memories (``model.memory`` = "xl", "compressive", "knn", "armt",
and the memory tokens, an add-on of the XL memory:
``model.tokens.num_mem_tokens``), each sized to hold the same recurrent
state per batch row as Transformer-XL's cache, timed in one run on one
device in the two jitted steps of the other memory benchmarks
(``compressive_memory.py``, ``knn_memory.py``, ``armt_memory.py``; their
machinery is ``common.py``):

* **train**: the package's training step (``train_step.make_train_step``:
  forward, backward, gradient clipping and Adam; dropout as the config's),
  the train state and its memory carried and donated from step to step;
  with ``train.mem_backprop_depth`` k > 0 the step runs a window of k + 1
  segments, the gradient flowing back through the memory the k earlier
  ones write, and scores the newest: its tokens per step are B x T, its
  work k + 1 segments' forward and backward;
* **eval**: the evaluation segment step (``eval_steps.make_eval_step``,
  ``eval_steps.eval_model_config``: no dropout, segments of T with the
  variant's memory; the eval ``same_length`` of ``--same_length`` for XL and
  the compressive memory, off for the variants without XL memory: the
  config validation refuses it there).

**The budget** is the recurrent state per batch row, summed over the layers
(the state a row carries from segment to segment and a checkpoint saves):
XL's cache, M = ``--mem_len`` positions x d_model float32 in each of L
layers, L M D 4 bytes, is the unit, and every variant is sized to hold as
nearly as its settings allow the same bytes, measured from the arrays of
its real memory (the train state's, ``common.state_leaves``; ``mlen_B``, 4
bytes per row in every variant, not counted) and checked against the
formula below before anything is timed (a mismatch stops the run).  The
sum over layers is what equal means for the two variants whose state is not
per layer: the memory tokens carry one set of N vectors for the whole
model, the kNN memory its store at one layer.

* ``xl``: Transformer-XL, mem_len M (the baseline of every ratio):
  ``mems_LxBxMxD``, M D 4 bytes in each layer.
* ``compressive``: the compressive memory (Rae et al. 2020), mem_len M - Nc
  and Nc = ``--cmem_len`` compressed slots at rate c = ``--cmem_ratio``,
  ``--cmem_fn`` (default max_pool: no parameters, as XL's count; the
  paper's best, conv, adds c D^2 + D per layer): ``mems_LxBxMxD`` with M
  slots, the same bytes exactly.
* ``knn``: the kNN memory (Memorizing Transformers, Wu et al. 2022) with
  mem_len 0 and a store of S entries at the one layer ``--knn_layer``:
  ``knn_keys``, ``knn_values`` (H x S x Dh float32 each, 2 H Dh 4 bytes an
  entry) and the int32 write index; S = the multiple of k =
  ``--num_neighbors`` (the bucketed retrieval's groups) nearest to L M D /
  (2 H Dh), i.e. the store holds at its layer what the XL cache holds over
  all layers (the paper's model keeps an XL cache beside the store: here
  the whole budget is the store's).  Within k / 2 entries and 4 bytes.
* ``tokens``: the memory tokens of the Recurrent Memory Transformer
  (Bulatov et al. 2022) with mem_len 0 (as its authors): N = L M tokens,
  ``mem_tokens_BxNxD`` (N D 4 bytes, one set for all layers) and the bool
  ``mem_tokens_fresh_B``: the budget and 1 byte.  The layers run on N + T +
  N positions.
* ``armt``: the associative memory (ARMT, Rodkin et al. 2024) with mem_len 0
  and N = ``--armt_tokens`` memory tokens (its state does not grow with N):
  per layer ``armt_A`` (d_key x d_model) and ``armt_z`` (d_key) float32 and
  the bool ``armt_first``, d_key = 6 d_mem (``armt.d_key``: DPFP, nu = 3),
  d_mem the one whose d_key (D + 1) is nearest to M D: within 3 (D + 1)
  floats and a byte per layer (half of d_key's step of 6).  At the default
  sizes (M = 24, a multiple of 6, D = 128: d_mem 4, d_key 24) +0.78%.

Training depth (``train.mem_backprop_depth``): each variant is timed at the
depth it needs to learn.  XL, compressive and kNN at 0 (their memory is
data between segments: XL's cache and the store are stop-gradient, a
learned compression is trained by the reconstruction loss; the config validation
refuses a depth > 0 for them, so XL cannot be timed at depth 1); the memory
tokens and ARMT at k = ``--mem_backprop_depth`` (default 1, as
``armt_memory.py``'s ``_k1`` variants): they learn to write only through
the gradient across segments (at 0 ARMT's W_v stays at its zeros and
nothing is read).  **Every ratio is against XL at depth 0**: the memory
tokens' and ARMT's training ratios include the k earlier segments' forward
and backward (``armt_memory.py`` times both at depth 0 and 1 for the
split); their eval step is the same at any depth.

Parameters: counted from the initialised model, and their difference to
XL's stated (the issue asks within 1%): the memory tokens add N x D, kNN
the gate bias and scale (one per head, in every layer: 2 H L), ARMT its N
tokens and per layer W_q, W_k (D x d_mem), W_v (D x D) and the gate (D +
1), the compressive memory nothing with a pooling ``--cmem_fn``.

Reported per variant: the state, bytes per row (all layers), where it is
held (per layer, one set, one layer) and its difference to XL's; the
parameters and their difference; per step tokens/s (median over repeats),
its ratio to XL's by wall time and by this process's CPU time
(``time.process_time`` around each repeat; on a shared CPU less affected by
the other processes, meaningless on an accelerator), XLA's
``compiled.memory_analysis()`` of the step, temporaries / arguments (MiB;
None where the backend gives none), and the temporaries' ratio to XL's.

Timing (``common.measure_memory_variants``): the model's default
initialisation (``--seed``); random token ids placed on the device before
timing (no input pipeline); each step compiled once (``lower().compile()``:
the analysed executable is the one timed); the kNN store filled as in
``knn_memory.py`` (``knn_memory.fill_store``) and checked full after timing;
``--warmup`` untimed steps; the fastest of three single steps sets the
steps per repeat (about ``--min_repeat_s`` seconds); then ``--repeats``
repeats of every variant and step taken in turn, each ending with
``jax.block_until_ready``; the median.  The JSON (by default
``benchmarks/results/memory_variants_<date>_<time>_<host>.json``;
``--smoke``: a temporary directory) holds the settings, the machine (CPU or
device, load average before and after, versions, commit) and every number.

Default model: ``configs/ablation_wt2.py:xl`` (4 layers, d_model 128, 4x32
heads, d_inner 512, adaptive input and softmax over WikiText-2's 33,278
words, cutoffs 2000 / 8000, div_val 2; tgt_len 32, batch 16, Adam at 1e-3,
clipping 0.25), with a synthetic vocabulary of that size: no data is read.
M = 24 (a multiple of 6: ARMT's d_key can match it), Nc = 12 at c = 4, k =
16 at layer -2 (S = 48), ARMT N = 10 (the authors' BABILong
``MEMORY_SIZE``) and the memory tokens N = 96.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
if BENCHMARKS not in sys.path:  # common.py and knn_memory.py, also when loaded from the file
  sys.path.insert(0, BENCHMARKS)
import common  # noqa: E402

REPO = common.REPO
if REPO not in sys.path:
  sys.path.insert(0, REPO)
UsageError = common.UsageError

FLOAT32 = 4  # bytes of the compute dtype (float32) of every state array here

# Each preset: common's model, batch and timing, and the memories' sizes.
PRESETS = {
    "default": dict(
        common.DEFAULT_PRESET,
        mem_len=24,
        cmem_len=12,
        cmem_ratio=4,
        cmem_fn="max_pool",
        num_neighbors=16,
        knn_layer=-2,
        armt_tokens=10,
        mem_backprop_depth=1,
    ),
    "smoke": dict(
        common.SMOKE_PRESET,
        mem_len=12,
        cmem_len=6,
        cmem_ratio=2,
        cmem_fn="max_pool",
        num_neighbors=4,
        knn_layer=-2,
        armt_tokens=2,
        mem_backprop_depth=1,
    ),
}
SIZES = common.MODEL_SIZES + (
    "mem_len",
    "cmem_len",
    "cmem_ratio",
    "num_neighbors",
    "armt_tokens",
    "batch",
    "repeats",
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (default, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, sizes < 1, a ``--mem_backprop_depth`` < 1
      (the memory tokens and ARMT learn only through it), a ``--cmem_len``
      that leaves no XL slot, a ``--knn_layer`` that is not one of the
      layers, cutoffs that are not a comma list of ints.
  """
  p = common.Parser(description=__doc__.split("\n\n")[0])
  common.add_model_flags(p, SIZES)
  p.add_argument("--cmem_fn", help="the compressive memory's compression (default max_pool)")
  p.add_argument("--knn_layer", type=int, help="the layer with the store, negative from the top")
  p.add_argument(
      "--mem_backprop_depth",
      type=int,
      help="k of the memory tokens' and ARMT's training step (backpropagation through k segments)",
  )
  common.add_timing_flags(p, "memory_variants")
  args = p.parse_args(argv)
  common.apply_preset(args, PRESETS)
  common.check_sizes(args, SIZES)
  if args.mem_backprop_depth < 1:
    raise UsageError(
        f"--mem_backprop_depth={args.mem_backprop_depth}: the memory tokens and ARMT learn to "
        "write only through the gradient across segments; give a depth >= 1."
    )
  if args.cmem_len >= args.mem_len:
    raise UsageError(
        f"--cmem_len={args.cmem_len}: the compressive memory's M={args.mem_len} slots are "
        "mem_len + cmem_len; give a cmem_len below --mem_len."
    )
  if not -args.n_layer <= args.knn_layer < args.n_layer:
    raise UsageError(
        f"--knn_layer={args.knn_layer} is not one of the {args.n_layer} layers (use "
        f"-{args.n_layer} .. {args.n_layer - 1})."
    )
  return args


def _nearest(candidates, score):
  """The candidate of the smallest ``score`` (ties: the smaller candidate)."""
  return min(candidates, key=lambda x: (score(x), x))


def budget(args: argparse.Namespace) -> dict:
  """Each variant's size at XL's budget and the state it must then hold
  (module docstring), from the formulas: {"xl_bytes" (L M D 4),
  "num_mem_tokens" (the memory tokens' N), "memory_size" (the store's S),
  "d_mem", "d_key" (ARMT's), "bytes" ({variant key: its state, bytes per
  row}), "tolerance" ({variant key: the most its bytes may differ from
  XL's: half a step of its size setting, plus its flags and indices})}."""
  from transformer_xl.model.memory import armt  # noqa: PLC0415

  n, d, m, k = args.n_layer, args.d_model, args.mem_len, args.num_neighbors
  xl = n * m * d * FLOAT32
  entry = 2 * args.n_head * args.d_head * FLOAT32  # keys and values of one store entry
  groups = _nearest(range(1, xl // (entry * k) + 2), lambda g: abs(g * k * entry - xl))
  step = armt.d_key(1)  # d_key's step: 6 rows
  guess = m * d // (step * (d + 1))
  d_mem = _nearest(range(max(1, guess), guess + 2), lambda x: abs(armt.d_key(x) * (d + 1) - m * d))
  d_key = armt.d_key(d_mem)
  return {
      "xl_bytes": xl,
      "num_mem_tokens": n * m,
      "memory_size": groups * k,
      "d_mem": d_mem,
      "d_key": d_key,
      "bytes": {
          "xl": xl,
          "compressive": xl,
          "knn": groups * k * entry + 4,
          "tokens": n * m * d * FLOAT32 + 1,
          "armt": n * (d_key * (d + 1) * FLOAT32 + 1),
      },
      "tolerance": {
          "xl": 0,
          "compressive": 0,
          "knn": k * entry // 2 + 4,
          "tokens": 1,
          "armt": n * (step // 2 * (d + 1) * FLOAT32 + 1),
      },
  }


def variants(args: argparse.Namespace) -> list[dict]:
  """The variants timed, in the table's order (the first is the baseline):
  {"key", "label", "memory" (model.memory), "mem_len", "section" (the
  model config's section set, None for XL), "settings" (its values),
  "mem_backprop_depth", "held" ("per layer", "one set", "one layer"),
  "planned_bytes_per_row" and "budget_tolerance_bytes" (``budget``)}."""
  b = budget(args)
  m, nc, depth = args.mem_len, args.cmem_len, args.mem_backprop_depth
  layer = args.knn_layer % args.n_layer

  def v(key, label, memory, section, settings, mem_len=0, depth=0, held="per layer"):
    return dict(
        key=key,
        label=label,
        memory=memory,
        mem_len=mem_len,
        section=section,
        settings=settings,
        mem_backprop_depth=depth,
        held=held,
        planned_bytes_per_row=b["bytes"][key],
        budget_tolerance_bytes=b["tolerance"][key],
    )

  return [
      v("xl", f"XL M={m} (baseline)", "xl", None, {}, mem_len=m),
      v(
          "compressive",
          f"compressive M={m - nc} + Nc={nc}, c={args.cmem_ratio}, {args.cmem_fn}",
          "compressive",
          "compressive",
          {"cmem_len": nc, "cmem_ratio": args.cmem_ratio, "cmem_fn": args.cmem_fn},
          mem_len=m - nc,
      ),
      v(
          "knn",
          f"kNN S={b['memory_size']} at layer {layer}, k={args.num_neighbors}, M=0",
          "knn",
          "knn",
          {
              "memory_size": b["memory_size"],
              "num_neighbors": args.num_neighbors,
              "layers": (args.knn_layer,),
              "retrieval": "bucketed",
          },
          held="one layer",
      ),
      v(
          "tokens",
          f"memory tokens N={b['num_mem_tokens']}, M=0, depth {depth}",
          "xl",
          "tokens",
          {"num_mem_tokens": b["num_mem_tokens"]},
          depth=depth,
          held="one set",
      ),
      v(
          "armt",
          f"ARMT N={args.armt_tokens}, d_mem={b['d_mem']} (d_key {b['d_key']}), M=0, "
          f"depth {depth}",
          "armt",
          "armt",
          {"num_mem_tokens": args.armt_tokens, "d_mem": b["d_mem"], "correction": True},
          depth=depth,
      ),
  ]


def make_config(args: argparse.Namespace, variant: dict):
  """The config of one variant (``common.memory_config``:
  ``configs/ablation_wt2.py:xl`` with the sizes of ``args``, eval segments
  of ``tgt_len`` with memory ``mem_len``, batch ``args.batch``) with its
  section (``model.<section>``) and ``train.mem_backprop_depth``; without XL
  memory (mem_len 0) the eval's ``same_length`` is off (the config
  validation refuses it: it would mask every key of a segment's first
  position).

  Returns:
    ml_collections.ConfigDict.
  """
  c = common.memory_config(args, variant["memory"], variant["mem_len"])
  if variant["section"]:
    c.model[variant["section"]].update(variant["settings"])
  c.train.update(mem_backprop_depth=variant["mem_backprop_depth"])
  if not variant["mem_len"]:
    c.eval.same_length = False
  return c


def measure(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
  """Compiles and times every variant's train and eval steps (module
  docstring) on the first device (``common.measure_memory_variants``).

  Returns:
    {"budget": ``budget``'s sizes ("xl_bytes", "num_mem_tokens",
    "memory_size", "d_mem", "d_key"), "variants": [``variants``' dicts with "n_params",
    "params_vs_xl" (its parameters over XL's, minus 1),
    "params_within_1pct", "state_bytes_per_row" (the train state's memory,
    every array but ``mlen_B``), "eval_state_bytes_per_row" (the eval
    memory's), "state_bytes_per_row_per_layer" (each layer's for a state
    held per layer; else the total over L), "state_held" (the table's
    words: bytes per layer, one set, at one layer), "state_vs_xl" (its state over
    XL's, minus 1), "state_leaves" (``common.state_leaves``); "train" and
    "eval": each ``common.per_token_summary``'s dict plus "temp_mib",
    "argument_mib", "output_mib" (``common.memory_analysis``),
    "cpu_tokens_per_sec", "repeat_cpu_seconds", "empty_slots_after" (the
    kNN store's; None elsewhere) and, for train, "last_loss"], "ratios":
    {phase: {variant key: {"tokens_per_sec", "cpu_tokens_per_sec",
    "state_bytes_per_row", "temp_mib"}: the variant's over XL's}},
    "device_peak_mib" (None where the device reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
    RuntimeError: a state whose arrays do not hold the budget's bytes.
  """
  import knn_memory  # noqa: PLC0415  (this folder's: the store's filling and check)

  b, n_layer = args.batch, args.n_layer

  def describe(v, state, memory):
    leaves = common.state_leaves(state.memory, b)
    total = sum(x["bytes_per_row"] for x in leaves.values())
    eval_total = sum(x["bytes_per_row"] for x in common.state_leaves(memory, b).values())
    if total != v["planned_bytes_per_row"] or eval_total != total:
      raise RuntimeError(
          f"{v['key']}: the state's arrays hold {total:,} bytes per row in training and "
          f"{eval_total:,} in evaluation, the budget's formula {v['planned_bytes_per_row']:,}: "
          f"{ {k: x['shape'] for k, x in leaves.items()} }"
      )
    if v["held"] == "per layer":
      held = f"{total // n_layer:,} x {n_layer} layers"
    elif v["held"] == "one layer":
      held = f"{total:,} at layer {v['settings']['layers'][0] % n_layer}"
    else:
      held = f"{total:,}, one set"
    fields = {
        "state_bytes_per_row": total,
        "eval_state_bytes_per_row": eval_total,
        "state_bytes_per_row_per_layer": total / n_layer,
        "state_held": held,
        "state_leaves": leaves,
    }
    state = state.replace(memory=knn_memory.fill_store(state.memory, args.seed))
    return state, knn_memory.fill_store(memory, args.seed + 1), fields

  def finish(v, train_run, eval_run):
    v["train"]["empty_slots_after"] = knn_memory.empty_slots(train_run.state().memory)
    v["eval"]["empty_slots_after"] = knn_memory.empty_slots(eval_run.memory())

  res = common.measure_memory_variants(args, variants(args), make_config, describe, finish, log)
  xl = res["variants"][0]
  for v in res["variants"]:
    v["params_vs_xl"] = v["n_params"] / xl["n_params"] - 1
    v["params_within_1pct"] = abs(v["params_vs_xl"]) <= 0.01
    v["state_vs_xl"] = v["state_bytes_per_row"] / xl["state_bytes_per_row"] - 1
  sizes = budget(args)
  keys = ("xl_bytes", "num_mem_tokens", "memory_size", "d_mem", "d_key")
  return {"budget": {k: sizes[k] for k in keys}, **res}


def format_table(res: dict) -> str:
  """The table (markdown): one row per variant, its training depth, its
  parameters and their difference to XL's (and whether within 1%), its
  state in bytes per row (all layers), where it is held (bytes per layer,
  one set, one layer) and its difference to XL's, and per step tokens/s
  with its ratio to XL's (wall time, and this process's CPU time), XLA's
  temporaries and arguments (MiB) and the temporaries' ratio to XL's."""
  columns, align = common.phase_columns(temp_ratio=True)
  out = [
      "| variant | depth | params | params vs XL | within 1% | state bytes/row | held "
      "| state vs XL " + columns,
      "|---|---:|---:|---:|---|---:|---|---:|" + align,
  ]
  base = res["variants"][0]
  for v in res["variants"]:
    cells = [
        v["label"],
        str(v["mem_backprop_depth"]),
        f"{v['n_params']:,}",
        f"{100 * v['params_vs_xl']:+.2f}%",
        "yes" if v["params_within_1pct"] else "no",
        f"{v['state_bytes_per_row']:,}",
        v["state_held"],
        f"{100 * v['state_vs_xl']:+.2f}%",
    ]
    out.append("| " + " | ".join(cells + common.phase_cells(v, base, temp_ratio=True)) + " |")
  return "\n".join(out)


def _model_line(args: argparse.Namespace) -> str:
  xl = budget(args)["xl_bytes"]
  return (
      common.model_description(args) + "; "
      f"budget: XL's cache of M={args.mem_len} x d_model float32 per layer, {xl:,} bytes per "
      f"row over {args.n_layer} layers; train mem_backprop_depth 0 (XL, compressive, kNN) and "
      f"{args.mem_backprop_depth} (memory tokens, ARMT); eval same_length {args.same_length} "
      "(XL, compressive; off at M=0)"
  )


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  return common.memory_benchmark_main(
      argv, parse_args, _model_line, measure, format_table, "memory_variants"
  )


if __name__ == "__main__":
  sys.exit(main())
