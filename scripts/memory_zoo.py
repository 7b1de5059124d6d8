r"""The five memories at equal budget on the same long-context tasks: a CPU study.

    python scripts/memory_zoo.py --noise_train=GLOBS --noise_valid=GLOBS --noise_test=GLOBS \
        [--out=results/memory_zoo] [--workdirs=workdirs/memory_zoo] [--seeds=1,2] \
        [--tasks=copy,reverse,retrieval,passkey,qa1,qa2] \
        [--memories=xl,compressive,tokens,knn,armt,none] [--batches=N] [--jobs=1] \
        [--steps=example|segment] \
        [--quick] [--report_only]

Memories (``model.memory``; issue 52), each at the **same budget**: the
recurrent state one batch row carries from segment to segment, summed over
the layers, as Transformer-XL's cache of M = ``--mem`` (4) vectors per
layer holds it: L M D 4 bytes = 2 x 4 x 64 x 4 = 2,048 bytes.  Every size
below is ``benchmarks/memory_variants.py``'s ``budget`` (imported, not
rewritten):

  xl           Transformer-XL's cache, ``mem_len`` M (stop-gradient)
  compressive  the Compressive Transformer (Rae et al. 2020): ``mem_len`` M - Nc
               and Nc = M / 2 compressed slots at rate 2, ``max_pool`` (no
               parameters: the 1D conv would add 2 D^2 + D per layer, +24%)
  tokens       the Recurrent Memory Transformer's memory tokens (Bulatov et al.
               2022): N = L M tokens (one set for the whole model), ``mem_len``
               0, read and write tokens, ``mem_at_end`` (``configs/copy_rmt.py:rmt``)
  knn          Memorizing Transformers' kNN store (Wu et al. 2022) at the top layer,
               ``mem_len`` 0: S = L M D / (2 H Dh) entries (keys and values of
               every head), k = ``KNN_NEIGHBORS`` neighbours, bucketed retrieval
  armt         the Associative Recurrent Memory Transformer (Rodkin et al. 2024):
               M memory tokens writing a d_key x D matrix per layer, d_mem the
               nearest to the budget (``budget``), ``mem_len`` 0
  none         no memory (``mem_len`` 0), the control, first seed only

**Equal optimizer steps** (``--steps=example``, the default): every memory
is trained on whole examples (``train.mem_backprop_depth`` = segments - 1,
``bptt_bp``: one update per batch of examples, the loss of all its answer
positions), as ``scripts/memory_tasks.py`` trains tokens and armt, whose
writes learn only through the gradient across segments; a stop-gradient
memory (xl, compressive, knn, none) keeps each segment's gradient inside it.
Every run then takes ``batches`` steps on the same examples.  ``--steps=segment``
is the earlier studies' setting (``results/memory_zoo`` was made with it):
tokens and armt as above, the others one step per segment (a segment
without answer positions a step with a zero gradient), batches x segments
steps: the same examples, unequal optimizer steps.

Model: ``scripts/memory_tasks.py``'s (2 layers, d_model 64, 2 heads of 32,
d_inner 128, no dropout, the rest of ``configs/copy_rmt.py``), batch 32,
Adam at 1e-3, cosine to 3e-4, no warmup, clip 0.25.

Tasks and distances (the name of a distance is the column of its table):

  copy, reverse  ``synthetic:copy|reverse``, S = 8 symbols of 4, 2,000 / 200 /
                 500 examples (``memory_tasks.py``'s).  *one*: tgt_len = S = 8
                 (the answer starts one segment after the input); *two*:
                 tgt_len = S / 2 = 4 (the input spans two segments, parts of
                 the answer lie two or more segments back).
  retrieval      ``synthetic:associative_retrieval``, K = 4 key-value pairs then
                 a query key, the answer its value (chance 1 in 10); 10,000 /
                 200 / 500.  *whole*: tgt_len = 2 K + 2 = 10, the example in one
                 segment (no memory needed: can the model do the task at all);
                 *pair*: tgt_len = 2, one pair per segment, the query alone in
                 the last (5 segments; the asked pair 1 to 4 segments back, the
                 XL cache holds the last 2 pairs).
  passkey        ``synthetic:passkey``, E = 128 positions (word tokens, 5-digit
                 key), tgt_len 32 (4 segments), trained with the key at a random
                 depth (``synthetic_passkey_depth=-1``), evaluated at three fixed
                 depths: *same*: depth 58 (= F, the key 17 positions before the
                 question, in its segment); *one_back*: depth 29 (46 positions,
                 the previous segment); *two_back*: depth 0 (75 positions, two
                 segments back).  10,000 / 200 / 500 examples.
  qa1, qa2       ``babilong:qa1|qa2`` on bAbI-format stand-in files
                 (``babi_like.write_task``: not the benchmark's files, not its
                 numbers) with the background text of ``--noise_*`` (each file
                 one document), a byte-level BPE of ``BPE_VOCAB`` tokens trained
                 with ``tokenizers`` on the noise train text and the bAbI train
                 files (written once into ``--workdirs``/_babilong/); samples of
                 ``BABILONG_SAMPLE`` = 256 tokens (context 236 + question and
                 answer: ``babilong_qa_margin`` 20), tgt_len 64 (4 segments),
                 samples of at most ``MAX_FACTS`` = 4 lines (3 facts and the
                 question); one run per distance, trained and scored with the
                 facts placed by ``babilong_task_start_pct`` .. ``task_end_pct``
                 (positions counted in the background's tokens, at sentence
                 boundaries; the background's sentences are then at most half
                 the range, 32 tokens, the authors' cap): *last*: 0.75 .. 1.0
                 (the facts start at context token 177 or later: the
                 question's segment or the one before); *first*: 0 .. 0.25
                 (they start before token 59: the first segment, 3 segments
                 before the question).  1,000 / 50 / 200 samples.  Scored by
                 ``babilong_accuracy`` (the authors' ``compare_answers``);
                 chance is about 1 in 6 places.

Each run is trained once, then scored with ``--mode=eval`` on the test split at
each of its task's distances (copy, reverse and retrieval train one run per
distance: the distance is the segment length).  The accuracy of the tables is
*greedy*: ``greedy_token_accuracy`` (answer tokens decoded right by the model
itself, the RMT paper's measure) for the synthetic tasks, ``babilong_accuracy``
for BABILong; ``answer_accuracy`` (whole answers right) is in ``results.json``
and the table of every run.

Parameters are counted by the training run (its ``Model: N parameters`` line)
and compared with XL's; the state bytes per row are ``budget``'s and, as a
check, the training log's ``memory`` MiB of the checkpoint line over the batch
(4 significant digits; it includes the 4-byte ``mlen_B`` and flags).

Writes ``results.json`` and ``REPORT.md`` into ``--out`` (a hand-written
``FINDINGS.md`` there is left alone and linked), run logs into ``--out``/logs;
the trained workdirs stay in ``--workdirs``: a rerun reuses a run whose
evaluations exist (``zoo_train.json`` and ``zoo_eval_<distance>.json`` in its
workdir; "reused": true in results.json) and resumes an interrupted one.
Seeds outermost: every task's first seed finishes before any second seed
starts.  ``--jobs=2`` runs two runs at a time (their wall times then overlap).

``--quick``: qa1 at distance *last*, every memory, seed 1, 3 batches, small
data (the slow test; its numbers mean nothing).  ``--report_only``: REPORT.md
from results.json.  The committed run (results/memory_zoo/; WikiText-2's
files as the noise):

    python scripts/memory_zoo.py --jobs=2 --noise_train=.../wiki.train.tokens \
        --noise_valid=.../wiki.valid.tokens --noise_test=.../wiki.test.tokens

(``...``: the folder of WikiText-2's files, ``wiki.*.tokens``; REPORT.md
gives the exact command.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import glob
import hashlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reproduce_wt2's helpers (machine, _run, _shown)
sys.path.insert(1, str(REPO / "benchmarks"))  # common, which memory_variants imports
import memory_tasks  # noqa: E402
import reproduce_wt2 as study  # noqa: E402

CONFIG = REPO / "configs" / "copy_rmt.py"


def _load_benchmark(name: str):
  """``benchmarks/NAME.py`` loaded from its file: ``import memory_variants`` would find the
  test suite's package of the same name (``tests/memory_variants/``) when the tests load
  this script in-process."""
  spec = importlib.util.spec_from_file_location(
      f"benchmarks_{name}", REPO / "benchmarks" / f"{name}.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


memory_variants = _load_benchmark("memory_variants")

N_LAYER, D_MODEL, N_HEAD, D_HEAD = 2, 64, 2, 32  # memory_tasks.MODEL's
MEM = 4  # M, XL's cache per layer: the budget's unit (--mem)
KNN_NEIGHBORS = 4  # k: the store's S = 4 entries are all read
BATCH = memory_tasks.BATCH  # 32
MEMORIES = ("xl", "compressive", "tokens", "knn", "armt", "none")
WHOLE = ("tokens", "armt")  # trained through whole examples
TASKS = ("copy", "reverse", "retrieval", "passkey", "qa1", "qa2")
SEEDS = (1, 2)
# Batches of BATCH examples per run, by task (--batches overrides all).
BATCHES = {"copy": 800, "reverse": 800, "retrieval": 800, "passkey": 400, "qa1": 250, "qa2": 250}

SEQ_LEN = memory_tasks.SEQ_LEN  # copy/reverse S = 8
PAIRS = 4  # retrieval's K
PK_LEN, PK_DIGITS, PK_TGT = 128, 5, 32
PK_DEPTHS = {"same": 58, "one_back": 29, "two_back": 0}
BABILONG_SAMPLE, BABILONG_TGT, MAX_FACTS = 256, 64, 4
BABILONG_PLACES = {"last": (0.75, 1.0), "first": (0.0, 0.25)}
BPE_VOCAB = 1000
BABI_STORIES = (12_000, 1_200)  # train, test stories per task (babi_like.write_task, seed 0)
BABILONG_SIZES = {"train": 1000, "valid": 50, "test": 200}
QUICK_BABILONG_SIZES = {"train": 64, "valid": 8, "test": 8}

# task -> {distance: (train tgt_len, the run's key)}: a run per distinct train setting.
DISTANCES: dict[str, tuple[str, ...]] = {
    "copy": ("one", "two"),
    "reverse": ("one", "two"),
    "retrieval": ("whole", "pair"),
    "passkey": tuple(PK_DEPTHS),
    "qa1": tuple(BABILONG_PLACES),
    "qa2": tuple(BABILONG_PLACES),
}
CHANCE = {"copy": 0.25, "reverse": 0.25, "retrieval": 0.1, "passkey": 0.1, "qa1": 1 / 6}
CHANCE["qa2"] = 1 / 6

# The cost benchmark, named (not linked: the results pages are read on GitHub and on the site,
# whose paths to it differ); the site's Memories page links it.
BENCH_SECTION = '"Memory variants at equal budget" of benchmarks/results/REPORT.md'


def sizes(mem: int) -> dict:
  """``memory_variants.budget`` at this study's model and M (its argparse
  Namespace built here: the fields it reads)."""
  args = argparse.Namespace(
      n_layer=N_LAYER,
      d_model=D_MODEL,
      n_head=N_HEAD,
      d_head=D_HEAD,
      mem_len=mem,
      num_neighbors=KNN_NEIGHBORS,
  )
  return memory_variants.budget(args)


def is_babilong(task: str) -> bool:
  return task.startswith("qa")


def tgt_len(task: str, distance: str) -> int:
  if task in ("copy", "reverse"):
    return memory_tasks.DISTANCES[distance]
  if task == "retrieval":
    return 2 * PAIRS + 2 if distance == "whole" else 2
  return PK_TGT if task == "passkey" else BABILONG_TGT


def example_len(task: str) -> int:
  if task in ("copy", "reverse"):
    return memory_tasks.EXAMPLE_LEN[task]
  if task == "retrieval":
    return 2 * PAIRS + 2
  return PK_LEN if task == "passkey" else BABILONG_SAMPLE


def train_key(task: str, distance: str) -> str:
  """The training run a distance is scored on: one per distance (copy,
  reverse, retrieval: its tgt_len; BABILong: its facts' place, trained and
  scored alike); passkey: one for all depths (trained at random depths)."""
  return "mixed" if task == "passkey" else distance


def run_name(task: str, key: str, memory: str, seed: int) -> str:
  return f"{task}_{key}_{memory}_s{seed}"


def data_flags(task: str, key: str, quick: bool, babi: dict | None) -> list[str]:
  """The corpus of ``task`` (train settings: evaluations add their distance's)."""
  if task in ("copy", "reverse"):
    return [f"--config.data.dataset=synthetic:{task}", *memory_tasks.data_flags(task, quick)]
  if task == "retrieval":
    return [
        "--config.data.dataset=synthetic:associative_retrieval",
        *memory_tasks.data_flags(f"retrieval_k{PAIRS}", quick),
    ]
  if task == "passkey":
    n = (64, 16, 16) if quick else (10_000, 200, 500)
    return [
        "--config.data.dataset=synthetic:passkey",
        f"--config.data.synthetic_passkey_len={PK_LEN}",
        "--config.data.synthetic_passkey_depth=-1",
        f"--config.data.synthetic_passkey_digits={PK_DIGITS}",
        *(f"--config.data.synthetic_{s}_size={k}" for s, k in zip(("train", "valid", "test"), n)),
    ]
  assert babi is not None
  n = QUICK_BABILONG_SIZES if quick else BABILONG_SIZES
  lo, hi = BABILONG_PLACES[key]
  return [
      f"--config.data.dataset=babilong:{task}",
      f"--config.data.manual_dir={babi['dir']}",
      "--config.data.download=False",
      f"--config.data.tokenizer=pretrained:{babi['tokenizer']}",
      "--config.data.babilong_noise=text",
      f"--config.data.train_files={babi['train_files']}",
      f"--config.data.valid_files={babi['valid_files']}",
      f"--config.data.test_files={babi['test_files']}",
      f"--config.data.babilong_sample_size={BABILONG_SAMPLE}",
      f"--config.data.babilong_max_n_facts={MAX_FACTS}",
      f"--config.data.babilong_task_start_pct={lo}",
      f"--config.data.babilong_task_end_pct={hi}",
      *(f"--config.data.babilong_{s}_size={k}" for s, k in n.items()),
  ]


def eval_flags(task: str, distance: str) -> list[str]:
  """What an evaluation at ``distance`` adds to the training flags."""
  if task == "passkey":
    return [f"--config.data.synthetic_passkey_depth={PK_DEPTHS[distance]}"]
  return []


def memory_flags(
    memory: str, n_seg: int, b: dict, mem: int, per_example: bool = True
) -> tuple[int, list[str]]:
  """(mem_len, the config overrides) of ``memory`` at ``budget``'s sizes;
  ``per_example``: whole examples per step for every memory (else for
  tokens and armt only)."""
  depth = (  # through the example's segments (none where it is one segment)
      [f"--config.train.mem_backprop_depth={n_seg - 1}", "--config.train.bptt_bp=True"]
      if n_seg > 1
      else ["--config.train.mem_backprop_depth=0", "--config.train.bptt_bp=False"]
  )
  plain = depth if per_example else []  # a stop-gradient memory's steps
  if memory == "xl":
    return mem, plain
  if memory == "none":
    return 0, plain
  if memory == "compressive":
    nc = mem // 2
    return mem - nc, [
        *plain,
        "--config.model.memory=compressive",
        f"--config.model.compressive.cmem_len={nc}",
        "--config.model.compressive.cmem_ratio=2",
        "--config.model.compressive.cmem_fn=max_pool",
    ]
  if memory == "tokens":
    return 0, [f"--config.model.tokens.num_mem_tokens={b['num_mem_tokens']}", *depth]
  if memory == "knn":
    return 0, [
        *plain,
        "--config.model.memory=knn",
        f"--config.model.knn.memory_size={b['memory_size']}",
        f"--config.model.knn.num_neighbors={KNN_NEIGHBORS}",
        "--config.model.knn.layers=(-1,)",
    ]
  if memory == "armt":
    return 0, [
        "--config.model.memory=armt",
        f"--config.model.armt.num_mem_tokens={mem}",
        f"--config.model.armt.d_mem={b['d_mem']}",
        *depth,
    ]
  raise ValueError(memory)


def train_flags(
    task: str,
    key: str,
    memory: str,
    seed: int,
    batches: int,
    mem: int,
    quick: bool = False,
    per_example: bool = True,
) -> list[str]:
  tgt = tgt_len(task, key if key != "mixed" else DISTANCES[task][0])
  n_seg = example_len(task) // tgt
  mem_len, extra = memory_flags(memory, n_seg, sizes(mem), mem, per_example)
  steps = batches if memory in WHOLE or per_example else batches * n_seg
  return [
      *memory_tasks.MODEL,
      f"--config.model.tgt_len={tgt}",
      f"--config.model.mem_len={mem_len}",
      f"--config.eval.tgt_len={tgt}",
      f"--config.eval.mem_len={mem_len}",
      "--config.eval.same_length=False",
      f"--config.train.num_steps={steps}",
      f"--config.train.global_batch={BATCH}",
      f"--config.eval.global_batch={BATCH}",
      "--config.train.learning_rate=1e-3",
      "--config.train.min_lr=3e-4",
      "--config.train.warmup_steps=0",
      f"--config.train.seed={seed}",
      f"--config.train.log_every={max(1, steps // 10)}",
      "--config.train.eval_every=0",
      f"--config.checkpoint.every_steps={steps if quick else max(1, steps // 2)}",
      *extra,
  ]


# What a run keeps of each split of an evaluation (the rest is in the workdir's zoo_eval_*.json).
EVAL_KEYS = (
    "babilong_accuracy",
    "greedy_token_accuracy",
    "greedy_accuracy",
    "answer_accuracy",
    "answer_token_accuracy",
    "examples",
    "loss_nats",
)


def metric(task: str) -> str:
  """The accuracy of the tables."""
  return "babilong_accuracy" if is_babilong(task) else "greedy_token_accuracy"


def _log_number(text: str, pattern: str) -> float | None:
  m = re.search(pattern, text)
  return float(m.group(1).replace(",", "")) if m else None


def _run(cmd: list[str], log_path: Path, quick: bool) -> float:
  """``reproduce_wt2._run`` (one CPU device, the output into ``log_path``;
  its wall time, s), for ``--quick`` with XLA's backend optimisation off
  (``--xla_backend_optimization_level=0``, as the test suite: tiny programs
  whose compile is most of their time)."""
  if not quick:
    return study._run(cmd, log_path)
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  t0 = study._now()
  with open(log_path, "w") as log:
    r = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  if r.returncode:
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}); end of {log_path}:\n{tail}")
  return study._now() - t0


