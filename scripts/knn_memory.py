r"""The kNN memory (Memorizing Transformers, Wu et al. 2022) at CPU scale.

    python scripts/knn_memory.py [--parts=wt2,passkey] [--out=results/knn_memory] \
        [--workdirs=workdirs/knn_memory] [--manual_dir=DIR] [--data_dir=DIR] \
        [--ft_steps=500] [--passkey_batches=N] [--passkey_seed=1] [--quick] [--report_only]

Two parts (``--parts``), each written into ``results.json`` under its name:

**wt2**: the paper's fine-tuning recipe (Wu et al. 2022, arXiv 2203.08913,
Sec. 4.4: a model trained without a memory learns to use one in a short
fine-tuning) and its memory sizes, on WikiText-2.  ``base`` is the ablation
study's Transformer-XL (``configs/ablation_wt2.py:xl``: 4 layers, d_model 128,
tgt_len 32, mem_len 32, 2,000 steps of batch 16) trained once; then, from its
parameters (``train.init_from``), fine-tunes of ``--ft_steps`` steps each (the
same batch, the same data order, Adam afresh: warm-up 50 steps to 2.5e-4, a
quarter of the base's peak, cosine to 0):

  ft_xl           memory "xl": the control (the same steps, no store)
  ft_knn_s1024    memory "knn", a store of 1,024 entries per row and head
  ft_knn_s4096    the same with 4,096
  ft_knn_s16384   the same with 16,384

The store is at one layer at 3/4 depth (``model.knn.layers=(-2,)``: index 2 of
0..3, as the paper's 9th of 12), k = 32 neighbours (``model.knn.num_neighbors``;
the default 128 is an eighth of the smallest store: a lookup that reads that
much of it is hardly sparse, and bucketed retrieval groups the slots by index
mod k, 8 slots a group at S = 1,024; 32 is the segment length and S/k >= 32 for
every store), bucketed retrieval (the authors').  Each model is evaluated with
``--mode=eval`` on valid and test (eval tgt_len 32, mem_len 32, no same_length,
as scripts/compressive_wt2.py, but ``EVAL_BATCH`` = 2 rows: at 16 rows a row of
the valid split is 13.6k tokens and a store of 16,384 never fills).  For a kNN
model ``--mode=eval`` also scores it without its store (``without_knn``:
``eval.knn.memory_size=0``, the local attention alone); each is evaluated
again with a store 4x its training one (``eval.knn.memory_size=4S``: the paper
evaluates larger memories than it trains with).  The gate of each head (sigmoid of
``knn_gate_bias`` at the memory layer) is read from the final checkpoint.

**passkey**: the passkey retrieval of Landmark Attention
(``data.dataset="synthetic:passkey"``, Mohtashami & Jaggi 2023; word tokens):
examples of E = 256 positions, the pass-key line at a depth drawn per example,
the 5-digit key the answer.  A small model (2 layers, d_model 128, tgt_len 32,
mem_len 32, no dropout) is trained from scratch twice, equal steps and
examples: ``pk_xl`` (Transformer-XL, whose cache reaches n_layer x mem_len = 64
positions behind its segment) and ``pk_knn`` (the same with a store of 256
entries, one example, at its top layer, k = 8: about ten entries of the store
carry the key, and the memory attention starts nearly uniform over the k it
reads (unit queries and keys, scale 1: logits in [-1, 1]), so the right
entry's share starts near 1/k).  ``--passkey_batches`` batches of 32 examples
(2,000: 16,000 steps, one segment each, about 15 minutes per model on 2 shared
cores), Adam at 1e-3, cosine to 3e-4, no warm-up.  A rerun with another
``--passkey_batches`` or ``--passkey_seed`` (``train.seed``: the initialisation;
the examples are the same) keeps the earlier runs in results.json
(``earlier``) and in their workdirs (``<run>_b<batches>[_s<seed>]``).  Each
is evaluated at fixed depths (``--config.data.synthetic_passkey_depth=D``), so
the distance from the key to the question runs from 17 positions (inside XL's
reach) to 203 (far beyond it), and at random depths as trained.  Accuracy: ``answer_accuracy``
(whole key right, teacher-forced) and ``answer_token_accuracy`` (per digit).

Writes ``results.json`` (every number, the commands, wall times, the machine)
and ``REPORT.md`` into ``--out``; each eval's ``eval_results.json`` is also
kept as ``logs/eval_<run>_<tag>.json`` (the next eval overwrites the
workdir's).  A hand-written ``FINDINGS.md`` there is left alone and linked.
Trained workdirs are kept in ``--workdirs``; a run or evaluation already in
``results.json`` with the same command is reused (not run again), and a
training that was interrupted resumes.  An evaluation the command line
refuses (e.g. an override this version lacks) is recorded with its error
line and retried on the next run.  ``--quick``: a tiny model, a few steps,
small stores, for the tests; its numbers mean nothing.

The committed study (results/knn_memory/, with a hand-written FINDINGS.md):

    python scripts/knn_memory.py --parts=wt2
    python scripts/knn_memory.py --parts=passkey --passkey_batches=600
    python scripts/knn_memory.py --parts=passkey --passkey_batches=600 --passkey_seed=2
    python scripts/knn_memory.py --parts=passkey
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reproduce_wt2's helpers (machine, _run, _shown)
import reproduce_wt2 as study  # noqa: E402

PARTS = ("wt2", "passkey")
WT2_CONFIG = REPO / "configs" / "ablation_wt2.py"
PK_CONFIG = REPO / "configs" / "copy_rmt.py"

# -- wt2 ------------------------------------------------------------------------------------------

EVAL_BATCH = 2  # rows of the evaluation: ~108k valid / 122k test tokens a row
FT_STEPS = 500
STORES = (1024, 4096, 16384)
NEIGHBORS = 32
KNN_LAYERS = "(-2,)"  # index 2 of 4: 3/4 depth (the paper: -4 of 12)
EVAL_STORE_FACTOR = 4
FT_WARMUP = 50  # steps (at most a tenth of the fine-tune)
FINE_TUNE = [  # on top of the base's config: a fresh Adam, a short warm-up, a quarter of its peak
    "--config.train.learning_rate=2.5e-4",
    "--config.train.min_lr=0.0",
    "--config.train.eval_every=0",
]
WT2 = dict(
    model=[],
    base=[],
    base_steps=2000,
    ft_log_every=50,
    stores=STORES,
    neighbors=NEIGHBORS,
    segment=32,
    eval_batch=EVAL_BATCH,
)
WT2_QUICK = dict(
    model=[
        "--config.model.n_layer=2",
        "--config.model.d_model=32",
        "--config.model.n_head=2",
        "--config.model.d_head=16",
        "--config.model.d_inner=32",
        "--config.model.tgt_len=8",
        "--config.model.mem_len=8",
        "--config.model.cutoffs=(8, 16)",
        "--config.train.global_batch=4",
    ],
    base=[
        "--config.train.warmup_steps=1",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
    ],
    base_steps=3,
    ft_log_every=1,
    stores=(32,),  # one store: the suite's time
    neighbors=4,
    segment=8,
    eval_batch=2,
)

# -- passkey -------------------------------------------------------------------------------------

PK_LEN = 256  # E, positions of an example
PK_DIGITS = 5
PK_BATCH = 32
PK_BATCHES = 2000  # batches of examples a run sees (--passkey_batches); steps = batches x 8
PK_STORE = 256  # one example (the store is emptied at each example's start)
PK = dict(
    model=[
        "--config.model.n_layer=2",
        "--config.model.d_model=128",
        "--config.model.n_head=4",
        "--config.model.d_head=32",
        "--config.model.d_inner=256",
        "--config.model.dropout=0.0",
    ],
    data=[
        "--config.data.synthetic_train_size=10000",
        "--config.data.synthetic_valid_size=200",
        "--config.data.synthetic_test_size=500",
    ],
    passkey_len=PK_LEN,
    segment=32,
    mem_len=32,
    batch=PK_BATCH,
    store=PK_STORE,
    neighbors=8,
    knn_layers="(-1,)",  # the top layer of 2: reads the key with what layer 0 made of it
    depth_step=32,  # eval depths F, F - 32, ..., and 0 (distances 17 + 32 i, and the farthest)
)
PK_QUICK = dict(
    PK,
    model=[
        "--config.model.n_layer=2",
        "--config.model.d_model=32",
        "--config.model.n_head=2",
        "--config.model.d_head=16",
        "--config.model.d_inner=32",
        "--config.model.dropout=0.0",
    ],
    data=[
        "--config.data.synthetic_train_size=64",
        "--config.data.synthetic_valid_size=8",
        "--config.data.synthetic_test_size=8",
    ],
    passkey_len=96,
    segment=16,
    mem_len=16,
    batch=8,
    store=96,
    neighbors=8,
    depth_step=26,  # the filler's length: depths 26 and 0
)


def _n_params(log: Path) -> int | None:
  for line in log.read_text().splitlines():
    if "Model:" in line and "parameters" in line:
      return int(line.split("Model:")[1].split()[0].replace(",", ""))
  return None


def _error_line(log: Path) -> str:
  """The last ``error: ...`` line of a log, with the indented lines after it."""
  lines = log.read_text().splitlines()
  i = max(i for i, line in enumerate(lines) if line.startswith("error: "))
  more = [line.strip() for line in lines[i + 1 :] if line.startswith("  ")]
  return " ".join([lines[i], *more])


def _eval(workdir: Path, overrides: list[str], logs: Path, tag: str) -> dict:
  """``--mode=eval`` of ``workdir`` with ``overrides``; its eval_results.json
  (kept as ``logs/eval_<tag>.json``), or ``{"refused": error line}`` when the
  command line refuses the overrides (exit status 1)."""
  cmd = [sys.executable, "-m", "transformer_xl.main", f"--workdir={workdir}", "--mode=eval"]
  cmd += overrides
  log = logs / f"eval_{tag}.log"
  rec: dict[str, Any] = {"command": study._shown(cmd)}
  try:
    rec["wall_s"] = study._run(cmd, log)
  except RuntimeError:
    if any(line.startswith("error: ") for line in log.read_text().splitlines()):
      rec["refused"] = _error_line(log)
      return rec
    raise
  results = json.loads((workdir / "eval_results.json").read_text())
  shutil.copyfile(workdir / "eval_results.json", logs / f"eval_{tag}.json")
  rec["results"] = results
  return rec


def _reusable(before: dict | None, key: str, command: str) -> bool:
  """Whether ``before[key]`` was made by ``command`` and finished."""
  return bool(before) and before.get(key) == command


def _gate(workdir: Path) -> dict:
  """The kNN gate of each head at the memory layers (sigmoid of knn_gate_bias)
  and the memory attention's scale, from the newest checkpoint."""
  import numpy as np
  import orbax.checkpoint as ocp

  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  state = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(steps[-1]) / "state")
  model = json.loads((workdir / "model_config.json").read_text())["model"]
  n_layer = model["n_layer"]
  layers = sorted({i % n_layer for i in model["knn"]["layers"]})
  found: dict[str, Any] = {}

  def visit(tree, path=()):
    if isinstance(tree, dict):
      for k, v in tree.items():
        visit(v, (*path, str(k)))
    elif path and path[-1] in ("knn_gate_bias", "knn_scale"):
      found[path[-1]] = np.asarray(tree)

  visit(state["params"])
  bias, scale = found["knn_gate_bias"], found["knn_scale"]  # [n_layer, H] (the layers' scan)
  bias_LxH = bias[layers] if bias.ndim == 2 else bias[None]
  scale_LxH = scale[layers] if scale.ndim == 2 else scale[None]
  return {
      "step": steps[-1],
      "layers": layers,
      "bias": bias_LxH.tolist(),
      "gate": (1 / (1 + np.exp(-bias_LxH))).tolist(),
      "scale": scale_LxH.tolist(),
  }


