r"""Which memory solves long-range synthetic tasks: a small CPU study.

    python scripts/memory_tasks.py [--out=results/memory_tasks] \
        [--workdirs=workdirs/memory_tasks] [--seeds=1,2] \
        [--tasks=copy,reverse[,associative_retrieval]] [--pairs=2,4,8] \
        [--distances=one,two] [--memories=xl,tokens,compressive,none[,armt]] \
        [--batches=N] [--steps=example|segment] [--quick] [--report_only] [--reuse]

The copy and reverse tasks of the Recurrent Memory Transformer (Bulatov,
Kuratov, Burtsev 2022, arXiv 2207.06881, Sec. 4; ``data.dataset=
"synthetic:copy|reverse"``, docs/guide/synthetic_tasks.md) at a CPU size:
``S`` = 8 input symbols drawn from 4 (``synthetic_num_tokens`` 6), 2,000 /
200 / 500 train / valid / test examples.  Copy's example is 3 S = 24
positions (answer: the input twice, 2 S), reverse's 2 S = 16 (answer: S).

Two distances, by the segment length ``tgt_len``:

  one   tgt_len = S: the input is one segment, the answer starts in the next
  two   tgt_len = S / 2: the input spans two segments; parts of the answer
        lie two or more segments back (reverse's last answer segment reads
        the first input segment, three back)

Four memories of the same size M = S / 2 = 4 vectors per layer (smaller than
the input: the memory must select or compress):

  xl           Transformer-XL's cache, ``mem_len`` = M (stop-gradient)
  tokens       M memory tokens (``num_mem_tokens`` = M, ``mem_len`` 0, read and
               write tokens, ``mem_at_end``, ``read_mem_from_cache``), trained
               through every segment of the example (``mem_backprop_depth`` =
               segments - 1, ``bptt_bp``: one update per batch of whole
               examples, as the authors' ``train_synthetic.py``)
  compressive  the Compressive Transformer's memory (Rae et al. 2020): ``mem_len``
               M / 2 + ``cmem_len`` M / 2 slots at ratio 2 (1D conv)
  none         no memory (``mem_len`` 0): chance, 1 in 4 per answer token (its
               first seed only: it is chance whatever the seed)

and, not in the defaults (``--memories=...,armt``):

  armt         the Associative Recurrent Memory Transformer's memory (Rodkin et
               al. 2024, ``model.memory="armt"``, docs/guide/armt.md): M memory
               tokens writing an associative matrix per layer, ``d_mem`` 1,
               ``mem_len`` 0 (as its authors), trained through whole examples
               as the tokens (its writes learn only through backpropagation
               across segments).  Its state per layer is d_key x d_model +
               d_key floats with d_key = 6 d_mem: at d_mem 1, 6 x 64 + 6 = 390
               floats (1,560 bytes), the nearest to the others' M x d_model =
               256 (1,024 bytes); d_mem 0 does not exist, d_mem 2 is 780.

The task ``associative_retrieval`` (``--tasks=...,associative_retrieval``,
not in the defaults; the RMT paper's Sec. 4 retrieval, ``data.dataset=
"synthetic:associative_retrieval"``): K key-value pairs, then a query key,
the answer its value (one token; chance 1 in 10 digits without memory), for
each K of ``--pairs`` (run names ``retrieval_k{K}_...``).  Its example is
2 K + 2 positions; it always runs at distance *pair*: ``tgt_len`` = 2, one
pair per segment, the query alone in the last segment (K + 1 segments; the
authors' ``run_retrieval.sh``), ``--distances`` applying to copy and reverse
only.  10,000 / 200 / 500 train / valid / test examples (more distinct
examples than copy's 2,000: 800 batches see each about 2.5 times).  The XL
cache of M = 4 positions holds the last 2 pairs.

Every run is the same tiny model (2 layers, d_model 64, 2 heads of 32,
d_inner 128, no dropout; the rest of ``configs/copy_rmt.py``), batch 32,
Adam at 1e-3 (cosine to 3e-4, no warmup, clip 0.25), and sees the same
examples: ``--batches`` batches of 32 whole examples, and (``--steps=example``,
the default) takes the same optimizer steps: every memory one step per
batch of whole examples (``train.mem_backprop_depth`` = segments - 1,
``bptt_bp``; a stop-gradient memory's gradient stays in its segment).
``--steps=segment`` is the earlier studies' setting (``results/memory_tasks``
was made with it): the memory tokens and ARMT one step per batch of
examples, the other memories one step per segment (a segment without
answer positions a step with a zero gradient), ``--batches`` x segments steps.
Each run is then scored with ``--mode=eval``: ``answer_token_accuracy``
(teacher-forced, per answer token) and ``answer_accuracy`` (whole answers
right) on the test split.

Writes ``results.json`` (every number, the commands, wall times, the
machine) and ``REPORT.md`` into ``--out``; a hand-written ``FINDINGS.md``
there is left alone and linked.  Trained workdirs are kept in ``--workdirs``
(a rerun resumes them).  ``--quick``: copy at distance two, every memory,
one seed, 3 batches, for the tests; its numbers mean nothing.

``--mem=M`` sets every memory's M (default 4; ARMT's state does not
depend on it, its memory tokens are M).  ``--quick`` with ``--memories``
or ``--tasks`` given runs those instead (the tests: armt, and
associative_retrieval with ``--pairs=2``).

The committed study (results/memory_tasks/) is this script's defaults of
its time (800 batches, seeds 1 and 2, ``--steps=segment``), then a longer run of the memories at distance
two:

    python scripts/memory_tasks.py
    python scripts/memory_tasks.py --out=results/memory_tasks/longer \
        --workdirs=workdirs/memory_tasks_longer --batches=3000 --distances=two \
        --memories=xl,tokens,compressive --seeds=1,2 [--reuse]

The ARMT study (results/armt/):

    python scripts/memory_tasks.py --out=results/armt --workdirs=workdirs/armt \
        --tasks=associative_retrieval,copy --pairs=2,4,8 --distances=two \
        --memories=xl,tokens,armt,none --seeds=1,2
    python scripts/memory_tasks.py --out=results/armt/longer \
        --workdirs=workdirs/armt_longer --tasks=associative_retrieval --pairs=2 \
        --memories=xl,tokens,armt --seeds=1,2 --batches=3000 [--reuse]
    python scripts/memory_tasks.py --out=results/armt/mem6 --workdirs=workdirs/armt_mem6 \
        --tasks=associative_retrieval --pairs=2,4 --memories=xl,tokens --seeds=1,2 --mem=6
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reproduce_wt2's helpers (machine, _run, _shown)
import reproduce_wt2 as study  # noqa: E402

from transformer_xl.model import config as model_config_lib  # noqa: E402

CONFIG = REPO / "configs" / "copy_rmt.py"

SEQ_LEN = 8  # S, the input symbols
NUM_TOKENS = 6  # the vocabulary: symbols 2..5 (4 of them), 0 and 1 the pad and the marker
MEM = SEQ_LEN // 2  # M, every memory's size in vectors per layer
BATCH = 32
BATCHES = 800  # batches of whole examples each run sees (--batches)
TASKS = ("copy", "reverse")  # the default --tasks
ALL_TASKS = (*TASKS, "associative_retrieval")
DISTANCES = {"one": SEQ_LEN, "two": SEQ_LEN // 2}  # distance -> tgt_len (copy, reverse)
MEMORIES = ("xl", "tokens", "compressive", "none")  # the default --memories
ALL_MEMORIES = (*MEMORIES, "armt")
SEEDS = (1, 2)
PAIRS = (2, 4, 8)  # associative retrieval's K (--pairs)
RETRIEVAL_TGT = 2  # associative retrieval's tgt_len: one pair per segment (distance "pair")
ARMT_D_MEM = 1  # d_key = 6: 390 floats per layer, the nearest to M x d_model = 256
D_MODEL = 64

# Example length E (positions a model reads) per task; an example is E / tgt_len segments.
EXAMPLE_LEN = {"copy": 3 * SEQ_LEN, "reverse": 2 * SEQ_LEN}


def pairs_of(task: str) -> int:
  """K of a retrieval task's name (``retrieval_k4``); 0 for copy and reverse."""
  return int(task.split("_k")[1]) if task.startswith("retrieval_k") else 0