def run_one(spec: dict, a: argparse.Namespace, babi: dict | None, paths: dict) -> dict:
  """Trains (resuming; skipped when ``zoo_train.json`` says it finished) and
  evaluates (skipped where ``zoo_eval_<distance>.json`` exists) one run."""
  task, key, memory, seed = spec["task"], spec["key"], spec["memory"], spec["seed"]
  name = run_name(task, key, memory, seed)
  workdir, logs = paths["workdirs"] / name, paths["logs"]
  variant = "rmt" if memory == "tokens" else "xl"
  base = [sys.executable, "-m", "transformer_xl.main", f"--config={CONFIG}:{variant}"]
  batches = spec["batches"]
  train = [
      *base,
      f"--workdir={workdir}",
      *data_flags(task, key, a.quick, babi),
      *train_flags(task, key, memory, seed, batches, a.mem, a.quick, a.steps == "example"),
  ]
  reused = True
  marker = workdir / "zoo_train.json"
  if marker.exists():
    info = json.loads(marker.read_text())
    if info.get("train_command") != study._shown(train):
      raise RuntimeError(
          f"{workdir} was trained with other flags than this run's (its zoo_train.json): "
          "remove the workdir or use another --workdirs."
      )
  else:
    reused = False
    log = logs / f"train_{name}.log"
    wall = _run(train, log, a.quick)
    text = log.read_text()
    info = {
        "train_wall_s": wall,
        "n_params": _log_number(text, r"Model: ([\d,]+) parameters"),
        "state_mib": _log_number(text, r"memory ([\d.,]+) MiB\)"),
        "train_command": study._shown(train),
    }
    marker.write_text(json.dumps(info, indent=1) + "\n")
  config = json.loads((workdir / "config.json").read_text())
  losses = study.train_losses(workdir)
  evals = {}
  for distance in spec["distances"]:
    cmd = [*train, *eval_flags(task, distance), "--mode=eval"]
    path = workdir / f"zoo_eval_{distance}.json"
    if not path.exists():
      reused = False
      wall = _run(cmd, logs / f"eval_{name}_{distance}.log", a.quick)
      res = json.loads((workdir / "eval_results.json").read_text())
      path.write_text(json.dumps({"wall_s": wall, "results": res}, indent=1) + "\n")
    got = json.loads(path.read_text())
    evals[distance] = {
        "test": {k: got["results"]["test"][k] for k in EVAL_KEYS if k in got["results"]["test"]},
        "eval_wall_s": got["wall_s"],
        "eval_command": study._shown(cmd),
    }
  n_seg = example_len(task) // config["model"]["tgt_len"]
  mib = info["state_mib"]
  return {
      "name": name,
      "task": task,
      "key": key,
      "memory": memory,
      "seed": seed,
      "batches": batches,
      "tgt_len": config["model"]["tgt_len"],
      "segments": n_seg,
      "mem_len": config["model"]["mem_len"],
      "mem_backprop_depth": config["train"]["mem_backprop_depth"],
      "num_steps": config["train"]["num_steps"],
      "n_params": info["n_params"],
      "state_bytes_per_row_from_log": None if mib is None else mib * 2**20 / BATCH,
      "train_loss": losses,
      "evals": evals,
      "train_command": study._shown(train),
      "train_wall_s": info["train_wall_s"],
      "reused": reused,
  }


