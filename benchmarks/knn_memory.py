"""The cost of the kNN memory (Memorizing Transformers, Wu et al. 2022) against Transformer-XL's.

Run from the repository root::

  python benchmarks/knn_memory.py [--memory_sizes=1024,4096,16384 --num_neighbors=32]
                                  [--knn_layer=-2 --mem_len=32] [--n_layer=4 --d_model=128 ...
                                  --batch=16] [--json=F]
  python benchmarks/knn_memory.py --smoke    # a tiny model, seconds (tests)

The kNN memory (``model.memory="knn"``, ``transformer_xl/model/memory/knn.py``,
``KNNMemory``; docs/guide/knn.md) keeps Transformer-XL's memory (the M =
``mem_len`` cached states of every layer, unchanged) and gives one layer a
store of S = ``memory_size`` (key, value) pairs per row and head, written a
segment at a time into a ring buffer and never differentiated; each query of
the segment reads its k = ``num_neighbors`` nearest stored keys (cosine
similarity: the scores of the E queries against all S keys, [B, H, E, S]),
attends over them, and a learned per-head gate mixes that with the layer's
own attention (Sec. 3).  Here, with one model size on one device in one run,
every variant below is timed in two jitted steps (as ``compressive_memory.py``,
with its machinery in ``common.py``):

* **train**: the package's training step (``train_step.make_train_step``:
  forward, backward, gradient clipping and Adam; dropout as the config's),
  the train state and its memory (the store included) carried and donated
  from step to step;
* **eval**: the evaluation segment step (``eval_steps.make_eval_step``,
  ``eval_steps.eval_model_config``: no dropout, segments of T with the
  variant's memory and the training's store size; the eval ``same_length``
  of ``--same_length``).

Variants (M, the sizes S, k and the layer from the flags; the defaults give
the issue's): ``xl``, Transformer-XL with memory M (the baseline of every
ratio); ``knn_s{S}`` for each S of ``--memory_sizes``, XL's memory M and
a store of S entries at the layer ``--knn_layer`` (default -2: the 3rd of
4 layers, about where the paper puts it, the 9th of 12), k neighbours, the
authors' "bucketed" retrieval (no gather: the scores grouped by slot mod k,
neighbour n the best of group n); ``knn_s{S}_exact`` and ``knn_s{S}_approx``
at the largest S: a true top k (``jax.lax.top_k``, then a gather) and the
approximate one (``jax.lax.approx_max_k``, recall target 0.95; TPU-native,
on the CPU compiled to the same exact top k as ``exact``, so there the two
differ only by the noise of the timing).

**The store is full when timed**: the shapes are static (every query scores
all S slots, empty ones too), but a search whose time depends on the scores
(a top k among the equal scores of empty slots) could be cheaper on an empty
store, and a partly written one is not what a long run carries.  It is
filled directly, not by warm-up steps (S / T segments: 512 steps at S =
16384, minutes of CPU per variant): after compilation the carried state of both steps gets
keys that are unit-normalised standard normal vectors (the stored keys are
unit-normalised too; none sums to 0, so none is an empty slot), values that
are standard normals, both in the store's dtype, and a write index of S
(each slot written once; the next segment overwrites the oldest).  The
``--warmup`` steps then write the model's own keys into the ring.  After
timing, every variant's carried stores are checked for empty slots (in the
results: "empty_slots_after", 0 expected).

Reported per variant and step: tokens/s (median over repeats) and its ratio
to ``xl``'s; the same ratio in tokens per second of this process's CPU time
(``time.process_time`` around each repeat; on a shared CPU less affected by
the other processes than the wall time, meaningless on an accelerator); the
recurrent state, bytes per batch row, counted from the state's leaves: XL's
cache ``mems_LxBxMxD`` (L x M x d_model values) plus the store, per memory
layer ``knn_keys_NxBxHxSxDh`` and ``knn_values_NxBxHxSxDh`` (2 x H x S x Dh
values in the compute dtype, here float32) and ``knn_index_NxB`` (an int32);
``mlen_B`` (4 bytes per row, in every variant) is not counted, as in
``compressive_memory.py``; its ratio to XL's; XLA's
``compiled.memory_analysis()`` of the step: temporaries and arguments (MiB;
None where the backend gives none); the parameter count (XL's plus the
gate bias and the scale, one per head, ``knn_gate_bias`` and ``knn_scale``:
every layer has them, the layers being one scan, only the memory layer's are
used).

Timing (``common.measure_memory_variants``, as ``compressive_memory.py``):
the model's default initialisation (``--seed``); random token ids placed on
the device before timing (no input pipeline); each step compiled once
(``lower().compile()``: the analysed executable is the one timed), the store
filled, then the step run ``--warmup`` times untimed; the fastest of three
single steps sets the steps per repeat (about ``--min_repeat_s`` seconds);
then ``--repeats`` repeats of every variant and step taken in turn (repeat 1
of all, then repeat 2, ...: a change of load on a shared machine reaches
them alike), each ending with ``jax.block_until_ready``; the median.  The
JSON (by default ``benchmarks/results/knn_memory_<date>_<time>_<host>.json``;
``--smoke``: a temporary directory) holds the settings, the machine (CPU or
device, load average before and after, versions, commit) and every number.

Default model: ``configs/ablation_wt2.py:xl`` (4 layers, d_model 128, 4x32
heads, d_inner 512, adaptive input and softmax over WikiText-2's 33,278
words, cutoffs 2000 / 8000, div_val 2; tgt_len 32, mem_len 32, batch 16,
Adam at 1e-3, clipping 0.25), with a synthetic vocabulary of that size: no
data is read.  The store: S in {1024, 4096, 16384}, k = 32 (the paper's k is
128, its stores up to 262144 entries).
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

# The store's leaves (KNNMemory.STATE): keys and values [N, B, H, S, Dh], the write index [N, B].
KEYS, VALUES, INDEX = "knn_keys_NxBxHxSxDh", "knn_values_NxBxHxSxDh", "knn_index_NxB"
RECALL_TARGET = 0.95  # "approx": jax.lax.approx_max_k's (KNNSettings' default)

# Each preset: common's model, batch and timing, and the store's sizes.
PRESETS = {
    "default": dict(
        common.DEFAULT_PRESET,
        mem_len=32,
        memory_sizes="1024,4096,16384",
        num_neighbors=32,
        knn_layer=-2,
    ),
    "smoke": dict(
        common.SMOKE_PRESET,
        mem_len=8,
        memory_sizes="16,64",
        num_neighbors=4,
        knn_layer=-2,
    ),
}
SIZES = common.MODEL_SIZES + ("mem_len", "num_neighbors", "batch", "repeats")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Flags; the preset (default, --smoke) fills every flag not given.

  Raises:
    UsageError: unknown flags, sizes < 1, store sizes that are not a comma
      list of multiples of ``--num_neighbors`` (the bucketed retrieval's
      groups), a ``--knn_layer`` that is not one of the layers, cutoffs
      that are not a comma list of ints.
  """
  p = common.Parser(description=__doc__.split("\n\n")[0])
  common.add_model_flags(p, SIZES)
  p.add_argument(
      "--memory_sizes", help="store sizes S, entries per row and head, a comma list (k divides)"
  )
  p.add_argument("--knn_layer", type=int, help="the layer with the store, negative from the top")
  common.add_timing_flags(p, "knn_memory")
  args = p.parse_args(argv)
  common.apply_preset(args, PRESETS)
  args.memory_sizes = sorted(set(common.int_list("memory_sizes", args.memory_sizes)))
  common.check_sizes(args, SIZES)
  k = args.num_neighbors
  if not args.memory_sizes or any(s < k or s % k for s in args.memory_sizes):
    raise UsageError(
        f"--memory_sizes={','.join(map(str, args.memory_sizes))}: give store sizes S that are "
        f"multiples of --num_neighbors={k} (the bucketed retrieval groups the slots by index "
        "mod k)."
    )
  if not -args.n_layer <= args.knn_layer < args.n_layer:
    raise UsageError(
        f"--knn_layer={args.knn_layer} is not one of the {args.n_layer} layers (use "
        f"-{args.n_layer} .. {args.n_layer - 1})."
    )
  return args