def example_len(task: str) -> int:
  k = pairs_of(task)
  return 2 * k + 2 if k else EXAMPLE_LEN[task]


def tgt_len(task: str, distance: str) -> int:
  return RETRIEVAL_TGT if pairs_of(task) else DISTANCES[distance]


def state_floats(memory: str) -> int:
  """Floats of a memory's state per layer (and per row of the batch)."""
  if memory == "armt":  # the matrix d_key x d_model and the normaliser d_key
    d_key = 6 * ARMT_D_MEM
    return d_key * D_MODEL + d_key
  return 0 if memory == "none" else MEM * D_MODEL  # xl, tokens, compressive: M vectors


MODEL = [
    "--config.model.n_layer=2",
    "--config.model.d_model=64",
    "--config.model.n_head=2",
    "--config.model.d_head=32",
    "--config.model.d_inner=128",
    "--config.model.dropout=0.0",
]
DATA = [
    f"--config.data.synthetic_seq_len={SEQ_LEN}",
    f"--config.data.synthetic_num_tokens={NUM_TOKENS}",
    "--config.data.synthetic_train_size=2000",
    "--config.data.synthetic_valid_size=200",
    "--config.data.synthetic_test_size=500",
]
QUICK_DATA = [
    f"--config.data.synthetic_seq_len={SEQ_LEN}",
    f"--config.data.synthetic_num_tokens={NUM_TOKENS}",
    "--config.data.synthetic_train_size=64",
    "--config.data.synthetic_valid_size=16",
    "--config.data.synthetic_test_size=16",
]