# -- wt2 ------------------------------------------------------------------------------------------


def wt2_runs(sizes: dict) -> list[str]:
  return ["base", "ft_xl", *(f"ft_knn_s{s}" for s in sizes["stores"])]


def wt2_train_flags(name: str, sizes: dict, ft_steps: int, workdirs: Path) -> list[str]:
  """The config overrides of one WT2 run on top of ablation_wt2.py:xl."""
  flags = list(sizes["model"])
  if name == "base":
    return flags + [*sizes["base"], f"--config.train.num_steps={sizes['base_steps']}"]
  flags += [
      f"--config.train.init_from={workdirs / 'base'}",
      f"--config.train.num_steps={ft_steps}",
      f"--config.train.warmup_steps={min(FT_WARMUP, ft_steps // 10)}",
      *FINE_TUNE,
      f"--config.train.log_every={sizes['ft_log_every']}",
      f"--config.checkpoint.every_steps={ft_steps}",
  ]
  if name.startswith("ft_knn_s"):
    flags += [
        "--config.model.memory=knn",
        f"--config.model.knn.memory_size={int(name.rsplit('_s', 1)[1])}",
        f"--config.model.knn.num_neighbors={sizes['neighbors']}",
        f"--config.model.knn.layers={KNN_LAYERS}",
    ]
  return flags