def variants(args: argparse.Namespace) -> list[dict]:
  """The variants timed, in the table's order: {"key", "label", "memory",
  "mem_len", "memory_size", "num_neighbors", "retrieval"} (the XL
  baseline: memory_size and num_neighbors 0, retrieval None); the first is
  the baseline."""
  m, k, top = args.mem_len, args.num_neighbors, max(args.memory_sizes)
  knn = lambda s, retrieval, suffix: dict(
      key=f"knn_s{s}{suffix}",
      label=f"kNN M={m} + S={s}, k={k}, {retrieval}",
      memory="knn",
      mem_len=m,
      memory_size=s,
      num_neighbors=k,
      retrieval=retrieval,
  )
  out = [
      dict(
          key="xl",
          label=f"XL M={m} (baseline)",
          memory="xl",
          mem_len=m,
          memory_size=0,
          num_neighbors=0,
          retrieval=None,
      )
  ]
  out += [knn(s, "bucketed", "") for s in args.memory_sizes]
  out += [knn(top, "exact", "_exact"), knn(top, "approx", "_approx")]
  return out


def make_config(args: argparse.Namespace, variant: dict):
  """The config of one variant (``common.memory_config``:
  ``configs/ablation_wt2.py:xl`` with the sizes of ``args``, eval segments
  of ``tgt_len`` with memory ``mem_len``, batch ``args.batch``) with, for a
  kNN variant, the store: ``model.knn`` = the variant's size, neighbours and
  retrieval, at the layer ``args.knn_layer`` (the eval store: the model's).

  Returns:
    ml_collections.ConfigDict.
  """
  c = common.memory_config(args, variant["memory"], variant["mem_len"])
  if variant["memory"] == "knn":
    c.model.knn.update(
        memory_size=variant["memory_size"],
        num_neighbors=variant["num_neighbors"],
        layers=(args.knn_layer,),
        retrieval=variant["retrieval"],
        recall_target=RECALL_TARGET,
    )
  return c


