r"""BABILong results in the leaderboard's format, from a trained BABILong workdir.

    python -m transformer_xl.harness.babilong_leaderboard --workdir=W \
        --model_name=my-lab/txl-babilong --tasks=qa1,qa2,qa3,qa4,qa5 \
        --sample_sizes=1024,2048 --out=babilong_evals

The BABILong leaderboard (booydar/babilong, Kuratov et al. 2024) takes
pull requests of ``babilong_evals/<org>/<model>/qa{N}_{length}_{config}.csv``
(columns ``target``, ``output``, ``question``, a row per test sample, the
index first as ``pandas.to_csv`` writes it) and, beside each, a JSON of the
prompt and the generation settings (their ``notebooks/eval_gpt2.py`` writes
both alike).  For each task and sample size this builds the task's test
split with the workdir's BABILong settings (``data/babilong.py``: the test
file in order, the test background text; ``data.dataset`` and
``data.babilong_sample_size`` replaced), decodes every answer greedily
through the model's memory (``Evaluator.decode_answers``: ``A`` tokens
after the ``GEN`` token, cut at the first end token), and writes the files.
A fine-tuned model has no instruction, examples or post-prompt: the
config name is ``instruction_no_examples_no_post_prompt_no_chat_template_no``
and the template ``{context}{question}GEN`` (the authors' fine-tuning
layout).

Scored by both of the authors' rules: ``babilong_accuracy``, their training
scripts' (``babilong_samples.compare_answers``: the target in the first
sentence) and ``leaderboard_accuracy``, the leaderboard's
(``babilong_samples.leaderboard_answers``, what ``collect_results.py``
applies: the task's labels in the first sentence, less those in the question,
exactly the target), each in percent per task and length, and the qa1-qa5
average per length as ``collect_results.py`` takes it (only where all five
tasks were scored at that length).  Printed as a table and written to
``--summary`` (JSON) if given.

Length names: a sample size that is a multiple of 1024 tokens is the
leaderboard's ``Nk`` (``1k`` ... ``512k``; a multiple of 2^20 ``NM``); any
other size is written ``<tokens>t`` (e.g. ``128t``), a length the leaderboard
does not list (``collect_results.py --lengths 128t`` reads it).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from transformer_xl import errors

CONFIG_NAME = "instruction_no_examples_no_post_prompt_no_chat_template_no"
PROMPT = {  # a fine-tuned model's: the context, the question, the GEN token
    "instruction": "",
    "examples": "",
    "post_prompt": "",
    "template": "{context}{question}GEN",
    "chat_template": False,
}
AVERAGED = ("qa1", "qa2", "qa3", "qa4", "qa5")  # collect_results.py's average: these five
RULES = ("leaderboard_accuracy", "babilong_accuracy")


class LeaderboardError(errors.UserError):
  """An argument or a workdir the export cannot use (one line)."""


def length_label(sample_size: int) -> str:
  """The leaderboard's name of a sample size in tokens: ``Nk`` for a multiple
  of 1024, ``NM`` for one of 2^20, else ``<tokens>t``."""
  if sample_size % 2**20 == 0:
    return f"{sample_size // 2**20}M"
  if sample_size % 1024 == 0:
    return f"{sample_size // 1024}k"
  return f"{sample_size}t"


def score_rows(task: str, rows: Sequence[dict[str, str]]) -> dict[str, float]:
  """Both rules' accuracies (percent) of ``rows`` ({target, output,
  question}), and the rows' count."""
  from transformer_xl.data import babilong_samples  # pylint: disable=import-outside-toplevel

  n = len(rows)
  board = sum(
      babilong_samples.leaderboard_answers(r["target"], r["output"], r["question"], task)
      for r in rows
  )
  train = sum(babilong_samples.compare_answers(r["target"], r["output"]) for r in rows)
  return {
      "leaderboard_accuracy": 100.0 * board / n if n else 0.0,
      "babilong_accuracy": 100.0 * train / n if n else 0.0,
      "samples": n,
  }


