"""A curriculum: stages trained one after the other, each from the last one's parameters.

The recurrent-memory authors train long tasks in stages of growing length,
each initialised from the previous stage's model: ARMT's associative
retrieval over 1, 2, 3, 5, 10, 20, 40, 50, 200 key-value pairs
(``scripts/associative_retrieval/finetune_amt_ar-value_cur.sh`` of
RodkinIvan/associative-recurrent-memory-transformer), BABILong over 2, 3,
5, 8, 16, 32 segments (``scripts/babilong/finetune_babilong_amt_cur.sh``);
a stage ends at its step budget or early, on a validation target
(``early_stop.py``).

``train.curriculum`` is a tuple of stages, each a string of ``KEY=VALUE``
overrides of the run's config (``train_checks.stage_config``), e.g.
``("data.synthetic_num_pairs=1 train.num_steps=2000",
"data.synthetic_num_pairs=2 train.num_steps=10000")``.  Every stage is
validated as a config of its own before anything is trained, and the
stages' models must differ only where ``train.init_from`` allows (the
memory, segments, dropout: ``init_from.FREE``).

Layout of the workdir ``W``:

* ``W/config.json``: the curriculum's config (the same command without
  ``--config`` resumes); a later run with other stages is refused;
* ``W/stages/NN/``: stage NN's run, a workdir of its own (config.json,
  checkpoints, metrics.jsonl with ``curriculum/stage`` in every row, and
  ``early_stop.json`` when it stopped early); stage NN > 0 starts from stage
  NN-1's newest checkpoint (``train.init_from``: its parameters, **the
  optimizer fresh**, as the authors' runs load ``model_cpt`` into a new
  AdamW and a new schedule with its warmup); stage 0 from the config's own
  ``train.init_from`` or from scratch;
* ``W/stages/NN/stage_done.json``: the stage finished (its budget or
  early): its last step, why it ended, the batch rows it trained on
  (``rows_seen``: whole examples where a step backpropagates through an
  example's segments, segments otherwise), the seconds of its last run;
* ``W/eval_results.json``: the final model (the last stage's) evaluated on
  the valid and test splits of every stage's data (the capacity curve),
  with each stage's steps and why it ended.

Resume: the same command skips the finished stages and resumes the current
one from its newest checkpoint exactly (the run's own resume); a stage that
had finished but was not yet marked is found finished and marked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from etils import epath
from jax.sharding import Mesh

from transformer_xl import data, default_config
from transformer_xl.inference import evaluate
from transformer_xl.run import distributed, metrics, run_dir, train_checks
from transformer_xl.run import workdir as wd
from transformer_xl.training import early_stop, init_from, train
from transformer_xl.util import files, report

DONE = "stage_done.json"
RESULTS = "eval_results.json"


def stage_dir(workdir: str, i: int) -> str:
  """``W/stages/NN``: stage ``i``'s workdir."""
  return str(epath.Path(workdir) / "stages" / f"{i:02d}")


def stage_label(config: ml_collections.ConfigDict, i: int) -> str:
  """``stage 2/9 data.synthetic_num_pairs=3``: what the console calls stage ``i``."""
  stages = config.train.curriculum
  return f"stage {i + 1}/{len(stages)} {stages[i]}".strip()


def _stage_configs(config: ml_collections.ConfigDict, workdir: str) -> list:
  """Each stage's config, with ``train.init_from`` chained through the stages."""
  out = []
  for i in range(len(config.train.curriculum)):
    cfg = train_checks.stage_config(config, i)
    cfg.train.init_from = stage_dir(workdir, i - 1) if i else config.train.init_from
    out.append(cfg)
  return out


def _check_models(stages: list) -> None:
  """The stages' models differ only in ``init_from.FREE`` fields.

  Raises:
    default_config.ConfigError: naming the stage and the field.
  """
  first = default_config.model_config(stages[0], 1 << 20)
  problems = []
  for i, cfg in enumerate(stages[1:], 1):
    other = default_config.model_config(cfg, 1 << 20)
    problems += [f"train.curriculum[{i}]: {p}" for p in init_from.model_problems(first, other)]
  if problems:
    raise default_config.ConfigError(
        "The stages of a curriculum start from each other's parameters: " + " ".join(problems)
    )