def fill_store(memory, seed: int):
  """``memory`` (a ``memory.Memory``) with its kNN store full: keys
  ``knn.normalize`` of standard normals (unit vectors, as the stored keys;
  none sums to 0, i.e. none is empty), values standard normals, both
  [N, B, H, S, Dh] in the store's dtype, and the write index [N, B] = S (each
  slot written once since the last reset; the next write overwrites the
  oldest).  A memory without a store is returned as it is.  The arrays keep
  the memory's shardings."""
  import jax
  import jax.numpy as jnp

  from transformer_xl.model import memory as memory_lib

  state = memory.variant_state
  if KEYS not in state:
    return memory
  keys, values, index = state[KEYS], state[VALUES], state[INDEX]
  rk, rv = jax.random.split(jax.random.PRNGKey(seed))
  filled = memory.with_state(
      **{
          KEYS: memory_lib.knn.normalize(jax.random.normal(rk, keys.shape)).astype(keys.dtype),
          VALUES: jax.random.normal(rv, values.shape).astype(values.dtype),
          INDEX: jnp.full(index.shape, keys.shape[3], index.dtype),
      }
  )
  return jax.device_put(filled, jax.tree_util.tree_map(lambda x: x.sharding, memory))


def empty_slots(memory) -> int | None:
  """The store's empty slots (a key that sums to 0, ``knn.scores``'
  definition) over every memory layer, row and head; None without a store."""
  import numpy as np

  keys = memory.variant_state.get(KEYS)
  if keys is None:
    return None
  return int(np.sum(np.sum(np.asarray(keys, np.float32), axis=-1) == 0))