# The authors' results (their experiment_results/short_synthetic+MT.csv, test accuracy per
# answer token, greedy decoding for copy and reverse): seq_len 24, 10 symbols, 4 layers,
# d_model 128, batch 32, Adam 1e-4, 400,000-900,000 steps.  (task, segments, tgt_len, memory)
# -> (Transformer-XL runs, RMT runs).
PAPER = [
    ("copy", 6, 12, 6, "0.657, 0.298, 0.355, 0.856", "1, 1, 1, 1"),
    ("copy", 6, 12, 12, "0.998, 0.904, 1", "1, 1, 1 (3 more runs: 0.10)"),
    ("copy", 6, 12, 0, "0.102 (no memory)", ""),
    ("reverse", 4, 12, 6, "0.832, 0.800, 0.782, 0.784", "1, 1, 1"),
    ("reverse", 4, 12, 12, "0.877, 0.872, 0.833", "1, 1, 1 (3 more runs: 0.10)"),
]


def segments(task: str, distance: str) -> int:
  """Segments per example of ``task`` at ``distance``."""
  return example_len(task) // tgt_len(task, distance)


def data_flags(task: str, quick: bool) -> list[str]:
  """The data settings of ``task`` (a retrieval task's own: its pairs and sizes)."""
  k = pairs_of(task)
  if not k:
    return QUICK_DATA if quick else DATA
  sizes = (64, 16, 16) if quick else (10_000, 200, 500)
  return [
      f"--config.data.synthetic_num_pairs={k}",
      *(
          f"--config.data.synthetic_{split}_size={n}"
          for split, n in zip(("train", "valid", "test"), sizes)
      ),
  ]