def averages(scores: dict[str, dict[str, dict]]) -> dict[str, dict[str, float | None]]:
  """rule -> length -> the mean over qa1-qa5 (``collect_results.py``'s
  ``avg`` row), None where one of the five was not scored at that length.

  Args:
    scores: task -> length -> ``score_rows``'s dict.
  """
  lengths = sorted({length for per_task in scores.values() for length in per_task})
  out: dict[str, dict[str, float | None]] = {}
  for rule in RULES:
    out[rule] = {}
    for length in lengths:
      got = [scores.get(t, {}).get(length) for t in AVERAGED]
      out[rule][length] = (
          None if any(g is None for g in got) else float(np.mean([g[rule] for g in got]))
      )
  return out


def table(scores: dict[str, dict[str, dict]]) -> str:
  """Markdown: a row per task and the qa1-qa5 average, a column per length,
  each cell "leaderboard / babilong" percent."""
  lengths = sorted(
      {length for per_task in scores.values() for length in per_task}, key=_length_tokens
  )
  avg = averages(scores)
  lines = [
      "| task | " + " | ".join(lengths) + " |",
      "|---|" + "---:|" * len(lengths),
  ]
  cell = (
      lambda s: "-"
      if s is None
      else f"{s['leaderboard_accuracy']:.0f} / {s['babilong_accuracy']:.0f}"
  )
  for task in sorted(scores, key=lambda t: int(t[2:])):
    lines.append(f"| {task} | " + " | ".join(cell(scores[task].get(l)) for l in lengths) + " |")
  avg_cells = [
      "-"
      if avg["leaderboard_accuracy"][l] is None
      else f"{avg['leaderboard_accuracy'][l]:.0f} / {avg['babilong_accuracy'][l]:.0f}"
      for l in lengths
  ]
  lines.append("| avg qa1-qa5 | " + " | ".join(avg_cells) + " |")
  return "\n".join(lines)


def _length_tokens(label: str) -> int:
  unit = {"k": 1024, "M": 2**20, "t": 1}[label[-1]]
  return int(label[:-1]) * unit