def prepare_babilong(a: argparse.Namespace, root: Path, tasks: list[str]) -> dict:
  """The bAbI-format stand-in files and the BPE tokenizer (written once into
  ``root``; deterministic) and the noise globs; their description."""
  from transformer_xl.data import babi_like, babilong  # noqa: PLC0415

  missing = [f for f in ("noise_train", "noise_valid", "noise_test") if not getattr(a, f)]
  if missing:
    raise ValueError(
        "BABILong needs background text: give "
        + ", ".join(f"--{f}=GLOBS" for f in missing)
        + " (e.g. WikiText-2's wiki.{train,valid,test}.tokens)."
    )
  files = {}
  for split in ("train", "valid", "test"):
    pats = [p for p in getattr(a, f"noise_{split}").split(",") if p]
    found = sorted(f for p in pats for f in glob.glob(p))
    if not found:
      raise ValueError(f"--noise_{split}={getattr(a, f'noise_{split}')!r} matches no file.")
    files[split] = [str(Path(f).resolve()) for f in found]
  babi_dir = root / "babi"
  stories = (40, 8) if a.quick else BABI_STORIES
  for task in ("qa1", "qa2"):  # both always: the tokenizer is trained on both train files
    name = f"{task}_{babilong.TASK_NAMES[task]}"
    if not (babi_dir / f"{name}_train.txt").exists():
      babi_like.write_task(babi_dir, task, train_stories=stories[0], test_stories=stories[1])
  tok_path = root / "tokenizer.json"
  if not tok_path.exists():  # babi_like.train_tokenizer: deterministic for the same texts
    texts = [Path(f).read_text(encoding="utf-8") for f in files["train"]]
    texts += [p.read_text() for p in sorted(babi_dir.glob("qa*_train.txt"))]
    tok_path.write_text(babi_like.train_tokenizer(texts, BPE_VOCAB))
  digest = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16]  # noqa: E731
  return {
      "dir": str(babi_dir),
      "tokenizer": str(tok_path),
      "tokenizer_sha256_16": digest(tok_path),
      "bpe_vocab": BPE_VOCAB,
      "stories": list(stories),
      "babi_sha256_16": {p.name: digest(p) for p in sorted(babi_dir.glob("qa*.txt"))},
      **{f"{s}_files": ",".join(files[s]) for s in files},
      "noise_files": {s: [Path(f).name for f in files[s]] for s in files},
  }