def run_flags(
    task: str, distance: str, memory: str, seed: int, batches: int, per_example: bool = True
) -> list[str]:
  """The config overrides of one run on top of ``configs/copy_rmt.py:xl`` (or
  ``:rmt`` for the memory tokens), its evaluation as trained included;
  ``per_example``: every memory one step per batch of whole examples (equal
  optimizer steps), else tokens and armt only (the earlier studies')."""
  tgt, n_seg = tgt_len(task, distance), segments(task, distance)
  mem_len = {"xl": MEM, "tokens": 0, "compressive": MEM // 2, "none": 0, "armt": 0}[memory]
  whole = memory in ("tokens", "armt") or per_example  # trained through whole examples
  steps = batches if whole else batches * n_seg
  dataset = "associative_retrieval" if pairs_of(task) else task
  flags = [
      f"--config.data.dataset=synthetic:{dataset}",
      *MODEL,
      f"--config.model.tgt_len={tgt}",
      f"--config.model.mem_len={mem_len}",
      f"--config.eval.tgt_len={tgt}",
      f"--config.eval.mem_len={mem_len}",
      f"--config.train.num_steps={steps}",
      f"--config.train.global_batch={BATCH}",
      f"--config.eval.global_batch={BATCH}",
      "--config.train.learning_rate=1e-3",
      "--config.train.min_lr=3e-4",
      f"--config.train.seed={seed}",
      f"--config.train.log_every={max(1, steps // 10)}",
      "--config.train.eval_every=0",
      f"--config.checkpoint.every_steps={steps}",
  ]
  if whole and n_seg > 1 and memory not in ("tokens", "armt"):  # a stop-gradient memory
    flags += [f"--config.train.mem_backprop_depth={n_seg - 1}", "--config.train.bptt_bp=True"]
  if memory == "tokens":
    flags += [
        f"--config.model.tokens.num_mem_tokens={MEM}",
        f"--config.train.mem_backprop_depth={n_seg - 1}",
        "--config.train.bptt_bp=True",
    ]
  elif memory == "armt":
    flags += [
        "--config.model.memory=armt",
        f"--config.model.armt.num_mem_tokens={MEM}",
        f"--config.model.armt.d_mem={ARMT_D_MEM}",
        f"--config.train.mem_backprop_depth={n_seg - 1}",
        "--config.train.bptt_bp=True",
    ]
  elif memory == "compressive":
    flags += [
        "--config.model.memory=compressive",
        f"--config.model.compressive.cmem_len={MEM // 2}",
        "--config.model.compressive.cmem_ratio=2",
        "--config.model.compressive.cmem_fn=conv",
    ]
  return flags


def run_one(
    task: str,
    distance: str,
    memory: str,
    seed: int,
    batches: int,
    quick: bool,
    workdirs: Path,
    logs: Path,
    per_example: bool = True,
) -> dict:
  """Trains (resuming) and evaluates one run; its numbers."""
  name = run_name(task, distance, memory, seed)
  data = data_flags(task, quick)
  workdir = workdirs / name
  variant = "rmt" if memory == "tokens" else "xl"
  base = [sys.executable, "-m", "transformer_xl.main", f"--config={CONFIG}:{variant}"]
  flags = run_flags(task, distance, memory, seed, batches, per_example)
  train = [*base, f"--workdir={workdir}", *data, *flags]
  train_s = study._run(train, logs / f"train_{name}.log")
  evaluate = [*train, "--mode=eval"]
  eval_s = study._run(evaluate, logs / f"eval_{name}.log")
  results = json.loads((workdir / "eval_results.json").read_text())
  config = json.loads((workdir / "config.json").read_text())
  losses = study.train_losses(workdir)
  model = model_config_lib.flat_fields(
      config["model"], complete=True
  )  # defaults filled; earlier versions' flat keys too
  return {
      "name": name,
      "task": task,
      "distance": distance,
      "memory": memory,
      "seed": seed,
      "tgt_len": config["model"]["tgt_len"],
      "segments": segments(task, distance),
      "mem_len": config["model"]["mem_len"],
      "cmem_len": model["compressive.cmem_len"],
      "num_mem_tokens": model[
          "armt.num_mem_tokens" if model["memory"] == "armt" else "tokens.num_mem_tokens"
      ],
      "mem_backprop_depth": config["train"]["mem_backprop_depth"],
      "num_steps": config["train"]["num_steps"],
      "batches": batches,
      **(
          {
              "pairs": pairs_of(task),
              "d_mem": model["armt.d_mem"] if model["memory"] == "armt" else None,
              "state_floats_per_layer": state_floats(memory),
          }
          if pairs_of(task) or memory == "armt"
          else {}
      ),
      "train_loss": losses,
      "test": {k: results["test"][k] for k in EVAL_KEYS if k in results["test"]},
      "valid": {k: results["valid"][k] for k in EVAL_KEYS if k in results["valid"]},
      "train_command": study._shown(train),
      "eval_command": study._shown(evaluate),
      "train_wall_s": train_s,
      "eval_wall_s": eval_s,
  }


# What a run keeps of its eval_results.json splits (greedy_token_accuracy: --mode=eval's
# greedy decoding, the paper's measure; runs made before it was computed lack it).
EVAL_KEYS = (
    "answer_token_accuracy",
    "answer_accuracy",
    "greedy_token_accuracy",
    "examples",
    "loss_nats",
)


def run_name(task: str, distance: str, memory: str, seed: int) -> str:
  return f"{task}_{'pair' if pairs_of(task) else distance}_{memory}_s{seed}"


def _task_order(task: str) -> tuple:
  k = pairs_of(task)
  return (len(TASKS), k) if k else (TASKS.index(task), 0)


def _mean(xs: list[float]) -> str:
  return f"{statistics.fmean(xs):.3f}" if xs else "-"


def report(res: dict[str, Any], out: Path) -> str:
  """REPORT.md from ``results.json``'s contents."""
  m = res["machine"]

  def order(r: dict) -> tuple:
    return (
        _task_order(r["task"]),
        [*DISTANCES, "pair"].index(r["distance"]),
        ALL_MEMORIES.index(r["memory"]),
        r["seed"],
    )

  runs = {r["name"]: r for r in sorted(res["runs"].values(), key=order)}
  greedy = any("greedy_token_accuracy" in r["test"] for r in runs.values())
  retrieval = sorted({pairs_of(r["task"]) for r in runs.values()} - {0})
  copy_reverse = any(not pairs_of(r["task"]) for r in runs.values())
  present = [m for m in ALL_MEMORIES if any(r["memory"] == m for r in runs.values())]
  lines = [
      "# Which memory solves long-range synthetic tasks (CPU study)",
      "",
      f"Measured on {res['date']} with `{res['command']}` on {m['cpu']} ({m['cores']} cores, "
      f"CPU only, shared with other jobs; load average {m['load_average_at_start'][0]:.1f} at "
      f"the start), jax {m['jax']}; wall time {res['wall_s'] / 60:.0f} min"
      + "".join(
          f", after `{e['command']}` ({e['date']}, {e.get('wall_s', 0) / 60:.0f} min), whose "
          "runs it kept"
          for e in res.get("earlier", [])
      )
      + ".  Every number below is in `results.json`, every run's log in `logs/`."
      + ("  **--quick run: the numbers mean nothing.**" if res["quick"] else ""),
      "",
      (
          f"Copy and reverse of S = {SEQ_LEN} symbols of {NUM_TOKENS - 2} (chance: "
          f"{1 / (NUM_TOKENS - 2):.2f} per answer token), 2,000 training examples; every memory "
          if copy_reverse
          else "Every memory "
      )
      + f"holds M = {MEM} vectors per layer"
      + (" (ARMT: its associative matrix, see below)" if "armt" in present else "")
      + f"; 2 layers, d_model 64; {res['batches']} batches of "
      f"{BATCH} whole examples per run (the memory tokens: one step per batch; the others: "
      "one step per segment), Adam at 1e-3.  "
      + (
          "Distance *one*: tgt_len = S (the answer starts "
          f"one segment after the input); *two*: tgt_len = S / 2 = {SEQ_LEN // 2} (the input "
          "spans two segments).  "
          if copy_reverse
          else ""
      )
      + "Accuracies on the 500 test examples, `--mode=eval`: *token* = "
      "`answer_token_accuracy` (teacher-forced, per answer token), *exact* = "
      "`answer_accuracy` (whole answer right)"
      + (
          ", *greedy* = `greedy_token_accuracy` (per answer token, the answer decoded by the "
          "model itself: the paper's measure)"
          if greedy
          else ""
      )
      + ".  How the study is built: `scripts/memory_tasks.py`'s docstring.",
      *(_extension_lines(retrieval, present) if retrieval or "armt" in present else []),
      "",
      "## Mean over seeds",
      "",
      "| task | distance | tgt_len | segments | memory | seeds | token acc | exact acc |"
      + (" greedy acc |" if greedy else ""),
      "|---|---|---:|---:|---|---:|---:|---:|" + ("---:|" if greedy else ""),
  ]
  groups: dict[tuple, list[dict]] = {}
  for r in runs.values():
    groups.setdefault((r["task"], r["distance"], r["memory"]), []).append(r)
  for (task, distance, memory), rs in groups.items():
    greedy_accs = [
        r["test"]["greedy_token_accuracy"] for r in rs if "greedy_token_accuracy" in r["test"]
    ]
    lines.append(
        f"| {task} | {distance} | {rs[0]['tgt_len']} | {rs[0]['segments']} | {memory} | "
        f"{len(rs)} | {_mean([r['test']['answer_token_accuracy'] for r in rs])} | "
        f"{_mean([r['test']['answer_accuracy'] for r in rs])} |"
        + (f" {_mean(greedy_accs)} |" if greedy else "")
    )
  lines += [
      "",
      "## Every run",
      "",
      "| run | mem_len | cmem_len | memory tokens | steps | first -> last train loss "
      "| test token acc | test exact acc | valid token acc | train wall | eval wall |",
      "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
  ]
  for r in runs.values():
    loss = r["train_loss"]
    curve = f"{loss[0][1]:.3f} -> {loss[-1][1]:.3f}" if loss else "-"
    lines.append(
        f"| {r['name']} | {r['mem_len']} | {r['cmem_len']} | {r['num_mem_tokens']} | "
        f"{r['num_steps']} | {curve} | {r['test']['answer_token_accuracy']:.3f} | "
        f"{r['test']['answer_accuracy']:.3f} | {r['valid']['answer_token_accuracy']:.3f} | "
        f"{r['train_wall_s']:.0f} s | {r['eval_wall_s']:.0f} s |"
    )
  lines += [
      "",
      "The training loss is the logged mean over steps (for the one-step-per-segment "
      "memories it averages in the segments without answer positions, which log 0): compare "
      "it within a memory, not across.",
      "",
      "## The authors' results, at their scale",
      "",
      "Bulatov et al. 2022, their `experiment_results/short_synthetic+MT.csv` (test accuracy "
      "per answer token, greedy decoding; seq_len 24 of 10 symbols, 4 layers, d_model 128, "
      "batch 32, Adam at 1e-4, 400,000 to 900,000 steps; one number per seed):",
      "",
      "| task | segments (tgt_len) | memory | Transformer-XL | RMT (memory tokens) |",
      "|---|---|---:|---|---|",
  ]
  for task, n_seg, tgt, mem, xl, rmt in PAPER:
    lines.append(f"| {task} | {n_seg} ({tgt}) | {mem} | {xl} | {rmt or '-'} |")
  if retrieval:
    lines.append(
        "| retrieval, K = 4 (their `run_retrieval.sh`: 6 layers, d_model 64) | 5 (2) | 2 | "
        "0.965 - 0.999 | 0.922 - 0.989 (3 more runs: 0.109) |"
    )
  lines += [
      "",
      "Commands (each run trained, then evaluated with the same flags and `--mode=eval`):",
      "",
  ]
  for r in runs.values():
    lines.append(f"- {r['name']}: `{r['train_command']}`")
  if (out / "FINDINGS.md").exists():
    lines += ["", "What this shows and what it does not, by hand: [FINDINGS.md](FINDINGS.md)."]
  return "\n".join(lines) + "\n"


def _extension_lines(retrieval: list[int], present: list[str]) -> list[str]:
  """The report's paragraph on associative retrieval and ARMT (absent from the
  copy/reverse study's report)."""
  lines = [""]
  if retrieval:
    lines.append(
        "Associative retrieval (`synthetic:associative_retrieval`) with K = "
        + ", ".join(map(str, retrieval))
        + " key-value pairs, then a query key; the answer is its value, one token (chance "
        "without memory: 0.1, one of 10 digits; token and exact accuracy are the same "
        f"number).  tgt_len = {RETRIEVAL_TGT}: one pair per segment, the query alone in the "
        "last (K + 1 segments, example 2 K + 2 positions; distance *pair*); 10,000 / 200 / "
        f"500 examples.  The XL cache of M = {MEM} positions holds the last {MEM // 2} pairs "
        "(its two layers can relay a little further)."
    )
  d_key = 6 * ARMT_D_MEM
  if "armt" in present:
    lines.append(
        f"*armt*: ARMT's associative memory (`model.memory=armt`, {MEM} memory tokens, "
        f"d_mem {ARMT_D_MEM}, correction on, `mem_len` 0), trained through whole examples as "
        "the memory tokens (one step per batch)."
    )
  lines += [
      "",
      "State per layer and row (float32): "
      + "; ".join(
          f"*{m}* {state_floats(m)} floats = {4 * state_floats(m):,} bytes"
          + (
              f" (d_key x d_model + d_key = {d_key} x {D_MODEL} + {d_key}; d_key = 6 d_mem,"
              " the smallest ARMT state there is)"
              if m == "armt"
              else f" ({MEM} x {D_MODEL})"
              if m != "none"
              else ""
          )
          for m in present
      )
      + ".",
  ]
  return lines


def _choice(value: str, allowed, what: str) -> list:
  items = [x for x in value.split(",") if x]
  bad = [x for x in items if x not in allowed]
  if bad or not items:
    raise ValueError(f"--{what}={value!r}: choose from {list(allowed)}.")
  return items


def main(argv: list[str] | None = None) -> int:
  global MEM  # noqa: PLW0603  (--mem: every run's and the report's M)
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(REPO / "results" / "memory_tasks"))
  p.add_argument("--workdirs", default=str(REPO / "workdirs" / "memory_tasks"))
  p.add_argument("--tasks", default=None, help=f"of {ALL_TASKS}; default {','.join(TASKS)}")
  p.add_argument("--pairs", default=",".join(map(str, PAIRS)), help="associative retrieval's K")
  p.add_argument("--distances", default=",".join(DISTANCES), help="copy and reverse's")
  p.add_argument(
      "--memories", default=None, help=f"of {ALL_MEMORIES}; default {','.join(MEMORIES)}"
  )
  p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="train.seed values")
  p.add_argument("--batches", type=int, default=BATCHES, help="batches of examples per run")
  p.add_argument("--mem", type=int, default=MEM, help="M, the memories' vectors per layer")
  p.add_argument("--quick", action="store_true", help="a smoke run: copy, distance two, 3 batches")
  p.add_argument(
      "--steps",
      choices=("example", "segment"),
      default="example",
      help="example: every memory one step per batch of examples (equal steps); segment: "
      "the earlier studies' (tokens and armt per example, the others per segment)",
  )
  p.add_argument("--report_only", action="store_true", help="REPORT.md from results.json")
  p.add_argument("--reuse", action="store_true", help="keep the runs already in results.json")
  a = p.parse_args(argv)
  out, workdirs = Path(a.out), Path(a.workdirs)
  if a.report_only:
    res = json.loads((out / "results.json").read_text())
    MEM = res.get("mem", MEM)
    (out / "REPORT.md").write_text(report(res, out))
    return 0
  try:
    if a.quick:  # --tasks and --memories as given (the defaults: copy, the four memories)
      a.tasks, a.distances, a.seeds, a.batches = a.tasks or "copy", "two", "1", 3
    tasks = _choice(a.tasks or ",".join(TASKS), ALL_TASKS, "tasks")
    distances = _choice(a.distances, DISTANCES, "distances")
    memories = _choice(a.memories or ",".join(MEMORIES), ALL_MEMORIES, "memories")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    if a.mem < 2 or a.mem % 2:
      raise ValueError(f"--mem={a.mem}: an even number >= 2 (the compressive memory's halves).")
    MEM = a.mem
    if not seeds or a.batches < 1:
      raise ValueError("--seeds needs at least one integer and --batches must be >= 1.")
    pairs = [int(k) for k in a.pairs.split(",") if k]
    if "associative_retrieval" in tasks and (not pairs or not all(1 <= k <= 26 for k in pairs)):
      raise ValueError(f"--pairs={a.pairs!r}: integers from 1 to 26.")
    # associative_retrieval -> one task per K, at distance "pair" only.
    tasks = [
        t
        for task in tasks
        for t in ([f"retrieval_k{k}" for k in pairs] if task == "associative_retrieval" else [task])
    ]
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  out.mkdir(parents=True, exist_ok=True)
  logs = out / "logs"
  logs.mkdir(exist_ok=True)
  workdirs.mkdir(parents=True, exist_ok=True)
  t0 = study._now()
  res: dict[str, Any] = {
      "command": " ".join(["python scripts/memory_tasks.py", *(argv or sys.argv[1:])]),
      "date": datetime.date.today().isoformat(),
      "quick": a.quick,
      "batches": a.batches,
      **({"mem": MEM} if MEM != 4 else {}),  # --mem (absent: 4)
      "machine": study.machine(),
      "runs": {},
      "earlier": [],  # --reuse: the invocations whose runs were kept
  }
  done = {}
  if a.reuse and (out / "results.json").exists():
    before = json.loads((out / "results.json").read_text())
    done = before["runs"]
    res["earlier"] = before.get("earlier", []) + [
        {k: before[k] for k in ("command", "date", "wall_s", "machine") if k in before}
    ]
  # Seeds outermost: a study cut short still has every cell once.  No memory is
  # chance whatever the seed: its first seed only (the CPU budget).
  for i, seed in enumerate(seeds):
    for task in tasks:
      for distance in ["pair"] if pairs_of(task) else distances:
        for memory in memories:
          if memory == "none" and i > 0:
            continue
          name = run_name(task, distance, memory, seed)
          if name in done and done[name]["batches"] == a.batches:
            res["runs"][name] = done[name]
            continue
          r = run_one(
              task, distance, memory, seed, a.batches, a.quick, workdirs, logs, a.steps == "example"
          )
          res["runs"][name] = r
          res["wall_s"] = study._now() - t0
          (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
          print(
              f"{name}: test token acc {r['test']['answer_token_accuracy']:.3f}, exact "
              f"{r['test']['answer_accuracy']:.3f} ({r['train_wall_s'] + r['eval_wall_s']:.0f} s)",
              flush=True,
          )
  res["wall_s"] = study._now() - t0
  (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
  (out / "REPORT.md").write_text(report(res, out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