def write_files(
    folder: Path, task: str, length: str, rows: Sequence[dict[str, str]], settings: dict
) -> Path:
  """``qa{N}_{length}_{CONFIG_NAME}.csv`` (index, target, output, question) and
  its ``.json`` ({"prompt", "generate_kwargs", "transformer_xl"}) in ``folder``;
  returns the CSV's path."""
  folder.mkdir(parents=True, exist_ok=True)
  stem = folder / f"{task}_{length}_{CONFIG_NAME}"
  with open(stem.with_suffix(".csv"), "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(["", "target", "output", "question"])
    for i, r in enumerate(rows):
      writer.writerow([i, r["target"], r["output"], r["question"]])
  stem.with_suffix(".json").write_text(json.dumps(settings, indent=4) + "\n")
  return stem.with_suffix(".csv")


def export(
    workdir: str,
    out: str,
    model_name: str,
    tasks: Sequence[str],
    sample_sizes: Sequence[int],
    *,
    max_examples: int = 0,
    num_rows: int = 0,
    manual_dir: str | None = None,
    max_n_facts: int | None = None,
    qa_margin: int | None = None,
    log=print,
) -> dict[str, dict[str, dict]]:
  """Decodes the test split of every task at every sample size and writes the
  leaderboard's files under ``out/model_name``.

  Args:
    workdir: a run trained on ``data.dataset="babilong:qaN"``.
    out: the ``babilong_evals`` folder.
    model_name: ``<org>/<model>``, the folder under ``out``.
    tasks: "qa1" ... "qa20" (their bAbI files in ``data.manual_dir``, or
      downloaded as training reads them).
    sample_sizes: E, tokens per sample (context, question and answer), each a
      multiple of the workdir's ``eval.tgt_len``.
    max_examples: test samples per task and length at most (0: the
      workdir's ``data.babilong_test_size``).
    num_rows: samples decoded side by side (0: ``eval.global_batch``).
    manual_dir: where the bAbI files are (default: the workdir's).
    max_n_facts: ``data.babilong_max_n_facts`` (default: the workdir's; 0 keeps
      every story, as the leaderboard's test sets do).
    qa_margin: ``data.babilong_qa_margin``, the tokens of a sample left for
      its question and answer (default: the workdir's; other tasks' questions
      may be longer than its task's).
    log: called with each line of progress.

  Returns:
    task -> length name -> ``score_rows``'s dict.

  Raises:
    LeaderboardError: not a BABILong workdir, a bad task, model name or size.
    errors.UserError: the data or the workdir cannot be used (one line).
  """
  # pylint: disable=import-outside-toplevel  (JAX and the data only when exporting)
  from transformer_xl.data import babilong
  from transformer_xl.inference import language_model, trained_model
  from transformer_xl.run import workdir as wd

  problems = _argument_problems(model_name, tasks, sample_sizes, max_examples, max_n_facts)
  if problems:
    raise LeaderboardError(" ".join(problems))
  config = wd.load_config(workdir)
  _check_babilong(workdir, config.data.dataset)
  lm = None
  scores: dict[str, dict[str, dict]] = {}
  folder = Path(out) / model_name
  for task in tasks:
    for size in sample_sizes:
      cfg = config.copy_and_resolve_references()
      with cfg.unlocked():
        cfg.data.dataset = babilong.PREFIX + task
        cfg.data.babilong_sample_size = int(size)
        cfg.data.babilong_train_sample_sizes = ""
        cfg.data.babilong_valid_size = 1  # only the test split is read
        if max_examples:
          cfg.data.babilong_test_size = int(max_examples)
        if manual_dir is not None:
          cfg.data.manual_dir = manual_dir
        if max_n_facts is not None:
          cfg.data.babilong_max_n_facts = int(max_n_facts)
        if qa_margin is not None:
          cfg.data.babilong_qa_margin = int(qa_margin)
      if lm is None:
        lm = language_model.LanguageModel.from_workdir(workdir, config=cfg)
        trained = trained_model.model_configs(cfg, workdir)[0]
        corpus = lm.corpus
      else:
        corpus = trained_model.load_corpus(cfg, trained, workdir)
      run = language_model.LanguageModel(cfg, lm.model_cfg, corpus, lm.params, lm.step, lm.mesh)
      examples_NxS = corpus.examples["test"]
      preds_NxA = run.evaluator.decode_answers(lm.params, examples_NxS, num_rows)
      rows = []
      for i, ids in enumerate(np.asarray(preds_NxA).tolist()):
        ids = ids[: ids.index(corpus.boundary_id)] if corpus.boundary_id in ids else ids
        rows.append(
            {
                "target": corpus.answers["test"][i],
                "output": corpus.decode(ids).strip(),
                "question": corpus.questions["test"][i],
            }
        )
      length = length_label(int(size))
      settings = {
          "prompt": PROMPT,
          "generate_kwargs": {
              "do_sample": False,
              "max_new_tokens": int(preds_NxA.shape[1]),
              "stop": "the first end token",
          },
          "transformer_xl": {
              "workdir": str(workdir),
              "step": int(lm.step),
              "sample_size_tokens": int(size),
              "tokenizer": cfg.data.tokenizer,
              "memory": lm.model_cfg.memory,
              "eval_tgt_len": int(cfg.eval.tgt_len),
              "eval_mem_len": int(cfg.eval.mem_len),
          },
      }
      path = write_files(folder, task, length, rows, settings)
      scores.setdefault(task, {})[length] = score_rows(task, rows)
      s = scores[task][length]
      log(
          f"{task} {length}: {s['samples']} samples, leaderboard rule "
          f"{s['leaderboard_accuracy']:.1f}%, babilong rule {s['babilong_accuracy']:.1f}%: {path}"
      )
  return scores


def _check_babilong(workdir: str, dataset: str) -> None:
  from transformer_xl.data import babilong  # pylint: disable=import-outside-toplevel

  if not babilong.is_babilong(dataset):
    raise LeaderboardError(
        f"--workdir={workdir} was trained on data.dataset={dataset!r}: give the workdir of a "
        "BABILong run (data.dataset='babilong:qaN')."
    )


def _argument_problems(
    model_name: str,
    tasks: Sequence[str],
    sample_sizes: Sequence[int],
    max_examples: int,
    max_n_facts: int | None,
) -> list[str]:
  from transformer_xl.data import babilong_sources  # pylint: disable=import-outside-toplevel

  problems = []
  parts = model_name.split("/")
  if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
    problems.append(f"--model_name={model_name!r}: give <org>/<model>, e.g. my-lab/txl-babilong.")
  bad = [t for t in tasks if t not in babilong_sources.TASK_NAMES]
  if bad or not tasks:
    problems.append(f"--tasks={','.join(tasks)}: give qa1 ... qa20, comma-separated.")
  if not sample_sizes or any(s < 1 for s in sample_sizes):
    problems.append("--sample_sizes: give token counts >= 1, comma-separated.")
  if max_examples < 0:
    problems.append(f"--max_examples={max_examples}: give 0 (all) or more.")
  if max_n_facts is not None and max_n_facts < 0:
    problems.append(f"--max_n_facts={max_n_facts}: give 0 (every story) or more.")
  return problems


def _ints(text: str) -> list[int]:
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r}: give integers, comma-separated") from None