def _check_plan(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes the curriculum's ``config.json`` in ``workdir`` (the same command
  without ``--config`` resumes it), after checking that a recorded one has
  the same stages.

  Raises:
    default_config.ConfigError: this workdir was trained with other stages.
  """
  if (epath.Path(workdir) / "config.json").exists():
    recorded = tuple(wd.load_config(workdir).train.get("curriculum", ()))
    if recorded != tuple(config.train.curriculum):
      raise default_config.ConfigError(
          f"train.curriculum={tuple(config.train.curriculum)!r} differs from the curriculum "
          f"{workdir} was trained with, {recorded!r}: use another --workdir, or the same stages."
      )
  wd.save_config(workdir, config)


def _done(workdir: str) -> dict | None:
  path = epath.Path(workdir) / DONE
  return json.loads(path.read_text()) if path.exists() else None


def _mark_done(workdir: str, cfg: ml_collections.ConfigDict, last: dict, seconds: float) -> dict:
  """``stage_done.json``: the stage's last step, why it ended, its compute."""
  stopped = early_stop.stopped_at(workdir)
  rows = [r for r in metrics.read_rows(workdir) if "train/loss" in r]
  step = stopped[0] if stopped else cfg.train.num_steps
  record = {
      "step": step,
      "ended": stopped[1] if stopped else f"train.num_steps={cfg.train.num_steps}",
      "rows_seen": step * cfg.train.global_batch,  # whole examples when a step is one
      "train_seconds_this_run": round(seconds, 1),
      "last_train_loss": rows[-1]["train/loss"] if rows else last.get("loss"),
  }
  if jax.process_index() == 0:
    files.write_text_atomic(epath.Path(workdir) / DONE, json.dumps(record, indent=2) + "\n")
  return record


def _load_corpus(cfg: ml_collections.ConfigDict) -> data.Corpus:
  data_cfg = cfg.data.to_dict()
  return distributed.process_0_first(lambda: data.load_configured(data_cfg), (data.DataError,))


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    mesh: Mesh,
    stop_requested: Callable[[], bool | str] = lambda: False,
    load_corpus: Callable[[ml_collections.ConfigDict], data.Corpus] = _load_corpus,
) -> dict:
  """Trains the stages of ``config.train.curriculum`` in ``workdir``, then
  evaluates the final model at every stage (``eval_results.json``).

  Returns:
    {"stages": [each stage's record], "results": the evaluation} once
    every stage is done; {"preempted_at_step": ..., "stage": i} when
    ``stop_requested`` stopped a stage.

  Raises:
    default_config.ConfigError: stages whose models differ in more than
      ``init_from.FREE``, or other stages than this workdir's; and the
      errors of ``train.train_and_evaluate`` (a stage's run).
  """
  stages = _stage_configs(config, workdir)
  _check_models(stages)
  _check_plan(config, workdir)
  records = []
  for i, cfg in enumerate(stages):
    sub, label = stage_dir(workdir, i), stage_label(config, i)
    record = _done(sub)
    if record is not None:
      report.log(f"[{label}] done earlier: step {record['step']}, {record['ended']}.")
      records.append(record)
      continue
    report.log(f"[{label}] training in {sub}.")
    start = time.time()
    last = train.train_and_evaluate(
        cfg, sub, load_corpus(cfg), mesh, stop_requested=stop_requested, stage=(i, label)
    )
    if "preempted_at_step" in last:
      return {"preempted_at_step": last["preempted_at_step"], "stage": i}
    records.append(_mark_done(sub, cfg, last, time.time() - start))
  results = evaluate_stages(config, stages, workdir, mesh, load_corpus)
  for record, res in zip(records, results):
    res.update(record)
  if jax.process_index() == 0:
    text = metrics.dumps({"stages": results}, indent=2)
    files.write_text_atomic(epath.Path(workdir) / RESULTS, text + "\n")
  report.log(f"Curriculum done: {len(stages)} stages; results in {workdir}/{RESULTS}.")
  return {"stages": records, "results": results}


def evaluate_stages(
    config: ml_collections.ConfigDict,
    stages: list,
    workdir: str,
    mesh: Mesh,
    load_corpus: Callable[[ml_collections.ConfigDict], data.Corpus] = _load_corpus,
) -> list[dict]:
  """The last stage's model on the valid and test splits of every stage's
  data, with that stage's eval settings (the capacity curve).

  Args:
    config: the curriculum's config.
    stages: each stage's config (``_stage_configs``).
    workdir: the curriculum's workdir.
    mesh: the devices.
    load_corpus: a stage's corpus from its config.

  Returns:
    One dict per stage: "stage", "overrides" (its ``train.curriculum``
    entry, parsed), "valid" and "test" (``Evaluator.evaluate``'s results).
  """
  params, out = None, []
  for i, cfg in enumerate(stages):
    corpus = load_corpus(cfg)
    mcfg = default_config.model_config(cfg, corpus.vocab_size)
    if params is None:
      _, params = run_dir.restore_params(stage_dir(workdir, len(stages) - 1), mcfg, mesh)
    evaluator = evaluate.Evaluator(cfg, mcfg, corpus, mesh)
    entry = config.train.curriculum[i]
    res: dict[str, Any] = {"stage": i, "overrides": train_checks.stage_overrides(entry)}
    for split in ("valid", "test"):
      res[split] = evaluator.evaluate(params, split)
      report.log(f"[final model on {stage_label(config, i)}] {split}: " + _line(res[split]))
    out.append(res)
  return out


def _line(res: dict) -> str:
  keys = [k for k in ("loss_nats", "answer_accuracy", "answer_token_accuracy") if k in res]
  return metrics.scalars_line({k: res[k] for k in keys})