# -- report --------------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.3f}"


def _mean(xs: list[float]) -> float | None:
  return statistics.fmean(xs) if xs else None


def _setup_lines(res: dict) -> list[str]:
  b, m = res["budget"], res["machine"]
  mem = res["mem"]
  runs = list(res["runs"].values())
  params = {}
  for r in runs:
    if r["n_params"] is not None:
      params.setdefault((r["task"], r["memory"]), r["n_params"])
  lines = [
      "# The five memories at equal budget on long-context tasks (CPU study)",
      "",
      f"Measured on {res['date']} with `{res['command']}` on {m['cpu']} ({m['cores']} cores, "
      f"CPU only, shared with other jobs; load average {m['load_average_at_start'][0]:.1f} at "
      f"the start), jax {m['jax']}; wall time {res['wall_s'] / 60:.0f} min with "
      f"{res['jobs']} run(s) at a time"
      + "".join(
          f", after `{e['command']}` ({e['date']}, {e.get('wall_s', 0) / 60:.0f} min, "
          f"{e['runs']} runs finished, {e['failed']} failed), whose finished runs it reused"
          for e in res.get("earlier", [])
      )
      + ".  Every number below is in `results.json`, every "
      "run's log in `logs/`; how the study is built: `scripts/memory_zoo.py`'s docstring."
      + ("  **--quick run: the numbers mean nothing.**" if res["quick"] else ""),
      "",
      "## Setup",
      "",
      f"**Model** (every run): {N_LAYER} layers, d_model {D_MODEL}, {N_HEAD} heads of "
      f"{D_HEAD}, d_inner 128, no dropout (`scripts/memory_tasks.py`'s; the rest of "
      f"`configs/copy_rmt.py`); batch {BATCH}, Adam at 1e-3, cosine to 3e-4, no warmup, "
      "clip 0.25.  Batches of whole examples per run: "
      + ", ".join(f"{t} {n}" for t, n in res["batches"].items())
      + " (*tokens* and *armt*: one step per batch, trained through the example's "
      "segments, `mem_backprop_depth` = segments - 1; the others: one step per segment).",
      "",
      f"**Budget**: the recurrent state a batch row carries between segments, summed over "
      f"the layers, XL's cache of M = {mem} vectors per layer: L M D x 4 bytes = "
      f"{N_LAYER} x {mem} x {D_MODEL} x 4 = {b['xl_bytes']:,} bytes.  The sizes are "
      "`benchmarks/memory_variants.py`'s `budget` (imported); *from log* is the "
      "training log's checkpoint line (memory MiB over the batch, 4 significant digits; "
      "it includes `mlen_B`'s 4 bytes and the variants' flags).",
      "",
      "| memory | settings | state bytes per row | vs XL | from log | parameters "
      "(per task) | vs XL |",
      "|---|---|---:|---:|---:|---|---:|",
  ]
  settings = {
      "xl": f"mem_len {mem}, per layer",
      "compressive": f"mem_len {mem - mem // 2} + cmem_len {mem // 2} at rate 2, max_pool, "
      "per layer",
      "tokens": f"N = L M = {b['num_mem_tokens']} memory tokens (one set), mem_len 0",
      "knn": f"store S = {b['memory_size']} entries (keys and values, {N_HEAD} heads) at the "
      f"top layer, k = {KNN_NEIGHBORS}, mem_len 0",
      "armt": f"d_mem {b['d_mem']} (d_key {b['d_key']}): d_key x (D + 1) floats per layer "
      f"(the smallest ARMT state), {mem} memory tokens, mem_len 0",
      "none": "mem_len 0",
  }
  tasks = list(dict.fromkeys(r["task"] for r in runs))
  for mem_name in MEMORIES:
    rs = [r for r in runs if r["memory"] == mem_name]
    if not rs:
      continue
    nbytes = b["bytes"].get(mem_name, 0)
    logged = [r["state_bytes_per_row_from_log"] for r in rs if r["state_bytes_per_row_from_log"]]
    p_cells, d_cells = [], []
    for t in tasks:
      p, px = params.get((t, mem_name)), params.get((t, "xl"))
      if p is None:
        continue
      p_cells.append(f"{t} {p:,.0f}")
      if px:
        d_cells.append(f"{t} {100 * (p / px - 1):+.2f}%")
    spread = d_cells
    lines.append(
        f"| {mem_name} | {settings[mem_name]} | {nbytes:,} | "
        + (f"{100 * (nbytes / b['xl_bytes'] - 1):+.1f}%" if nbytes else "-")
        + f" | {f'{min(logged):,.0f}' if logged else '-'} | {'; '.join(p_cells)} | "
        + ("; ".join(spread) if spread else "-")
        + " |"
    )
  over = [
      mem_name
      for mem_name in MEMORIES
      if any(
          params.get((t, mem_name))
          and params.get((t, "xl"))
          and abs(params[(t, mem_name)] / params[(t, "xl")] - 1) > 0.01
          for t in tasks
      )
  ]
  lines += [
      "",
      (
          "Parameters within 1% of XL's: every memory but "
          + ", ".join(f"*{x}*" for x in over)
          + " (over 1%; see the table: ARMT adds per layer W_q, W_k (D x d_key-sized "
          "projections), W_v (D x D) and a gate; the memory tokens their N x D)."
          if over
          else "Parameters within 1% of XL's for every memory."
      )
      + "  ARMT's state cannot be smaller than d_key = 6 (d_mem 1): at this budget it "
      "holds more bytes than XL (the tolerance `budget` allows is half a d_key step).",
      "",
      "**Tasks and distances** (the tables' columns; precise definitions in the script's "
      "docstring):",
      "",
      f"- *copy*, *reverse*: S = {SEQ_LEN} symbols of 4 (chance 0.25 per token), 2,000 "
      "training examples.  *one*: tgt_len 8 (the answer starts one segment after the "
      "input); *two*: tgt_len 4 (the input spans two segments).  One training run per "
      "distance.",
      f"- *retrieval*: associative retrieval, K = {PAIRS} pairs (chance 0.1), 10,000 "
      "training examples.  *whole*: tgt_len 10, the example in one segment (no memory "
      "needed); *pair*: tgt_len 2, one pair per segment, the query alone in the last "
      "(5 segments; the XL cache holds the last 2 pairs).  One run per distance.",
      f"- *passkey*: E = {PK_LEN} word tokens, a {PK_DIGITS}-digit key, tgt_len {PK_TGT} "
      "(4 segments), trained with the key at a random depth and scored at three: *same* "
      "(depth 58: the key 17 positions before the question, in its segment), *one_back* "
      "(depth 29: 46 positions, the previous segment), *two_back* (depth 0: 75 positions, "
      "two segments back).  Greedy per-token accuracy over the key's digits (chance ~0.1).",
      f"- *qa1*, *qa2*: BABILong (`babilong:qa1|qa2`) on **bAbI-format stand-in files** "
      "written by `transformer_xl.data.babi_like.write_task` (not the real bAbI files: "
      "these are not the benchmark's numbers), samples of "
      f"{BABILONG_SAMPLE} tokens (context 236, tgt_len {BABILONG_TGT}, 4 segments), "
      f"stories cut to at most {MAX_FACTS} lines (3 facts and the question); one run per "
      "distance, trained and scored with the facts placed: *last* "
      "(`babilong_task_start_pct` 0.75 .. `task_end_pct` 1.0: the facts start in the last "
      "quarter of the context, the question's segment or the one before) and *first* "
      "(0 .. 0.25: in the first segment, 3 segments before the question's); "
      "`babilong_accuracy` (the authors' `compare_answers`; chance ~1/6 places).",
  ]
  if "babilong" in res:
    bb = res["babilong"]
    lines += [
        "",
        f"**BABILong data**: stand-in files of {bb['stories'][0]:,} / {bb['stories'][1]:,} "
        "train / test stories per task (seed 0; sha256 prefixes in `results.json`); the "
        f"noise ({{train, valid, test}}: {', '.join(', '.join(v) for v in bb['noise_files'].values())}; "
        'each file one document, `data.babilong_noise="text"`); a byte-level BPE of '
        f"{bb['bpe_vocab']:,} tokens trained with `tokenizers` on the noise train text and "
        f"the bAbI train files (`tokenizer.json` in the workdirs, sha256 prefix "
        f"{bb['tokenizer_sha256_16']}); "
        + ", ".join(f"{k} {v}" for k, v in res["babilong_sizes"].items())
        + " samples.",
    ]
  lines += [
      "",
      f"**Seeds**: {', '.join(map(str, res['seeds']))} (`train.seed`: the initialisation; the "
      "data are the same); *none* at the first seed only.",
  ]
  return lines