def main(argv: Sequence[str] | None = None) -> None:
  """The command line (module docstring); one ``error:`` line on bad input."""
  parser = argparse.ArgumentParser(
      prog="python -m transformer_xl.harness.babilong_leaderboard",
      description="BABILong leaderboard files (babilong_evals/<org>/<model>/) from a workdir.",
  )
  parser.add_argument("--workdir", required=True, help="a run trained on babilong:qaN")
  parser.add_argument("--model_name", required=True, help="<org>/<model>")
  parser.add_argument("--out", default="babilong_evals", help="the babilong_evals folder")
  parser.add_argument("--tasks", default="", help="qa1,...; default: the workdir's task")
  parser.add_argument(
      "--sample_sizes", type=_ints, default=None, help="tokens per sample; default: the workdir's"
  )
  parser.add_argument("--max_examples", type=int, default=0, help="test samples at most (0: all)")
  parser.add_argument("--batch_size", type=int, default=0, help="rows decoded together")
  parser.add_argument("--manual_dir", default=None, help="the bAbI files (default: the workdir's)")
  parser.add_argument(
      "--max_n_facts",
      type=int,
      default=None,
      help="data.babilong_max_n_facts (default: the workdir's; 0: every story, as the leaderboard)",
  )
  parser.add_argument(
      "--qa_margin",
      type=int,
      default=None,
      help="data.babilong_qa_margin: tokens for question and answer (default: the workdir's)",
  )
  parser.add_argument("--summary", default=None, help="write the scores here (JSON)")
  args = parser.parse_args(argv)
  try:
    from transformer_xl.run import workdir as wd  # pylint: disable=import-outside-toplevel

    config = wd.load_config(args.workdir)
    _check_babilong(args.workdir, config.data.dataset)
    default_task = config.data.dataset.split(":", 1)[-1]
    tasks = [t for t in args.tasks.split(",") if t] or [default_task]
    sizes = args.sample_sizes or [int(config.data.babilong_sample_size)]
    scores = export(
        args.workdir,
        args.out,
        args.model_name,
        tasks,
        sizes,
        max_examples=args.max_examples,
        num_rows=args.batch_size,
        manual_dir=args.manual_dir,
        max_n_facts=args.max_n_facts,
        qa_margin=args.qa_margin,
    )
  except (errors.UserError, FileNotFoundError) as err:
    sys.exit(f"error: {err}")
  print(table(scores))
  if args.summary:
    Path(args.summary).write_text(
        json.dumps({"scores": scores, "averages": averages(scores)}, indent=1) + "\n"
    )


if __name__ == "__main__":
  main()