def wt2_eval_flags(sizes: dict) -> list[str]:
  t = sizes["segment"]
  return [
      f"--config.eval.tgt_len={t}",
      f"--config.eval.mem_len={t}",
      "--config.eval.same_length=False",
      "--config.eval.clamp_len=0",
      f"--config.eval.global_batch={sizes['eval_batch']}",
  ]


def wt2_evals(name: str, sizes: dict) -> dict[str, list[str]]:
  """tag -> the overrides of each evaluation of run ``name``."""
  base = wt2_eval_flags(sizes)
  if not name.startswith("ft_knn_s"):
    return {"as_trained": base}
  store = int(name.rsplit("_s", 1)[1])
  return {
      "as_trained": base,
      "no_store": [*base, "--config.eval.knn.memory_size=0"],
      "store_x4": [*base, f"--config.eval.knn.memory_size={EVAL_STORE_FACTOR * store}"],
  }


def wt2_part(a, sizes: dict, before: dict, part: dict, workdirs: Path, logs: Path, save) -> None:
  """Trains and evaluates the WT2 runs into ``part`` (``before``: the part of an
  earlier results.json, whose runs of the same commands are kept)."""
  data = [
      f"--config.data.manual_dir={a.manual_dir}",
      f"--config.data.verify_checksums={bool(a.verify_checksums)}",
  ]
  if a.data_dir:
    data.append(f"--config.data.data_dir={a.data_dir}")
  part.update(
      {
          "ft_steps": a.ft_steps,
          "stores": list(sizes["stores"]),
          "neighbors": sizes["neighbors"],
          "knn_layers": KNN_LAYERS,
          "eval_batch": sizes["eval_batch"],
          "eval_store_factor": EVAL_STORE_FACTOR,
          "fine_tune": [
              f"--config.train.warmup_steps={min(FT_WARMUP, a.ft_steps // 10)}",
              *FINE_TUNE,
          ],
          "runs": dict(before.get("runs", {})),  # kept until redone (a run cut short loses none)
      }
  )
  old_runs = before.get("runs", {})
  for name in wt2_runs(sizes):
    workdir = workdirs / name
    train = [sys.executable, "-m", "transformer_xl.main", f"--config={WT2_CONFIG}:xl"]
    train += [f"--workdir={workdir}", *data, *wt2_train_flags(name, sizes, a.ft_steps, workdirs)]
    old = old_runs.get(name)
    shown = study._shown(train)
    if _reusable(old, "train_command", shown):
      run = {k: v for k, v in old.items() if k != "evals"}
    else:
      old = None
      wall = study._run(train, logs / f"train_{name}.log")
      run = {
          "train_command": shown,
          "train_wall_s": wall,
          "n_params": _n_params(logs / f"train_{name}.log"),
          "train_loss": study.train_losses(workdir),
      }
    store = int(name.rsplit("_s", 1)[1]) if name.startswith("ft_knn_s") else None
    run.update(
        memory="knn" if store else "xl",
        store=store,
        steps=sizes["base_steps"] if name == "base" else a.ft_steps,
    )
    run["evals"] = {}
    for tag, overrides in wt2_evals(name, sizes).items():
      prev = (old or {}).get("evals", {}).get(tag)
      cmd = [sys.executable, "-m", "transformer_xl.main", f"--workdir={workdir}", "--mode=eval"]
      if prev and "results" in prev and prev["command"] == study._shown(cmd + overrides):
        run["evals"][tag] = prev
        continue
      if tag == "no_store" and "without_knn" in run["evals"]["as_trained"].get("results", {}).get(
          "valid", {}
      ):
        # --mode=eval scored the model without its store too (eval.knn.memory_size=0).
        r = run["evals"]["as_trained"]["results"]
        run["evals"][tag] = {
            "command": run["evals"]["as_trained"]["command"] + "  (its without_knn scores)",
            "from": "as_trained's without_knn",
            "valid_ppl": r["valid"]["without_knn"]["ppl"],
            "test_ppl": r["test"]["without_knn"]["ppl"],
            "knn": r["valid"]["without_knn"].get("eval"),
        }
        continue
      rec = _eval(workdir, overrides, logs, f"{name}_{tag}")
      if "results" in rec:
        r = rec["results"]
        rec["valid_ppl"], rec["test_ppl"] = r["valid"]["ppl"], r["test"]["ppl"]
        rec["knn"] = r.get("eval", {}).get("knn")
      run["evals"][tag] = rec
      part["runs"][name] = run
      save()
    if store and "gate" not in run:
      try:
        run["gate"] = _gate(workdir)
      except Exception as e:  # optional: a layout this reader does not know
        run["gate"] = {"error": f"{type(e).__name__}: {e}"}
    part["runs"][name] = run
    save()
    ev = run["evals"]["as_trained"]
    print(f"wt2 {name}: valid {ev['valid_ppl']:.2f}, test {ev['test_ppl']:.2f}", flush=True)
  part["runs"] = {n: part["runs"][n] for n in wt2_runs(sizes)}