def report(res: dict[str, Any], out: Path) -> str:
  """REPORT.md from ``results.json``'s contents."""
  runs = list(res["runs"].values())
  lines = _setup_lines(res)
  order = {t: i for i, t in enumerate(TASKS)}
  tasks = sorted({r["task"] for r in runs}, key=order.get)
  for task in tasks:
    key = metric(task)
    dists = [d for d in DISTANCES[task] if any(d in r["evals"] for r in runs if r["task"] == task)]
    lines += [
        "",
        f"## {task}",
        "",
        f"Test `{key}` (chance ~{CHANCE[task]:.2f}); mean over the seeds run (each seed's in "
        "brackets).",
        "",
        "| memory | " + " | ".join(dists) + " |",
        "|---|" + "---:|" * len(dists),
    ]
    for memory in MEMORIES:
      cells = []
      for d in dists:
        rs = sorted(
            (r for r in runs if r["task"] == task and r["memory"] == memory and d in r["evals"]),
            key=lambda r: r["seed"],
        )
        accs = [r["evals"][d]["test"].get(key) for r in rs]
        accs_ok = [x for x in accs if x is not None]
        if not rs:
          cells.append("not run")
          continue
        per = ", ".join(f"s{r['seed']} {_fmt(x)}" for r, x in zip(rs, accs))
        cells.append(f"{_fmt(_mean(accs_ok))} ({per})")
      if all(c == "not run" for c in cells):
        continue
      lines.append(f"| {memory} | " + " | ".join(cells) + " |")
  lines += [
      "",
      "## Cost",
      "",
      "The speed and memory of each variant at this kind of equal budget: the benchmark "
      f"section {BENCH_SECTION} (`benchmarks/memory_variants.py`; the site's Memories page).",
      "",
      "## Every run",
      "",
      "| run | tgt_len | segments | mem_len | depth | steps | params | first -> last train "
      "loss | test accuracy by distance (exact answers) | train wall | eval wall |",
      "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
  ]

  def order_key(r: dict) -> tuple:
    keys = [train_key(r["task"], d) for d in DISTANCES[r["task"]]]
    return (order[r["task"]], r["seed"], keys.index(r["key"]), MEMORIES.index(r["memory"]))

  for r in sorted(runs, key=order_key):
    loss = r["train_loss"]
    curve = f"{loss[0][1]:.3f} -> {loss[-1][1]:.3f}" if loss else "-"
    accs = "; ".join(
        f"{d} {_fmt(e['test'].get(metric(r['task'])))} ({_fmt(e['test'].get('answer_accuracy'))})"
        for d, e in r["evals"].items()
    )
    ev = sum(e["eval_wall_s"] for e in r["evals"].values())
    lines.append(
        f"| {r['name']} | {r['tgt_len']} | {r['segments']} | {r['mem_len']} | "
        f"{r['mem_backprop_depth']} | {r['num_steps']} | "
        f"{'-' if r['n_params'] is None else format(r['n_params'], ',.0f')} | {curve} | {accs} | "
        f"{r['train_wall_s']:.0f} s | {ev:.0f} s |"
    )
  walls = [r["train_wall_s"] + sum(e["eval_wall_s"] for e in r["evals"].values()) for r in runs]
  if walls:
    lines += [
        "",
        f"Per run (train and its evaluations): median {statistics.median(walls):.0f} s, "
        f"{min(walls):.0f} - {max(walls):.0f} s (median by task: "
        + ", ".join(
            f"{t} {statistics.median(w for r, w in zip(runs, walls) if r['task'] == t):.0f} s"
            for t in tasks
        )
        + f"), with {res['jobs']} run(s) at a time on the shared cores; their sum "
        f"{sum(walls) / 60:.0f} min.  The training loss is the logged mean over steps (for the "
        "one-step-per-segment memories it averages in segments without answer positions): "
        "compare it within a memory, not across.",
    ]
  if res.get("failed"):
    lines += ["", "## Runs that failed", ""]
    for name, err in res["failed"].items():
      lines.append(f"- {name}: `{err}`")
  lines += ["", "## Commands", "", f"The study: `{res['command']}`.", ""]
  lines += [
      "Each run is trained by its command below, then evaluated once per distance with "
      "the same flags, the distance's (passkey: `synthetic_passkey_depth`; BABILong: "
      "`babilong_task_start_pct`/`task_end_pct`) and `--mode=eval` (in `results.json`).",
      "",
  ]
  for r in sorted(runs, key=order_key):
    lines.append(f"- {r['name']}: `{r['train_command']}`")
  if (out / "FINDINGS.md").exists():
    lines += ["", "What this shows and what it does not, by hand: [FINDINGS.md](FINDINGS.md)."]
  return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------------------------