def measure(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
  """Compiles and times every variant's train and eval steps (module
  docstring) on the first device (``common.measure_memory_variants``), each
  store filled (``fill_store``) before the warm-up.

  Returns:
    {"variants": [``variants``' dicts with "n_params";
    "state_bytes_per_row" (the XL cache plus the store, bytes per row),
    "xl_cache_bytes_per_row" (``mems_LxBxMxD``), "store_bytes_per_row"
    (keys, values and write index of every memory layer; 0 for XL),
    "state_shape_LxBxMxD", "store_shape_NxBxHxSxDh" and "store_dtype"
    (None for XL); "train" and "eval": each ``common.per_token_summary``'s
    dict plus "temp_mib", "argument_mib", "output_mib"
    (``common.memory_analysis``), "cpu_tokens_per_sec",
    "repeat_cpu_seconds", "empty_slots_after" (the carried store's empty
    slots after timing; None for XL) and, for train, "last_loss" (the last
    step's cross-entropy, nats)], "ratios": {phase: {variant key:
    {"tokens_per_sec", "cpu_tokens_per_sec", "state_bytes_per_row",
    "temp_mib"}: the variant's over the baseline's}}, "device_peak_mib"
    (None where the device reports none, as XLA:CPU)}.

  Raises:
    default_config.ConfigError: sizes the config validation rejects.
  """
  b = args.batch

  def describe(v, state, memory):
    mems = state.memory.mems_LxBxMxD
    store = state.memory.variant_state
    cache_bytes = int(mems.nbytes) // b
    store_bytes = sum(int(x.nbytes) for x in store.values()) // b
    keys = store.get(KEYS)
    fields = {
        "state_bytes_per_row": cache_bytes + store_bytes,
        "xl_cache_bytes_per_row": cache_bytes,
        "store_bytes_per_row": store_bytes,
        "state_shape_LxBxMxD": list(mems.shape),
        "store_shape_NxBxHxSxDh": None if keys is None else list(keys.shape),
        "store_dtype": None if keys is None else str(keys.dtype),
    }
    state = state.replace(memory=fill_store(state.memory, args.seed))
    return state, fill_store(memory, args.seed + 1), fields

  def finish(v, train_run, eval_run):
    v["train"]["empty_slots_after"] = empty_slots(train_run.state().memory)
    v["eval"]["empty_slots_after"] = empty_slots(eval_run.memory())

  return common.measure_memory_variants(args, variants(args), make_config, describe, finish, log)


def format_table(res: dict) -> str:
  """The table (markdown): one row per variant, its store (S entries per row
  and head, k, retrieval), parameters, state KiB per row (XL cache plus
  store) and its ratio to the baseline's, and per step tokens/s with its
  ratio to the baseline's (wall time, and this process's CPU time), and
  XLA's temporaries and arguments (MiB)."""
  out = [
      "| variant | store S | k | retrieval | params | state KiB/row | state vs XL "
      + common.PHASE_COLUMNS,
      "|---|---:|---:|---|---:|---:|---:|" + common.PHASE_ALIGN,
  ]
  base = res["variants"][0]
  for v in res["variants"]:
    cells = [
        v["label"],
        str(v["memory_size"]) if v["memory_size"] else "-",
        str(v["num_neighbors"]) if v["num_neighbors"] else "-",
        v["retrieval"] or "-",
        f"{v['n_params']:,}",
        f"{v['state_bytes_per_row'] / 1024:,.1f}",
        f"{v['state_bytes_per_row'] / base['state_bytes_per_row']:,.1f}x",
    ]
    out.append("| " + " | ".join(cells + common.phase_cells(v, base)) + " |")
  return "\n".join(out)


def _model_line(args: argparse.Namespace) -> str:
  return (
      common.model_description(args) + "; "
      f"memory M={args.mem_len}; kNN store of S in "
      f"{args.memory_sizes} entries at layer {args.knn_layer % args.n_layer} (of 0.."
      f"{args.n_layer - 1}), k={args.num_neighbors}, filled before timing; eval same_length "
      f"{args.same_length}"
  )


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the benchmark, prints the table; returns the exit status."""
  return common.memory_benchmark_main(
      argv, parse_args, _model_line, measure, format_table, "knn_memory"
  )


if __name__ == "__main__":
  sys.exit(main())