# -- passkey -------------------------------------------------------------------------------------


def pk_depths(sizes: dict) -> list[int]:
  """The fixed eval depths: F (the key just before the question), F - step,
  ..., and 0 (the farthest); -1 (random, as trained) first."""
  from transformer_xl.data import passkey

  f = passkey.filler_len(sizes["passkey_len"], PK_DIGITS)
  return [-1, *range(f, 0, -sizes["depth_step"]), 0]


def pk_distance(sizes: dict, depth: int) -> int | None:
  from transformer_xl.data import passkey

  if depth < 0:
    return None
  return passkey.key_distance(sizes["passkey_len"], PK_DIGITS, depth)


def pk_train_flags(name: str, sizes: dict, batches: int, seed: int) -> list[str]:
  t, e = sizes["segment"], sizes["passkey_len"]
  steps = batches * (e // t)
  flags = [
      "--config.data.dataset=synthetic:passkey",
      f"--config.data.synthetic_passkey_len={e}",
      "--config.data.synthetic_passkey_depth=-1",
      f"--config.data.synthetic_passkey_digits={PK_DIGITS}",
      *sizes["data"],
      *sizes["model"],
      f"--config.model.tgt_len={t}",
      f"--config.model.mem_len={sizes['mem_len']}",
      f"--config.eval.tgt_len={t}",
      f"--config.eval.mem_len={sizes['mem_len']}",
      "--config.eval.same_length=False",
      f"--config.train.num_steps={steps}",
      f"--config.train.global_batch={sizes['batch']}",
      f"--config.eval.global_batch={sizes['batch']}",
      "--config.train.learning_rate=1e-3",
      "--config.train.min_lr=3e-4",
      "--config.train.warmup_steps=0",
      f"--config.train.seed={seed}",
      # Whole examples per logged window: its mean is the answer's loss / segments.
      f"--config.train.log_every={(e // t) * max(1, batches // 40)}",
      "--config.train.eval_every=0",
      f"--config.checkpoint.every_steps={max(1, steps // 4)}",
  ]
  if name == "pk_knn":
    flags += [
        "--config.model.memory=knn",
        f"--config.model.knn.memory_size={sizes['store']}",
        f"--config.model.knn.num_neighbors={sizes['neighbors']}",
        f"--config.model.knn.layers={sizes['knn_layers']}",
    ]
  return flags


# What a passkey eval keeps of each split (the rest is in logs/eval_*.json).
PK_KEYS = (
    "answer_accuracy",
    "answer_token_accuracy",
    "greedy_accuracy",
    "greedy_token_accuracy",
    "examples",
    "loss_nats",
    "without_knn",  # the kNN model scored without its store too (--mode=eval)
)


def passkey_part(
    a, sizes: dict, before: dict, part: dict, workdirs: Path, logs: Path, save
) -> None:
  """Trains and evaluates the passkey runs into ``part`` (as ``wt2_part``)."""
  t, e = sizes["segment"], sizes["passkey_len"]
  part.update(
      {
          "passkey_len": e,
          "digits": PK_DIGITS,
          "segment": t,
          "mem_len": sizes["mem_len"],
          "n_layer": int(next(f for f in sizes["model"] if ".n_layer=" in f).split("=")[1]),
          "batches": a.passkey_batches,
          "seed": a.passkey_seed,
          "batch": sizes["batch"],
          "store": sizes["store"],
          "neighbors": sizes["neighbors"],
          "runs": {},
      }
  )
  # Attempts of another length of training or seed stay in results.json ("earlier", and
  # their workdirs); one of this length and seed is this one's to reuse.
  attempts = list(before.get("earlier", []))
  if before.get("runs"):
    attempts.append({k: v for k, v in before.items() if k != "earlier"})
  key = lambda x: (x["batches"], x.get("seed", 1))
  this = (a.passkey_batches, a.passkey_seed)
  part["earlier"] = [x for x in attempts if key(x) != this]
  for x in attempts:
    if key(x) == this:
      part["runs"] = dict(x["runs"])  # kept until redone
  before = {"runs": part["runs"]}
  part["xl_reach"] = part["n_layer"] * sizes["mem_len"]
  # The position that predicts the answer's first digit, and its offset in its segment.
  part["question_offset"] = (e - PK_DIGITS) % t
  old_runs = before.get("runs", {})
  for name in ("pk_xl", "pk_knn"):
    # Workdir and logs: one per length of training and seed.
    run_id = f"{name}_b{a.passkey_batches}" + (f"_s{a.passkey_seed}" if a.passkey_seed != 1 else "")
    workdir = workdirs / run_id
    train = [sys.executable, "-m", "transformer_xl.main", f"--config={PK_CONFIG}:xl"]
    train += [
        f"--workdir={workdir}",
        *pk_train_flags(name, sizes, a.passkey_batches, a.passkey_seed),
    ]
    shown = study._shown(train)
    old = old_runs.get(name)
    if _reusable(old, "train_command", shown):
      run = {k: v for k, v in old.items() if k != "evals"}
    else:
      old = None
      wall = study._run(train, logs / f"train_{run_id}.log")
      run = {
          "train_command": shown,
          "workdir": str(workdir),
          "train_wall_s": wall,
          "n_params": _n_params(logs / f"train_{run_id}.log"),
          "num_steps": a.passkey_batches * (e // t),
          "train_loss": study.train_losses(workdir),
      }
    run["memory"] = "knn" if name == "pk_knn" else "xl"
    run["evals"] = {}
    for depth in pk_depths(sizes):
      overrides = [f"--config.data.synthetic_passkey_depth={depth}"]
      tag = f"depth{depth}" if depth >= 0 else "random"
      prev = (old or {}).get("evals", {}).get(tag)
      cmd = [sys.executable, "-m", "transformer_xl.main", f"--workdir={workdir}", "--mode=eval"]
      if prev and "results" in prev and prev["command"] == study._shown(cmd + overrides):
        run["evals"][tag] = prev
        continue
      rec = _eval(workdir, overrides, logs, f"{run_id}_{tag}")
      rec["depth"], rec["distance"] = depth, pk_distance(sizes, depth)
      if "results" in rec:
        for split in ("valid", "test"):
          rec[split] = {k: rec["results"][split][k] for k in PK_KEYS if k in rec["results"][split]}
      run["evals"][tag] = rec
      part["runs"][name] = run
      save()
    if name == "pk_knn" and "gate" not in run:
      try:
        run["gate"] = _gate(workdir)
      except Exception as e:  # optional
        run["gate"] = {"error": f"{type(e).__name__}: {e}"}
    part["runs"][name] = run
    save()
    accs = {tag: ev["test"]["answer_accuracy"] for tag, ev in run["evals"].items() if "test" in ev}
    print(f"passkey {name}: test answer accuracy {accs}", flush=True)
  part["runs"] = {n: part["runs"][n] for n in ("pk_xl", "pk_knn")}


# -- report --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = ".2f") -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _mins(s: float | None) -> str:
  return "-" if s is None else f"{s / 60:.1f} min"


def _ppl(run: dict, tag: str, split: str) -> str:
  ev = run["evals"].get(tag)
  if ev is None:
    return "-"
  if "refused" in ev:
    return "refused"
  return _f(ev[f"{split}_ppl"])


def _curve(loss: list, n: int = 5) -> str:
  """``n`` points of a loss curve, "step: loss" (first, evenly spaced, last)."""
  if not loss:
    return "-"
  idx = sorted({round(i * (len(loss) - 1) / (n - 1)) for i in range(n)})
  return ", ".join(f"{loss[i][0]}: {loss[i][1]:.3f}" for i in idx)


def report_wt2(part: dict) -> list[str]:
  runs = part["runs"]
  ctl = runs.get("ft_xl", {}).get("evals", {}).get("as_trained", {})
  lines = [
      "## WikiText-2: fine-tuned with and without a store",
      "",
      f"`base`: `configs/ablation_wt2.py:xl` (4 layers, d_model 128, tgt_len 32, mem_len 32, "
      "batch 16) trained from scratch; every `ft_*` starts from its parameters "
      f"(`train.init_from`) and trains {part['ft_steps']} more steps of batch 16 "
      f"({' '.join('`' + f + '`' for f in part['fine_tune'])}; the same data order as the "
      "base's first steps).  `ft_xl` is the control: the same fine-tune without a store.  "
      f"kNN: one store at layer index 2 of 4 (`model.knn.layers={part['knn_layers']}`), "
      f"k = {part['neighbors']}, bucketed retrieval; S = entries per row, head and memory "
      f"layer.  Evaluation: `--mode=eval`, eval tgt_len 32, mem_len 32, no same_length, "
      f"{part['eval_batch']} rows (a row is about half of the split, so a store of "
      f"{EVAL_STORE_FACTOR} x 16,384 fills).  *no store*: `eval.knn.memory_size=0`; "
      f"*{part['eval_store_factor']}x store*: `eval.knn.memory_size` = "
      f"{part['eval_store_factor']} S.",
      "",
      "| run | memory | S (training) | steps | valid ppl | valid, no store | valid, "
      f"{part['eval_store_factor']}x store | test ppl | test, no store | test, "
      f"{part['eval_store_factor']}x store | test vs ft_xl | train wall | eval wall |",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for name, r in runs.items():
    ev = r["evals"].get("as_trained", {})
    rel = "-"
    if "test_ppl" in ev and "test_ppl" in ctl and name != "ft_xl":
      rel = f"{100 * (ev['test_ppl'] / ctl['test_ppl'] - 1):+.1f}%"
    eval_wall = sum(e.get("wall_s", 0) for e in r["evals"].values())
    lines.append(
        f"| {name} | {r['memory']} | {_f(r['store'], ',')} | {r['steps']:,} | "
        f"{_ppl(r, 'as_trained', 'valid')} | {_ppl(r, 'no_store', 'valid')} | "
        f"{_ppl(r, 'store_x4', 'valid')} | {_ppl(r, 'as_trained', 'test')} | "
        f"{_ppl(r, 'no_store', 'test')} | {_ppl(r, 'store_x4', 'test')} | {rel} | "
        f"{_mins(r.get('train_wall_s'))} | {_mins(eval_wall)} |"
    )
  refused = {
      (name, tag): ev["refused"]
      for name, r in runs.items()
      for tag, ev in r["evals"].items()
      if "refused" in ev
  }
  if refused:
    lines += ["", "Evaluations the command line refused (this version):", ""]
    lines += [f"- {name} {tag}: `{msg}`" for (name, tag), msg in refused.items()]
  same = []
  for name, r in runs.items():  # the 4x eval scores the model without its store too
    x4 = r["evals"].get("store_x4", {}).get("results", {})
    no = r["evals"].get("no_store", {})
    if "without_knn" in x4.get("valid", {}) and "valid_ppl" in no:
      a, b = x4["valid"]["without_knn"]["ppl"], no["valid_ppl"]
      same.append(f"{name} {abs(a - b) / b:.1e}")
  if same:
    lines += [
        "",
        "Check: `--mode=eval` scores each kNN model without its store in every evaluation; "
        "the 4x-store evaluation's no-store valid ppl against the as-trained one's "
        "(relative difference): " + ", ".join(same) + ".",
    ]
  gates = [(n, r["gate"]) for n, r in runs.items() if "gate" in r]
  if gates:
    lines += [
        "",
        "The gate of each head at the memory layer after fine-tuning (sigmoid of "
        "`knn_gate_bias`: the share of the memory attention in the head's output; 0.5 at "
        "the start) and the memory attention's scale (1 at the start):",
        "",
        "| run | gate per head | scale per head |",
        "|---|---|---|",
    ]
    for n, g in gates:
      if "error" in g:
        lines.append(f"| {n} | not read: {g['error']} | |")
      else:
        lines.append(
            f"| {n} | {', '.join(f'{x:.3f}' for x in g['gate'][0])} | "
            f"{', '.join(f'{x:.2f}' for x in g['scale'][0])} |"
        )
  lines += [
      "",
      "Training loss (logged mean, nats per token; the base over its whole run, the "
      "fine-tunes over theirs):",
      "",
  ]
  for n, r in runs.items():
    lines.append(f"- {n}: {_curve(r.get('train_loss', []))}")
  lines += ["", "Commands:", ""]
  for n, r in runs.items():
    lines.append(f"- {n}: `{r['train_command']}`")
    for tag, ev in r["evals"].items():
      lines.append(f"  - {tag}: `{ev['command']}`")
  return lines


def report_passkey(part: dict) -> list[str]:
  lines = [
      "## Passkey retrieval: accuracy by distance",
      "",
      f"`synthetic:passkey`, E = {part['passkey_len']} positions per example, a "
      f"{part['digits']}-digit key; trained at random depths (train.seed "
      f"{part.get('seed', 1)}), {part['batches']:,} batches of "
      f"{part['batch']} examples ({part['batches'] * part['passkey_len'] // part['segment']:,} "
      f"steps of one segment of {part['segment']}), both models from scratch with the same "
      f"examples: {part['n_layer']} layers, mem_len {part['mem_len']}; `pk_knn` adds a store "
      f"of {part['store']} entries (one example; emptied at each example's start) at its top "
      f"layer, k = {part['neighbors']}.  *Distance*: positions from the key's second mention "
      "to the position that predicts the answer's first digit (`passkey.key_distance`).  "
      f"Transformer-XL's cache reaches n_layer x mem_len = {part['xl_reach']} positions "
      f"behind the segment; the question ends at offset {part['question_offset']} of its "
      f"segment, so a key up to {part['xl_reach'] + part['question_offset']} positions back "
      "is in reach (through both layers; one layer's cache: "
      f"{part['mem_len'] + part['question_offset']}).  Accuracy on the test split at each "
      "fixed depth: *exact* = `answer_accuracy` (the whole key right, teacher-forced), "
      "*digit* = `answer_token_accuracy` (chance 0.1).",
      "",
      *_pk_summary(part),
      f"### {part['batches']:,} batches, train.seed {part.get('seed', 1)}",
      "",
      *_pk_body(part),
  ]
  for e in part.get("earlier", []):
    lines += [
        "",
        f"### An earlier attempt: {e['batches']:,} batches of examples "
        f"({e['batches'] * e['passkey_len'] // e['segment']:,} steps), k = {e['neighbors']}, "
        f"train.seed {e.get('seed', 1)}",
        "",
        *_pk_body(e),
    ]
  return lines


def _pk_summary(part: dict) -> list[str]:
  """One table of every attempt (this one and the earlier ones): per run, the
  last logged training loss per digit and the test digit accuracy by distance."""
  attempts = [part, *part.get("earlier", [])]
  if len(attempts) < 2 or not part["runs"]:
    return []
  first = next(iter(part["runs"].values()))["evals"]
  tags = [t for t in first if first[t]["depth"] >= 0]
  reach = part["xl_reach"] + part["question_offset"]
  dist = lambda t: first[t]["distance"]
  lines = [
      "Every attempt at a glance: the last logged training loss per answer digit (the "
      "digits' own entropy, a model that ignores the key: 2.28 nats) and the test digit "
      "accuracy (`answer_token_accuracy`) at each distance (* beyond XL's reach); the "
      "whole-key accuracy is in each attempt's table.",
      "",
      "| batches | seed | run | loss/digit | "
      + " | ".join(f"{dist(t)}{'*' if dist(t) > reach else ''}" for t in tags)
      + " |",
      "|---:|---:|---|---:|" + "---:|" * len(tags),
  ]
  for x in attempts:
    n_seg = x["passkey_len"] // x["segment"]
    cols = [(n, n, ()) for n in x["runs"]]
    cols += [(f"{n} without store", n, ("without_knn",)) for n in x["runs"] if n.endswith("knn")]
    for label, n, where in cols:
      r = x["runs"][n]
      loss = r.get("train_loss", [])
      cells = []
      for t in tags:
        acc = r["evals"].get(t, {}).get("test", {})
        for key in where:
          acc = acc.get(key, {})
        cells.append(_f(acc.get("answer_token_accuracy"), ".3f"))
      last = "-" if where or not loss else f"{n_seg * loss[-1][1]:.3f}"
      lines.append(
          f"| {x['batches']:,} | {x.get('seed', 1)} | {label} | {last} | "
          + " | ".join(cells)
          + " |"
      )
  return lines + [""]


def _pk_body(part: dict) -> list[str]:
  """The passkey tables, gate, loss curves and commands of ``part`` (the
  results' passkey part, or an earlier attempt kept in it)."""
  runs = part["runs"]
  lines: list[str] = []
  names = list(runs)
  # (column, run, where in a split's results): each run, and the kNN model without its store.
  cols = [(n, n, ()) for n in names]
  if any("without_knn" in ev.get("test", {}) for r in runs.values() for ev in r["evals"].values()):
    cols += [(f"{n} without store", n, ("without_knn",)) for n in names if n.endswith("knn")]
  head = "| depth | distance | in XL's reach |"
  rule = "|---:|---:|---|"
  for col, _, _ in cols:
    head += f" {col}: exact | digit |"
    rule += "---:|---:|"
  lines += [head, rule]
  tags = list(next(iter(runs.values()))["evals"]) if runs else []
  reach = part["xl_reach"] + part["question_offset"]
  for tag in tags:
    ev0 = runs[names[0]]["evals"][tag]
    d = ev0.get("distance")
    row = (
        f"| {'random' if ev0['depth'] < 0 else ev0['depth']} | {_f(d, 'd')} | "
        f"{'-' if d is None else ('yes' if d <= reach else 'no')} |"
    )
    for _, n, where in cols:
      ev = runs[n]["evals"].get(tag, {})
      if "refused" in ev:
        row += " refused | |"
        continue
      t = ev.get("test", {})
      for key in where:
        t = t.get(key, {})
      exact, digit = t.get("answer_accuracy"), t.get("answer_token_accuracy")
      row += f" {_f(exact, '.3f')} | {_f(digit, '.3f')} |"
    lines.append(row)
  lines += [
      "",
      "| run | parameters | steps | train wall | eval wall |",
      "|---|---:|---:|---:|---:|",
  ]
  for n, r in runs.items():
    eval_wall = sum(e.get("wall_s", 0) for e in r["evals"].values())
    lines.append(
        f"| {n} | {_f(r.get('n_params'), ',')} | {_f(r.get('num_steps'), ',')} | "
        f"{_mins(r.get('train_wall_s'))} | {_mins(eval_wall)} |"
    )
  gate = runs.get("pk_knn", {}).get("gate")
  if gate and "error" not in gate:
    lines += [
        "",
        "pk_knn's gate per head at its memory layer (sigmoid of `knn_gate_bias`): "
        + ", ".join(f"{x:.3f}" for x in gate["gate"][0])
        + "; scale: "
        + ", ".join(f"{x:.2f}" for x in gate["scale"][0])
        + ".",
    ]
  lines += [
      "",
      "Training loss per answer digit (nats; chance: ln 10 = 2.30 once the model knows "
      "an answer is digits), step: loss.  The loss is on the answer only, so the logged mean "
      "over a window of whole examples is the answer's loss / segments; shown times the "
      f"{part['passkey_len'] // part['segment']} segments:",
      "",
  ]
  n_seg = part["passkey_len"] // part["segment"]
  for n, r in runs.items():
    loss = [[step, n_seg * x] for step, x in r.get("train_loss", [])]
    lines.append(f"- {n}: {_curve(loss, 9)}")
  lines += ["", "Commands:", ""]
  for n, r in runs.items():
    lines.append(f"- {n}: `{r['train_command']}`")
    if r["evals"]:
      ev = next(iter(r["evals"].values()))
      lines.append(
          f"  - evaluated as `{ev['command'].rsplit('=', 1)[0]}=D` for each depth D (-1: random)"
      )
  return lines


def report(res: dict[str, Any], out: Path) -> str:
  """REPORT.md from ``results.json``'s contents."""
  lines = [
      "# The kNN memory (Memorizing Transformers) at CPU scale",
      "",
      "Wu, Rabe, Hutchins, Szegedy 2022 (arXiv 2203.08913); how the study is built: "
      "`scripts/knn_memory.py`'s docstring.  Every number below is in `results.json`, every "
      "run's log in `logs/`."
      + ("  **--quick run: the numbers mean nothing.**" if res["quick"] else ""),
      "",
      "Runs of the script (wall times are of a machine shared with other jobs: they are not "
      "the cost of the memory):",
      "",
  ]
  for inv in res["invocations"]:
    m = inv["machine"]
    lines.append(
        f"- {inv['date']}: `{inv['command']}` ({', '.join(inv['parts'])}) on {m['cpu']} "
        f"({m['cores']} cores, CPU only, load average {m['load_average_at_start'][0]:.1f} at "
        f"the start), jax {m['jax']}: {_mins(inv.get('wall_s'))}"
    )
  lines.append("")
  if "wt2" in res["parts"]:
    lines += report_wt2(res["parts"]["wt2"]) + [""]
  if "passkey" in res["parts"]:
    lines += report_passkey(res["parts"]["passkey"]) + [""]
  if (out / "FINDINGS.md").exists():
    lines += ["What this shows and what it does not, by hand: [FINDINGS.md](FINDINGS.md).", ""]
  return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: wt2, passkey")
  p.add_argument("--out", default=str(REPO / "results" / "knn_memory"))
  p.add_argument("--workdirs", default=str(REPO / "workdirs" / "knn_memory"))
  p.add_argument("--manual_dir", default=str(REPO.parent / "shared" / "data" / "wikitext-2"))
  p.add_argument("--data_dir", default=None, help="tfds data dir (default: tfds's)")
  p.add_argument("--verify_checksums", type=int, default=1, choices=(0, 1))
  p.add_argument("--ft_steps", type=int, default=None, help=f"fine-tune steps ({FT_STEPS})")
  p.add_argument(
      "--passkey_batches", type=int, default=None, help=f"batches of examples ({PK_BATCHES})"
  )
  p.add_argument("--passkey_seed", type=int, default=1, help="train.seed of the passkey runs")
  p.add_argument("--quick", action="store_true", help="a smoke run: tiny model, a few steps")
  p.add_argument("--report_only", action="store_true", help="REPORT.md from results.json")
  a = p.parse_args(argv)
  out, workdirs = Path(a.out).resolve(), Path(a.workdirs).resolve()
  if a.report_only:
    if not (out / "results.json").is_file():
      print(
          f"error: --report_only needs {out / 'results.json'}; run the study first.",
          file=sys.stderr,
      )
      return 1
    res = json.loads((out / "results.json").read_text())
    (out / "REPORT.md").write_text(report(res, out))
    return 0
  parts = [x for x in a.parts.split(",") if x]
  bad = [x for x in parts if x not in PARTS]
  if bad or not parts:
    print(f"error: --parts={a.parts!r}: choose from {list(PARTS)}.", file=sys.stderr)
    return 1
  if a.ft_steps is None:
    a.ft_steps = 3 if a.quick else FT_STEPS
  if a.passkey_batches is None:
    a.passkey_batches = 3 if a.quick else PK_BATCHES
  if a.ft_steps < 1 or a.passkey_batches < 1:
    print("error: --ft_steps and --passkey_batches must be >= 1.", file=sys.stderr)
    return 1
  out.mkdir(parents=True, exist_ok=True)
  logs = out / "logs"
  logs.mkdir(exist_ok=True)
  workdirs.mkdir(parents=True, exist_ok=True)
  res: dict[str, Any] = {"quick": a.quick, "invocations": [], "parts": {}}
  if (out / "results.json").exists():
    earlier = json.loads((out / "results.json").read_text())
    if earlier.get("quick") == a.quick:
      res = earlier
  t0 = study._now()
  inv = {
      "command": " ".join(["python scripts/knn_memory.py", *(argv or sys.argv[1:])]),
      "date": datetime.date.today().isoformat(),
      "parts": parts,
      "machine": study.machine(),
  }
  res["invocations"].append(inv)

  def save():
    inv["wall_s"] = study._now() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")

  for name in parts:
    before = res["parts"].get(name, {})
    part: dict[str, Any] = {}
    res["parts"][name] = part
    if name == "wt2":
      wt2_part(a, WT2_QUICK if a.quick else WT2, before, part, workdirs, logs, save)
    else:
      passkey_part(a, PK_QUICK if a.quick else PK, before, part, workdirs, logs, save)
    save()
  (out / "REPORT.md").write_text(report(res, out))
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except (RuntimeError, subprocess.SubprocessError) as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