def _choice(value: str, allowed, what: str) -> list:
  items = [x for x in value.split(",") if x]
  bad = [x for x in items if x not in allowed]
  if bad or not items:
    raise ValueError(f"--{what}={value!r}: choose from {list(allowed)}.")
  return items


def plan(
    tasks: list[str],
    memories: list[str],
    seeds: list[int],
    quick: bool,
    batches,
    distances: list[str] | None = None,
) -> list:
  """The runs, seeds outermost (a study cut short has every task's first seed);
  ``distances``: only those (of the tasks that have them)."""
  specs = []
  for i, seed in enumerate(seeds):
    for task in tasks:
      dists = list(DISTANCES[task])[:1] if quick else list(DISTANCES[task])
      if distances:
        dists = [d for d in dists if d in distances]
      keys: dict[str, list[str]] = {}
      for d in dists:
        keys.setdefault(train_key(task, d), []).append(d)
      for key, ds in keys.items():
        for memory in memories:
          if memory == "none" and i > 0:
            continue
          specs.append(
              dict(
                  task=task,
                  key=key,
                  memory=memory,
                  seed=seed,
                  distances=ds,
                  batches=batches or (3 if quick else BATCHES[task]),
              )
          )
  return specs


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(REPO / "results" / "memory_zoo"))
  p.add_argument("--workdirs", default=str(REPO / "workdirs" / "memory_zoo"))
  p.add_argument("--tasks", default=",".join(TASKS), help=f"of {TASKS}")
  p.add_argument("--memories", default=",".join(MEMORIES), help=f"of {MEMORIES}")
  p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
  p.add_argument("--distances", default="", help="only these distances (default: every task's)")
  p.add_argument("--batches", type=int, default=0, help="batches per run (0: each task's own)")
  p.add_argument("--mem", type=int, default=MEM, help="M, XL's vectors per layer (the budget)")
  p.add_argument("--jobs", type=int, default=1, help="runs at a time")
  p.add_argument(
      "--steps",
      choices=("example", "segment"),
      default="example",
      help="example: one step per batch of examples for every memory (equal steps); "
      "segment: the earlier studies' (tokens and armt per example, the others per segment)",
  )
  for split in ("train", "valid", "test"):
    p.add_argument(f"--noise_{split}", default="", help="BABILong's background: file globs")
  p.add_argument("--quick", action="store_true", help="qa1 at distance last, 3 batches")
  p.add_argument("--report_only", action="store_true", help="REPORT.md from results.json")
  a = p.parse_args(argv)
  out, workdirs = Path(a.out), Path(a.workdirs)
  if a.report_only:
    (out / "REPORT.md").write_text(report(json.loads((out / "results.json").read_text()), out))
    return 0
  try:
    if a.quick:
      a.tasks, a.seeds = "qa1" if a.tasks == ",".join(TASKS) else a.tasks, "1"
    tasks = _choice(a.tasks, TASKS, "tasks")
    memories = _choice(a.memories, MEMORIES, "memories")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    if not seeds or a.batches < 0 or a.jobs < 1:
      raise ValueError("--seeds needs an integer, --batches >= 0, --jobs >= 1.")
    if a.mem < 2 or a.mem % 2:
      raise ValueError(f"--mem={a.mem}: an even number >= 2 (the compressive memory's halves).")
    workdirs.mkdir(parents=True, exist_ok=True)
    babi = None
    if any(is_babilong(t) for t in tasks):
      babi = prepare_babilong(a, workdirs / "_babilong", tasks)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  out.mkdir(parents=True, exist_ok=True)
  logs = out / "logs"
  logs.mkdir(exist_ok=True)
  t0 = study._now()
  specs = plan(tasks, memories, seeds, a.quick, a.batches, [d for d in a.distances.split(",") if d])
  b = sizes(a.mem)
  shown = sys.argv[1:] if argv is None else argv
  res: dict[str, Any] = {
      "command": " ".join(["python scripts/memory_zoo.py", *shown]),
      "date": datetime.date.today().isoformat(),
      "quick": a.quick,
      "mem": a.mem,
      "jobs": a.jobs,
      "seeds": seeds,
      "batches": {t: a.batches or (3 if a.quick else BATCHES[t]) for t in tasks},
      "budget": {k: b[k] for k in ("xl_bytes", "num_mem_tokens", "memory_size", "d_mem", "d_key")}
      | {"bytes": b["bytes"], "tolerance": b["tolerance"]},
      "machine": study.machine(),
      "runs": {},
      "failed": {},
      "earlier": [],  # the invocations before this one into --out (their runs reused here)
  }
  if (out / "results.json").exists():
    before = json.loads((out / "results.json").read_text())
    res["earlier"] = before.get("earlier", []) + [
        {k: before[k] for k in ("command", "date", "wall_s") if k in before}
        | {"runs": len(before.get("runs", {})), "failed": len(before.get("failed", {}))}
    ]
  if babi:
    res["babilong"] = {k: v for k, v in babi.items() if not k.endswith("_files") and k != "dir"}
    res["babilong"]["noise_files"] = babi["noise_files"]
    res["babilong_sizes"] = QUICK_BABILONG_SIZES if a.quick else BABILONG_SIZES
  paths = {"workdirs": workdirs, "logs": logs}
  lock = threading.Lock()

  def save() -> None:
    res["wall_s"] = study._now() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")

  def one(spec: dict) -> None:
    name = run_name(spec["task"], spec["key"], spec["memory"], spec["seed"])
    try:
      r = run_one(spec, a, babi, paths)
    except (RuntimeError, OSError, KeyError, json.JSONDecodeError) as e:  # recorded, not dropped
      with lock:
        res["failed"][name] = str(e).splitlines()[0][:300] + " (log: " + str(logs) + ")"
        save()
      print(f"{name}: FAILED: {e}", flush=True)
      return
    with lock:
      res["runs"][name] = r
      res["failed"].pop(name, None)
      save()
    accs = ", ".join(f"{d} {_fmt(e['test'].get(metric(r['task'])))}" for d, e in r["evals"].items())
    walls = r["train_wall_s"] + sum(e["eval_wall_s"] for e in r["evals"].values())
    print(f"{name}: {accs} ({walls:.0f} s{', reused' if r['reused'] else ''})", flush=True)

  with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
    list(pool.map(one, specs))
  # results.json in the plan's order (the threads finish in any order).
  names = [run_name(s["task"], s["key"], s["memory"], s["seed"]) for s in specs]
  res["runs"] = {n: res["runs"][n] for n in names if n in res["runs"]}
  save()
  (out / "REPORT.md").write_text(report(res, out))
  return 1 if res["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
