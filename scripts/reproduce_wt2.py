r"""The paper's findings at small scale on WikiText-2: one reproducible report.

    python scripts/reproduce_wt2.py [--out=results/wt2] [--workdirs=workdirs/wt2_study] \
        [--manual_dir=DIR] [--data_dir=DIR] [--quick] [--report_only]

Trains the ablation group of ``configs/ablation_wt2.py`` (Dai et al. 2019,
Table 6 at CPU scale; every variant with the same parameter budget,
backpropagation length and steps), then evaluates and analyses it:

  Table 6   valid/test perplexity at the training attention length ("PPL
            init"), the best over evaluation attention lengths ("PPL best")
            and the shortest length reaching it ("Attn Len"), the curves;
  Table 8   RECL of the group (Transformer-XL, Shaw et al., no recurrence,
            the vanilla Transformer) at r = 0.1, 0.5, 1.0, Figures 3 and 4
            (``python -m transformer_xl.analysis.recl``);
  Table 9   the evaluation slowdown of the vanilla sliding window against
            state reuse at several attention lengths, on this machine
            (``benchmarks/eval_speed.py``, the ablation model's size);
  App. D    the average attention map and the term decomposition of the
            best model (``python -m transformer_xl.analysis.attention``);
  App. E    samples of the best model (``--mode=generate``'s sampler);
  and the learning curves of every variant, and the run-to-run noise:
  Transformer-XL trained a second time with another seed.

Everything goes into ``--out``: ``results.json`` (every number, with the
command, hardware, steps and wall time of each part), PNG plots and
``REPORT.md`` (docs/results.md links ``results/wt2/REPORT.md``).  A hand-written
``FINDINGS.md`` in ``--out`` is left alone; REPORT.md ends with a link to it
when it is there.  ``--report_only`` rewrites the plots and REPORT.md from
``results.json`` without running anything.  Trained workdirs are kept in
``--workdirs`` and reused: a rerun (or a run that was interrupted) resumes
training where it stopped and redoes the analyses.

"vanilla" trains exactly what "alrfou_half" trains (the same config but for
its evaluation method): its workdir is a copy of alrfou_half's checkpoint
with the vanilla config, so the group is trained six times, not seven.

``--quick`` is a smoke run (a tiny model, a few steps, short lengths, small
token subsets): minutes, for the test suite; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's transformer_xl, also when run as a script
CONFIG = REPO / "configs" / "ablation_wt2.py"
TRAINED = ("xl", "xl_half", "shaw", "no_recurrence", "vaswani_half", "alrfou_half")
TABLE6_ORDER = ("xl", "shaw", "xl_half", "no_recurrence", "vaswani_half", "alrfou_half", "vanilla")
RECL_GROUP = ("xl", "shaw", "no_recurrence", "vanilla")  # Table 8's second group
ROWS = {  # variant -> (recurrence, encoding, loss): the columns of Table 6
    "xl": ("yes", "Transformer-XL (ours)", "full"),
    "xl_half": ("yes", "Transformer-XL (ours)", "half"),
    "shaw": ("yes", "Shaw et al. (2018)", "full"),
    "no_recurrence": ("no", "Transformer-XL (ours)", "full"),
    "vaswani_half": ("no", "Vaswani et al. (2017)", "half"),
    "alrfou_half": ("no", "Al-Rfou et al. (2018)", "half"),
    "vanilla": ("no", "Al-Rfou et al. (2018), sliding window", "half"),
}

# The study's sizes: the full run and --quick (a smoke run for the tests).
FULL = dict(
    overrides=[],
    attn_lens=[32, 64, 128, 256],
    recl_lens=[16, 32, 48, 64, 80, 96, 112, 128],
    recl_delta=16,
    recl_tokens=20_000,
    vanilla_windows=[32],
    # The ablation model's size with eval_speed's own 256-word dense softmax:
    # the slowdown of the network itself, the paper's enwik8-like setting.
    speed=[
        "--attn_lens=64,128,256,512",
        "--n_layer=4",
        "--d_model=128",
        "--n_head=4",
        "--d_head=32",
        "--d_inner=512",
        "--tgt_len=32",
    ],
    map_tokens=20_000,
    map_segment=-1,
    sample_tokens=200,
    noise_seed=1,
)
QUICK = dict(
    overrides=[
        "--config.model.n_layer=2",
        "--config.model.d_model=32",
        "--config.model.n_head=2",
        "--config.model.d_head=16",
        "--config.model.d_inner=32",
        "--config.model.tgt_len=8",
        "--config.model.cutoffs=(8, 16)",
        "--config.train.num_steps=3",
        "--config.train.warmup_steps=1",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.global_batch=8",
        "--config.eval.tgt_len=8",
        "--config.eval.window=8",
        "--config.eval.global_batch=8",
    ],
    attn_lens=[8, 16],
    recl_lens=[4, 8, 12],
    recl_delta=4,
    recl_tokens=200,
    vanilla_windows=[8],
    speed=["--smoke"],
    map_tokens=100,
    map_segment=1,
    sample_tokens=10,
    noise_seed=1,
)
NOISE_VARIANT = "xl"  # trained a second time with train.seed = sizes["noise_seed"]


def _now() -> float:
  return time.perf_counter()


def machine() -> dict:
  """The hardware and software the numbers come from."""
  cpu = platform.processor() or ""
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  import flax
  import jax

  return {
      "cpu": cpu,
      "cores": os.cpu_count(),
      "platform": platform.platform(),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "flax": flax.__version__,
      "devices": [str(d) for d in jax.devices()],
      "load_average_at_start": list(os.getloadavg()),
  }


def _shown(cmd: Sequence[str]) -> str:
  """``cmd`` as a user would type it from the repository root (paths inside
  the checkout, bare or as a ``--flag=`` value, relative to it)."""
  inside = str(REPO) + os.sep

  def rel(arg: str) -> str:
    flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    return flag + eq + (os.path.relpath(value, REPO) if value.startswith(inside) else value)

  return " ".join(["python"] + [rel(a) for a in cmd[1:]])


def train_losses(workdir: Path) -> list[list[float]]:
  """[[step, train/loss], ...] of a workdir's metrics.jsonl ([] without one): the
  learning curve the study scripts record per run."""
  out = []
  path = Path(workdir) / "metrics.jsonl"
  if path.exists():
    for line in path.read_text().splitlines():
      rec = json.loads(line)
      if "train/loss" in rec:
        out.append([rec["step"], rec["train/loss"]])
  return out


def _run(cmd: Sequence[str], log_path: Path) -> float:
  """Runs a command (PYTHONPATH = the repository), its output into
  ``log_path``; returns the wall time in seconds.

  Raises:
    RuntimeError: a non-zero exit (the log's tail in the message).
  """
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("XLA_FLAGS", None)  # one CPU device, not the test suite's 8
  t0 = _now()
  with open(log_path, "w") as log:
    r = subprocess.run(list(cmd), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  if r.returncode:
    tail = "".join(Path(log_path).read_text().splitlines(keepends=True)[-20:])
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}); end of {log_path}:\n{tail}")
  return _now() - t0


def train_group(workdirs: Path, data_flags: list, sizes: dict, logs: Path) -> dict:
  """Trains the six trained variants (resuming), makes vanilla's workdir.

  Returns:
    {variant: {"command": str, "wall_s": float}}.
  """
  out = {}
  for v in TRAINED:
    cmd = [
        sys.executable,
        "-m",
        "transformer_xl.main",
        f"--config={CONFIG}:{v}",
        f"--workdir={workdirs / v}",
        *data_flags,
        *sizes["overrides"],
    ]
    print(f"[train] {v}", flush=True)
    out[v] = {"command": _shown(cmd), "wall_s": _run(cmd, logs / f"train_{v}.log")}
  # vanilla = alrfou_half's training with the sliding-window evaluation.
  src, dst = workdirs / "alrfou_half", workdirs / "vanilla"
  if dst.exists():
    shutil.rmtree(dst)
  dst.mkdir(parents=True)
  shutil.copytree(src / "checkpoints", dst / "checkpoints")
  shutil.copy(src / "model_config.json", dst / "model_config.json")
  shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")
  config = json.loads((src / "config.json").read_text())
  config["eval"]["method"] = "sliding"
  (dst / "config.json").write_text(json.dumps(config, indent=2))
  out["vanilla"] = {"command": "copy of alrfou_half with eval.method=sliding", "wall_s": 0.0}
  return out


def _load(workdir: Path, data_dir: str | None, manual_dir: str | None):
  """(config, train ModelConfig, unit, step, params, mesh) of a workdir."""
  import jax

  from transformer_xl import sharding
  from transformer_xl.run import run_dir
  from transformer_xl.run import workdir as wd

  config = wd.load_config(str(workdir))
  model_cfg, unit = wd.load_model_config(str(workdir))
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  config.mesh.shape = (1, 1)
  step, params = run_dir.restore_params(str(workdir), model_cfg, mesh)
  return config, model_cfg, unit, step, params, mesh


def table6(workdirs: Path, corpus, sizes: dict, data_dir, manual_dir) -> dict:
  """PPL init / best / Attn Len per variant (Table 6), and the curves.

  "init" is the workdir config's own evaluation (the training attention
  length); the sweep evaluates valid with a memory of c and same_length
  (every query sees exactly c keys; segment models, with or without
  recurrence in training, as the paper does) or, for vanilla, sliding
  windows of c.  "best" is the lowest valid perplexity of init and the
  sweep; test is evaluated at init and at best.
  """
  from transformer_xl.inference import evaluate

  rows = {}
  for v in TABLE6_ORDER:
    t0 = _now()
    config, model_cfg, unit, step, params, mesh = _load(workdirs / v, data_dir, manual_dir)

    def ppl(cfg, split):
      return evaluate.Evaluator(cfg, model_cfg, corpus, mesh).evaluate(params, split)["ppl"]

    init_len = (
        config.eval.window
        if config.eval.method == "sliding"
        else (
            config.eval.mem_len
            if config.eval.same_length
            else config.eval.tgt_len + config.eval.mem_len
        )
    )
    curve = {}
    lengths = sizes["vanilla_windows"] if v == "vanilla" else sizes["attn_lens"]
    init_valid = ppl(config, "valid")
    for c in lengths:
      if c == init_len:  # the workdir's own evaluation: already measured
        curve[c] = init_valid
        continue
      cfg = config.copy_and_resolve_references()
      if v == "vanilla":
        cfg.eval.update(window=c, stride=1)
      else:
        cfg.eval.update(mem_len=c, same_length=True)
      curve[c] = ppl(cfg, "valid")
      print(f"[table 6] {v} attention {c}: valid ppl {curve[c]:.2f}", flush=True)
    init_test = ppl(config, "test")
    candidates = [(init_valid, init_len, None)] + [(p, c, c) for c, p in sorted(curve.items())]
    best_valid, best_len, best_c = min(candidates, key=lambda x: (round(x[0], 2), x[1]))
    if best_c is None:
      best_test = init_test
    else:
      cfg = config.copy_and_resolve_references()
      if v == "vanilla":
        cfg.eval.update(window=best_c, stride=1)
      else:
        cfg.eval.update(mem_len=best_c, same_length=True)
      best_test = ppl(cfg, "test")
    rows[v] = {
        "recurrence": ROWS[v][0],
        "encoding": ROWS[v][1],
        "loss": ROWS[v][2],
        "step": int(step),
        "init_attn_len": int(init_len),
        "ppl_init": {"valid": init_valid, "test": init_test},
        "ppl_best": {"valid": best_valid, "test": best_test},
        "attn_len": int(best_len),
        "curve_valid": {str(c): p for c, p in curve.items()},
        "eval_method": config.eval.method,
        "wall_s": _now() - t0,
    }
  return rows


def learning_curves(workdirs: Path) -> dict:
  """{variant: {"step": [...], "loss": [...]}} from each metrics.jsonl (the
  last row of a step wins, so steps redone after a resume count once)."""
  out = {}
  for v in TRAINED:
    rows = {}
    for line in (workdirs / v / "metrics.jsonl").read_text().splitlines():
      r = json.loads(line)
      if "train/loss" in r and r["train/loss"] is not None:
        rows[r["step"]] = r["train/loss"]
    steps = sorted(rows)
    out[v] = {"step": steps, "loss": [rows[s] for s in steps]}
  return out


def noise_part(
    workdirs: Path,
    corpus,
    sizes: dict,
    data_flags: list,
    logs: Path,
    table6_rows: dict,
    data_dir,
    manual_dir,
) -> dict:
  """Run-to-run noise: ``NOISE_VARIANT`` trained again with another
  ``train.seed`` (the initialisation and the dropout masks change; the data
  are read in the same order) and evaluated as Table 6's "PPL init".  On one
  machine the same seed gives the same run to the last bit (XLA:CPU is
  deterministic): the seed is what varies between runs.

  Returns:
    {"variant", "seeds": [config's, other], "ppl_init": {split: [a, b]},
     "rel_diff": {split: |b - a| / a}, "command", "train_wall_s" (the
     training), "wall_s" (training and evaluation)}.
  """
  from transformer_xl.inference import evaluate

  v, seed = NOISE_VARIANT, sizes["noise_seed"]
  workdir = workdirs / f"{v}_seed{seed}"
  cmd = [
      sys.executable,
      "-m",
      "transformer_xl.main",
      f"--config={CONFIG}:{v}",
      f"--workdir={workdir}",
      *data_flags,
      *sizes["overrides"],
      f"--config.train.seed={seed}",
  ]
  print(f"[noise] {v} with seed {seed}", flush=True)
  t0 = _now()
  train_wall = _run(cmd, logs / f"train_{v}_seed{seed}.log")
  config, model_cfg, _, _, params, mesh = _load(workdir, data_dir, manual_dir)
  evaluator = evaluate.Evaluator(config, model_cfg, corpus, mesh)
  base = table6_rows[v]["ppl_init"]
  ppl = {
      split: [base[split], evaluator.evaluate(params, split)["ppl"]] for split in ("valid", "test")
  }
  base_seed = json.loads((workdirs / v / "config.json").read_text())["train"]["seed"]
  return {
      "variant": v,
      "seeds": [base_seed, seed],
      "ppl_init": ppl,
      "rel_diff": {k: abs(b - a) / a for k, (a, b) in ppl.items()},
      "command": _shown(cmd),
      "train_wall_s": train_wall,
      "wall_s": _now() - t0,
  }


def _plots(out: Path, results: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for v, c in results["learning_curves"].items():
    ax.plot(c["step"], c["loss"], label=v)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss (nats per scored token)")
  ax.set_title("Learning curves (WikiText-2, ablation group)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "learning_curves.png", dpi=120)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(7, 4))
  for v, row in results["table6"].items():
    xs = [int(c) for c in row["curve_valid"]]
    if len(xs) > 1:
      ax.plot(xs, list(row["curve_valid"].values()), marker="o", label=v)
  ax.set_xlabel("evaluation attention length (keys per query)")
  ax.set_ylabel("valid perplexity")
  ax.set_title("Table 6: perplexity against the evaluation attention length")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "table6_attention_length.png", dpi=120)
  plt.close(fig)


def recl_part(workdirs: Path, out: Path, sizes: dict, data_flags: list, logs: Path) -> dict:
  """Table 8 and Figures 3-4: the RECL command on the group."""
  lens = ",".join(str(c) for c in sizes["recl_lens"])
  cmd = [
      sys.executable,
      "-m",
      "transformer_xl.analysis.recl",
      "--workdirs=" + ",".join(str(workdirs / v) for v in RECL_GROUP),
      "--names=" + ",".join(RECL_GROUP),
      "--split=valid",
      f"--context_lengths={lens}",
      f"--delta={sizes['recl_delta']}",
      "--r=0.1,0.5,1.0",
      f"--max_tokens={sizes['recl_tokens']}",
      f"--out={out / 'recl'}",
  ] + [
      f.replace("--config.data.", "--") for f in data_flags if "manual_dir" in f or "data_dir" in f
  ]
  print("[recl]", flush=True)
  wall = _run(cmd, logs / "recl.log")
  res = json.loads((out / "recl" / "recl.json").read_text())
  return {
      "command": _shown(cmd),
      "wall_s": wall,
      "table": res["table"],
      "curves": res["curves"],
      "results": res["results"],
      "tokens": res["tokens"],
      "context_lengths": res["context_lengths"],
  }


def speed_part(out: Path, sizes: dict, logs: Path) -> dict:
  """Table 9 on this machine: benchmarks/eval_speed.py."""
  cmd = [
      sys.executable,
      str(REPO / "benchmarks" / "eval_speed.py"),
      *sizes["speed"],
      f"--json={out / 'eval_speed.json'}",
  ]
  print("[speed]", flush=True)
  wall = _run(cmd, logs / "eval_speed.log")
  res = json.loads((out / "eval_speed.json").read_text())
  return {"command": _shown(cmd), "wall_s": wall, "results": res}


def attention_part(workdir: Path, out: Path, sizes: dict, logs: Path) -> dict:
  """App. D: the attention maps of the best model."""
  cmd = [
      sys.executable,
      "-m",
      "transformer_xl.analysis.attention",
      f"--workdir={workdir}",
      "--split=valid",
      f"--out={out / 'attention'}",
      f"--max_tokens={sizes['map_tokens']}",
      f"--segment={sizes['map_segment']}",
  ]
  print("[attention]", flush=True)
  wall = _run(cmd, logs / "attention.log")
  return {
      "command": _shown(cmd),
      "wall_s": wall,
      "summary": json.loads((out / "attention" / "summary.json").read_text()),
  }


def samples_part(workdir: Path, corpus, sizes: dict) -> dict:
  """App. E: samples of the best model, prompted with the test set's start."""
  from transformer_xl.inference import language_model

  t0 = _now()
  lm = language_model.LanguageModel.from_workdir(str(workdir), corpus=corpus)
  test = corpus.splits["test"].read(0, 60)
  prompt = corpus.decode(test)
  settings = dict(top_k=40, top_p=1.0, temperature=1.0, seed=0)
  gen = lm.generate(prompt, sizes["sample_tokens"], num_samples=2, **settings)
  return {
      "workdir": str(workdir),
      "prompt": prompt,
      "num_tokens": sizes["sample_tokens"],
      **settings,
      "samples": list(gen.texts),
      "wall_s": _now() - t0,
  }


def report(results: dict, findings: bool = False) -> str:
  """REPORT.md from results.json; with ``findings``, a closing link to the
  hand-written FINDINGS.md beside it."""
  m = results["machine"]
  lines = [
      f"Measured on {results['date']} with `{results['command']}` on {m['cpu']} "
      f"({m['cores']} cores, CPU only), jax {m['jax']}; total wall time "
      f"{results['wall_s'] / 60:.0f} min.  Every number below is in "
      "`results/wt2/results.json`.",
      "",
  ]
  lines += [
      "**Table 6 at small scale** (WikiText-2; valid / test perplexity; attention "
      "length = keys per query):",
      "",
      "| variant | recurrence | encoding | loss | PPL init (valid / test) | "
      "PPL best (valid / test) | Attn Len | steps | train wall | eval wall |",
      "|---|---|---|---|---|---|---|---:|---:|---:|",
  ]
  for v, r in results["table6"].items():
    train = results["train"].get(v, {})
    train_wall = (
        f"{train['wall_s'] / 60:.1f} min" if train.get("wall_s") else "alrfou_half's"
    )  # vanilla: alrfou_half's parameters
    lines.append(
        f"| {v} | {r['recurrence']} | {r['encoding']} | {r['loss']} | "
        f"{r['ppl_init']['valid']:.2f} / {r['ppl_init']['test']:.2f} "
        f"(at {r['init_attn_len']}) | {r['ppl_best']['valid']:.2f} / "
        f"{r['ppl_best']['test']:.2f} | {r['attn_len']} | {r['step']:,} | "
        f"{train_wall} | {r['wall_s'] / 60:.1f} min |"
    )
  if "noise" in results:
    nz = results["noise"]
    lines += [
        "",
        f"Run-to-run noise: `{nz['variant']}` trained again with train.seed="
        f"{nz['seeds'][1]} instead of {nz['seeds'][0]} (`{nz['command']}`, "
        f"{nz['train_wall_s'] / 60:.1f} min): PPL init valid "
        f"{nz['ppl_init']['valid'][0]:.2f} against {nz['ppl_init']['valid'][1]:.2f} "
        f"({100 * nz['rel_diff']['valid']:.1f}%), test {nz['ppl_init']['test'][0]:.2f} "
        f"against {nz['ppl_init']['test'][1]:.2f} ({100 * nz['rel_diff']['test']:.1f}%).",
    ]
  lens = sorted({int(c) for r in results["table6"].values() for c in r["curve_valid"]})
  lines += [
      "",
      "Valid perplexity against the evaluation attention length L (the curve; "
      "segment models: a memory of L with same_length, every query sees L keys; "
      "vanilla: windows of L):",
      "",
      "| variant | " + " | ".join(f"L = {c}" for c in lens) + " |",
      "|---|" + "---:|" * len(lens),
  ]
  for v, r in results["table6"].items():
    cells = [f"{r['curve_valid'][str(c)]:.2f}" if str(c) in r["curve_valid"] else "-" for c in lens]
    lines.append(f"| {v} | " + " | ".join(cells) + " |")
  lines += [
      "",
      "![ppl vs attention length](table6_attention_length.png) "
      "![learning curves](learning_curves.png)",
      "",
  ]
  rc = results["recl"]
  lines += [
      f"**Table 8 at small scale**: RECL of the group {', '.join(RECL_GROUP)} on the "
      f"first {rc['tokens']:,} valid tokens, context lengths {rc['context_lengths']} "
      f"(`{rc['command']}`, {rc['wall_s'] / 60:.1f} min):",
      "",
      "```",
      rc["table"],
      "```",
      "",
      "![Fig. 3](recl/fig3_relative_gains.png) ![Fig. 4](recl/fig4_perplexity.png)",
      "",
  ]
  sp = results["speed"]
  lines += [
      f"**Table 9 on this machine** (`{sp['command']}`, {sp['wall_s'] / 60:.1f} min, "
      "load average "
      f"{sp['results']['machine']['loadavg_start'][0]:.2f} at its start; the study's "
      "first part, on an otherwise idle machine):",
      "",
      "```",
      sp["results"]["table"],
      "```",
  ]
  lines += [
      "",
      f"**Appendix D**: `{results['attention']['command']}` "
      f"({results['attention']['wall_s'] / 60:.1f} min)",
      "",
      "![average attention](attention/average_attention.png)",
      "![decomposition](attention/decomposition.png)",
      "",
  ]
  sm = results["samples"]
  lines += [
      f"**Appendix E**: samples of `{Path(sm['workdir']).name}` (top_k {sm['top_k']}, "
      f"temperature {sm['temperature']}, seed {sm['seed']}, {sm['num_tokens']} tokens, "
      f"{sm['wall_s']:.0f} s), "
      "prompted with the first 60 tokens of the test set:",
      "",
      "```",
      "PROMPT: " + sm["prompt"].strip(),
  ]
  for i, s in enumerate(sm["samples"]):
    lines += [f"--- sample {i}", s.strip()]
  lines += ["```", ""]
  if findings:
    lines += [
        "What holds at this scale and what does not, written by hand from these "
        "numbers: [FINDINGS.md](FINDINGS.md).",
        "",
    ]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the study; returns the exit status."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="results/wt2")
  p.add_argument("--workdirs", default="workdirs/wt2_study")
  p.add_argument(
      "--manual_dir",
      default=str(REPO.parent / "shared" / "data" / "wikitext-2"),
      help="where wiki.{train,valid,test}.tokens (or wikitext-2-v1.zip) are",
  )
  p.add_argument("--data_dir", default=None, help="tfds data dir (default tfds's)")
  p.add_argument("--verify_checksums", type=int, default=1, choices=(0, 1))
  p.add_argument("--quick", action="store_true", help="a smoke run in minutes")
  p.add_argument(
      "--report_only",
      action="store_true",
      help="run nothing: rewrite the plots and REPORT.md from --out's results.json",
  )
  args = p.parse_args(argv)
  sizes = QUICK if args.quick else FULL
  out, workdirs = Path(args.out).resolve(), Path(args.workdirs).resolve()
  if args.report_only:
    if not (out / "results.json").is_file():
      sys.exit(
          f"error: --report_only needs {out / 'results.json'} (a finished run's "
          "--out); run the study first."
      )
    results = json.loads((out / "results.json").read_text())
    return _write_report(out, results)
  logs = out / "logs"
  logs.mkdir(parents=True, exist_ok=True)
  workdirs.mkdir(parents=True, exist_ok=True)
  data_flags = [
      f"--config.data.manual_dir={args.manual_dir}",
      f"--config.data.verify_checksums={bool(args.verify_checksums)}",
  ]
  if args.data_dir:
    data_flags.append(f"--config.data.data_dir={args.data_dir}")
  t_start = _now()
  results: dict[str, Any] = {
      "command": "python scripts/reproduce_wt2.py " + " ".join(argv or sys.argv[1:]),
      "date": datetime.date.today().isoformat(),
      "quick": args.quick,
      "machine": machine(),
      "paper": "Dai et al. 2019, Tables 6, 8, 9 and Appendices D, E",
  }
  # Timed first, while nothing else of the study runs.
  results["speed"] = speed_part(out, sizes, logs)
  results["train"] = train_group(workdirs, data_flags, sizes, logs)
  from transformer_xl import data

  corpus = data.load_corpus(
      "wikitext2",
      data_dir=args.data_dir,
      manual_dir=args.manual_dir,
      verify_checksums=bool(args.verify_checksums),
  )
  results["table6"] = table6(workdirs, corpus, sizes, args.data_dir, args.manual_dir)
  results["noise"] = noise_part(
      workdirs, corpus, sizes, data_flags, logs, results["table6"], args.data_dir, args.manual_dir
  )
  results["learning_curves"] = learning_curves(workdirs)
  results["recl"] = recl_part(workdirs, out, sizes, data_flags, logs)
  best = min(("xl", "xl_half", "shaw"), key=lambda v: results["table6"][v]["ppl_best"]["valid"])
  results["best_model"] = best
  results["attention"] = attention_part(workdirs / best, out, sizes, logs)
  results["samples"] = samples_part(workdirs / best, corpus, sizes)
  results["wall_s"] = _now() - t_start
  (out / "results.json").write_text(json.dumps(results, indent=2))
  return _write_report(out, results)


def _write_report(out: Path, results: dict) -> int:
  """The plots and REPORT.md in ``out``; prints the report."""
  _plots(out, results)
  text = report(results, findings=(out / "FINDINGS.md").is_file())
  (out / "REPORT.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except RuntimeError as err:  # a part failed: its command and the end of its log
    sys.exit(f"error: {err}")
