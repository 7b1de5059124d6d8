"""The training loop: train, validate, checkpoint, resume.

Reference semantics (Dai et al. 2019; reference ``train.py``): the train
step (train_step.py) runs on batches of contiguous rows, each row's memory
carried from step to step and emptied at the start of every epoch; the
optimizer and the state are in train_state.py.  Around the step:
resuming from the newest usable checkpoint (run/run_dir.py), the log
(loss, learning rate, gradient norm, tokens/s), validation, checkpoints,
the non-finite policy and the clean stop of a preempted run (guards.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from transformer_xl import data, default_config, sharding
from transformer_xl.data import armt_retrieval, example_corpus, text_vocab
from transformer_xl.inference import evaluate
from transformer_xl.model import models
from transformer_xl.run import checkpointing, metrics, retention, run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import early_stop, guards, init_from, train_state
from transformer_xl.training.train_state import TrainState
from transformer_xl.training.train_step import make_train_step
from transformer_xl.util import report


def aux_loss_means(rows: list[Mapping[str, Any]]) -> dict[str, float]:
  """Means over the host metrics of steps (``rows``) of the auxiliary-loss
  metrics (``aux_loss/<name>``, ``total_loss``), for the log; {} without any."""
  keys = sorted({k for row in rows for k in row if k.startswith("aux_loss/") or k == "total_loss"})
  return {k: float(np.mean([row[k] for row in rows if k in row])) for k in keys}


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    corpus: data.Corpus,
    mesh: Mesh,
    stop_requested: Callable[[], bool | str] = lambda: False,
    stage: tuple[int, str] | None = None,
) -> dict:
  """Trains until ``config.train.num_steps``, resuming from ``workdir`` if possible.

  Resumes from the newest usable checkpoint (damaged ones are reported,
  skipped and moved to ``checkpoints_rejected/``; checkpointing.py), after
  checking that it was made with the same model, data and batch (before
  anything is compiled; a difference stops the run and leaves the workdir
  unchanged).  Then saves the run's config.json and model_config.json
  (workdir.py); logs loss (nats), bpc or ppl, learning rate, gradient norm
  and tokens/s (tokens = global_batch * tgt_len per step) every
  ``log_every`` steps to TensorBoard, metrics.jsonl and a console progress
  bar (metrics.py); validates every ``eval_every`` steps with the eval
  settings, and stops after a validation that meets ``train.stop_*``
  (early_stop.py; a run that stopped so does nothing when resumed); checkpoints every ``checkpoint.every_steps``, at the end and
  when ``stop_requested()`` becomes true (then it returns; a string names
  the signal in the message: the command line passes SIGTERM's and
  Ctrl-C's flag, ``PreemptionGuard``).  Non-finite steps are handled
  by ``train.nonfinite`` (``NonFiniteGuard``); a checkpoint is never
  written with a non-finite value.

  A checkpoint is good only once a step computed from it had a finite loss
  and gradient norm, or its validation was finite
  (``retention.Verification``): when the run diverges, the checkpoints
  saved after the newest good one are moved to ``checkpoints_rejected/``
  and the message names the good one, from which the same command with a
  lower learning rate resumes.  Rotation keeps the newest
  ``checkpoint.max_to_keep`` checkpoints and the newest good one
  (``retention.prune``).  One training at a time per workdir: a second
  one stops at once naming the first (``lock.training_lock``).

  ``stage``: (index, name) of a curriculum's stage (curriculum.py): the
  console lines and the progress bar name it, and every metrics.jsonl row
  carries ``curriculum/stage``.

  Returns:
    The last logged training metrics (dict of floats; with
    ``stopped_early_at_step`` after an early stop, ``preempted_at_step``
    after a requested stop).

  Raises:
    workdir.WorkdirError: another training holds the workdir.
    default_config.ConfigError: the model does not fit the corpus's
      vocabulary, or differs from the workdir's checkpoints.
    checkpointing.CheckpointError: checkpoints exist but none is usable, or
      one cannot be written (full disk, read-only).
    metrics.NonFiniteError: training diverged (``train.nonfinite``).
  """
  tcfg = config.train
  mcfg = default_config.model_config(config, corpus.vocab_size)
  meta = wd.checkpoint_meta(
      mcfg, corpus.unit, corpus.name, tcfg.global_batch, tcfg.get("mem_backprop_depth", 0)
  )
  with run_dir.RunDir(workdir, meta, config.checkpoint.max_to_keep) as rundir:
    return _train_and_evaluate(config, mcfg, rundir, corpus, mesh, stop_requested, stage)


def _train_and_evaluate(
    config: ml_collections.ConfigDict,
    mcfg: models.ModelConfig,
    rundir: run_dir.RunDir,
    corpus: data.Corpus,
    mesh: Mesh,
    stop_requested: Callable[[], bool | str],
    stage: tuple[int, str] | None,
) -> dict:
  """``train_and_evaluate``'s work in its run directory (lock held): the
  state (restored or new), the data from where it stopped, then the steps."""
  tcfg = config.train
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(tcfg, mcfg)
  abstract_state, state_shardings = train_state.abstract_train_state(
      model, tx, tcfg.global_batch, mesh
  )
  problem = early_stop.corpus_problem(
      tcfg.get("stop_metric", ""), corpus.unit, isinstance(corpus, example_corpus.ExampleCorpus)
  )
  if problem:
    raise default_config.ConfigError(problem)
  train_iter, window_advance = _train_iterator(config, mcfg, corpus, mesh)
  restored = rundir.restore(abstract_state)
  if restored is None:  # fresh, or from train.init_from's parameters
    state = init_from.initial_state(config, model, tx, mesh, state_shardings, corpus.unit)
    start_step = 0
  else:
    start_step, state = restored.step, restored.state
    _resume_data(train_iter, restored)
    stopped = early_stop.stopped_at(rundir.workdir)
    if stopped is not None and stopped[0] == start_step:  # its marker, then its checkpoint
      report.log(
          f"This run stopped early at step {start_step} ({stopped[1]}): nothing to train "
          f"(to train on, remove {early_stop.MARKER} from the workdir)."
      )
      return {"stopped_early_at_step": start_step}
  rundir.start(restored, config, mcfg)
  _report_run(config, corpus, rundir.workdir, state)
  step_of = lambda depth, advance: make_train_step(
      model,
      tx,
      mesh,
      state_shardings,
      tcfg.batch_chunk,
      tcfg.seed,
      tcfg.loss_span,
      tcfg.aux_loss_weight,
      depth,
      tcfg.get("bptt_bp", False),
      advance,
  )
  if tcfg.get("vary_n_segments", False):  # one step per window length, made when first met
    train_step = _per_window(lambda n: step_of(n - 1, n))
  else:
    train_step = step_of(tcfg.get("mem_backprop_depth", 0), window_advance)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh) if tcfg.eval_every else None
  return _run_steps(
      config,
      rundir,
      mesh,
      state,
      start_step,
      train_iter,
      train_step,
      evaluator,
      unit=corpus.unit,
      tokens_per_step=tcfg.global_batch * mcfg.tgt_len * window_advance,  # new tokens a step
      stop_requested=stop_requested,
      stage=stage,
  )


def _per_window(make: Callable[[int], Callable]) -> Callable:
  """A train step for windows of any length: ``make(n)``'s step for a
  batch of n segments (``reset`` [B, n]), each made (and compiled) once."""
  steps: dict[int, Callable] = {}

  def step(state, batch):
    n = int(batch["reset"].shape[1])
    if n not in steps:
      steps[n] = make(n)
    return steps[n](state, batch)

  return step


def _train_iterator(
    config: ml_collections.ConfigDict, mcfg: models.ModelConfig, corpus: data.Corpus, mesh: Mesh
) -> tuple[Any, int]:
  """The training batches of this process's rows, and the segments from one
  batch's start to the next's (``window_advance`` of ``make_train_step``).

  Contiguous rows of the corpus (or, One Billion Word, shuffled-sentence
  rows); with ``train.mem_backprop_depth`` k > 0, windows of k + 1 segments
  sliding by one (``data.SegmentWindows``), or a synthetic task's whole
  examples (``example_corpus.ExampleWindows``).

  Raises:
    default_config.ConfigError: a depth that does not fit the data.
  """
  tcfg = config.train
  # Ordered contiguous rows, or (One Billion Word) shuffled-sentence rows.
  train_iter = data.make_train_iterator(
      corpus,
      "train",
      tcfg.global_batch,
      mcfg.tgt_len,
      seed=tcfg.seed,
      row_ids=data.process_row_ids(sharding.batch_sharding(mesh), tcfg.global_batch, mcfg.tgt_len),
      documents=config.data.get("documents", "stream"),
  )  # "reset": batches carry doc_pos
  depth = tcfg.get("mem_backprop_depth", 0)
  window_advance = 1
  if tcfg.get("vary_n_segments", False):  # whole examples of 1..P pairs (validated)
    s = corpus.settings
    windows = armt_retrieval.VaryPairsWindows(train_iter, s.key_size, s.value_size, tcfg.seed)
    return windows, depth + 1  # the longest window's segments (tokens/s: an upper bound)
  if depth and isinstance(train_iter, example_corpus.ExampleIterator):  # a step per whole example
    if depth + 1 != train_iter.segments or not tcfg.get("bptt_bp", False):
      raise default_config.ConfigError(
          f"train.mem_backprop_depth={depth}: a synthetic task trains on whole examples "
          f"(the authors' train_synthetic.py): set train.mem_backprop_depth="
          f"{train_iter.segments - 1} (its {train_iter.segments} segments of "
          f"{mcfg.tgt_len}) and train.bptt_bp=True (the whole answer's loss), or 0."
      )
    train_iter, window_advance = example_corpus.ExampleWindows(train_iter), depth + 1
  elif depth:  # windows of k + 1 segments, sliding by one
    try:
      train_iter = data.SegmentWindows(train_iter, depth)
    except ValueError as err:
      raise default_config.ConfigError(str(err)) from None
  return train_iter, window_advance


def _resume_data(train_iter: Any, restored: checkpointing.Restored) -> None:
  """Moves ``train_iter`` to the data position saved with ``restored``.

  Raises:
    default_config.ConfigError: the position does not fit this run's data.
  """
  if restored.iterator_state:  # {} = a checkpoint made elsewhere (e.g. converted)
    try:
      train_iter.set_state(restored.iterator_state)
    except ValueError as err:
      raise default_config.ConfigError(
          f"The data position saved in {restored.path} does not fit this run's data: {err} "
          "Resume with the workdir's data settings, or use a new --workdir."
      ) from None


def _report_run(
    config: ml_collections.ConfigDict, corpus: data.Corpus, workdir: str, state: Any
) -> None:
  """What the run starts with: one's own text's tokenizer saved in the
  workdir (so that generation and scoring need no corpus file) and its
  documents reported; the parameter count against the paper's; the size
  of a checkpoint, and a note where the memory is most of it (a large
  store of a memory variant)."""
  params = state.params
  if corpus.name == data.TEXT and jax.process_index() == 0:  # generate/score without the files
    text_vocab.save_tokenizer(corpus, workdir)
  if corpus.name == data.TEXT and corpus.documents is not None:
    from transformer_xl.data import text_builder  # imports tfds (already loaded for this corpus)

    report.log(
        text_builder.documents_report(
            corpus,
            config.data.get("document_separator", "file"),
            config.data.get("documents", "stream"),
        )
    )

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  paper = ""
  if config.paper.n_params:
    paper = (
        f"; paper: {config.paper.n_params / 1e6:.0f}M "
        f"({100 * (n_params / config.paper.n_params - 1):+.1f}%), {config.paper.result}"
    )
  elif config.paper.result:
    paper = f"; paper: no parameter count reported, {config.paper.result}"
  report.log(f"Model: {n_params:,} parameters ({n_params / 1e6:.1f}M{paper}).")
  parts = train_state.state_bytes(state)
  mib = lambda n: f"{n / 2**20:,.4g} MiB"
  keep = config.checkpoint.max_to_keep
  line = (
      f"Checkpoint: {mib(sum(parts.values()))} each (parameters {mib(parts['params'])}, "
      f"optimizer {mib(parts['opt_state'])}, memory {mib(parts['memory'])}); "
      f"checkpoint.max_to_keep={keep}."
  )
  if parts["memory"] > parts["params"] + parts["opt_state"]:
    line += (
        f"  The memory of the {config.train.global_batch} training rows is most of it "
        f"(model.memory={config.model.memory!r}); {keep} checkpoints take up to "
        f"{mib(keep * sum(parts.values()))} on disk (less while the memory is not yet "
        "full: the checkpoint's arrays are compressed)."
    )
  report.log(line)


def _placed_batches(
    train_iter: Any, mesh: Mesh, tcfg: ml_collections.ConfigDict
) -> Iterator[tuple[dict, Any]]:
  """Global batches on the mesh, each with the iterator's position after it
  (what a checkpoint saves); read ahead on a thread with ``train.prefetch``
  (a ``data.Prefetcher``, which the caller closes)."""

  def place(rows):
    return data.to_global_batch(rows, sharding.batch_sharding(mesh), tcfg.global_batch)

  return (
      data.Prefetcher(train_iter, place, tcfg.prefetch)
      if tcfg.prefetch
      else ((place(rows), train_iter.get_state()) for rows in train_iter)
  )


class _StepLog:
  """The host side of the steps' metrics, from one log line to the next.

  The metrics stay on the devices until they are read (``drain``: at log
  steps and before every checkpoint, so that the dispatch of steps does not
  wait); reading them verifies the checkpoint each finite step was computed
  from and applies the non-finite policy (``guard``).
  ``summary`` gives a log line's values; tokens/s counts the steps and
  time since ``restart_clock``.

  Args:
    verification: the run's ``retention.Verification``.
    guard: the run's ``NonFiniteGuard``.
    unit: the corpus's unit (the metric: bpc or ppl).
    schedule: the learning-rate schedule (logged).
    tokens_per_step: new tokens a step.
    count_skipped: log ``skipped_steps`` (``train.nonfinite="skip"``).
  """

  def __init__(
      self,
      verification: retention.Verification,
      guard: guards.NonFiniteGuard,
      unit: str,
      schedule: Callable[[int], Any],
      tokens_per_step: int,
      count_skipped: bool,
  ):
    self.verification = verification
    self.guard = guard
    self.unit, self.metric = unit, metrics.metric_name(unit)
    self.schedule = schedule
    self.tokens_per_step = tokens_per_step
    self.count_skipped = count_skipped
    self.pending: list[tuple[int, Any]] = []  # (step, device metrics) not read yet
    self.interval: list[dict] = []  # host metrics of the steps since the last log
    self.restart_clock()

  def restart_clock(self) -> None:
    """tokens/s counts from now (after a compilation, a log, a validation or a checkpoint)."""
    self.t_last, self.steps_since = time.perf_counter(), 0

  def add(self, step: int, step_metrics: Mapping[str, jax.Array]) -> None:
    """Step ``step``'s metrics, still on the devices."""
    self.steps_since += 1
    self.pending.append((step, step_metrics))

  def drain(self) -> None:
    """Reads the metrics of the steps run since the last read; applies the guard.

    Raises:
      metrics.NonFiniteError: from the guard.
    """
    if self.pending:
      host = jax.device_get([m for _, m in self.pending])
      rows = [
          {"step": s, **{k: (bool(v) if k == "finite" else float(v)) for k, v in m.items()}}
          for (s, _), m in zip(self.pending, host)
      ]
      self.pending = []
      self.interval.extend(rows)
      for row in rows:  # a finite step verifies the parameters it was computed from
        if np.isfinite(row["loss"]) and np.isfinite(row["grad_norm"]):
          self.verification.params_good(row["step"] - 1)
      self.verification.write()
      self.guard.check(rows)

  def summary(self, step: int) -> dict:
    """The log line of ``step`` (after a ``drain``): the mean loss of the
    finite steps since the last one, the metric, the last gradient norm, the
    learning rate, the auxiliary losses, the skipped steps and tokens/s."""
    self.drain()
    elapsed = time.perf_counter() - self.t_last
    good = [m for m in self.interval if m["finite"]]
    loss = float(np.mean([m["loss"] for m in good])) if good else float("nan")
    last = {
        "loss": loss,
        self.metric: metrics.metric_value(loss, self.unit),
        "grad_norm": good[-1]["grad_norm"] if good else float("nan"),
        "learning_rate": float(self.schedule(step - 1)),
    }
    last.update(aux_loss_means(good))
    if self.count_skipped:
      last["skipped_steps"] = len(self.interval) - len(good)
    if self.steps_since:
      last["tokens_per_sec"] = self.steps_since * self.tokens_per_step / elapsed
    self.interval.clear()
    return last


def _run_steps(
    config: ml_collections.ConfigDict,
    rundir: run_dir.RunDir,
    mesh: Mesh,
    state: TrainState,
    start_step: int,
    train_iter: Any,
    train_step: Callable,
    evaluator: evaluate.Evaluator | None,
    *,
    unit: str,
    tokens_per_step: int,
    stop_requested: Callable[[], bool | str],
    stage: tuple[int, str] | None = None,
) -> dict:
  """The steps from ``start_step`` to ``train.num_steps`` on the batches of
  ``train_iter``: each logged, validated and checkpointed at its
  intervals, stopped cleanly on a preemption; a divergence sets aside the
  checkpoints saved after the newest good one (``guards.set_aside_diverged``).

  Returns:
    The last logged training metrics (with ``preempted_at_step`` when
    ``stop_requested``).

  Raises:
    metrics.NonFiniteError: the run diverged (``train.nonfinite``).
    checkpointing.CheckpointError: a checkpoint cannot be written.
  """
  tcfg = config.train
  writer = metrics.MetricWriter(rundir.workdir, start_step)
  stage_row = {} if stage is None else {"curriculum/stage": stage[0]}
  last: dict = {}
  bar = metrics.progress_bar(tcfg.num_steps, start_step, desc=stage[1] if stage else "train")
  prefix = f"[{stage[1]}] " if stage else ""
  say = (lambda msg: bar.write(prefix + msg)) if jax.process_index() == 0 else (lambda msg: None)
  stopper = early_stop.EarlyStop.from_config(tcfg)
  stopper.replay(metrics.read_rows(rundir.workdir) if stopper.enabled else [], start_step)
  guard = guards.NonFiniteGuard(
      tcfg.nonfinite, tcfg.max_skipped_steps, tcfg, rundir.verification.describe, say
  )
  step_log = _StepLog(
      rundir.verification,
      guard,
      unit,
      train_state.learning_rate_schedule(tcfg),
      tokens_per_step,
      count_skipped=tcfg.nonfinite == "skip",
  )
  metric = step_log.metric
  batches = _placed_batches(train_iter, mesh, tcfg)
  step = start_step
  finished = False
  preemption = guards.PreemptionGuard(stop_requested)
  try:
    while step < tcfg.num_steps:
      batch, iter_state = next(batches)
      state, step_metrics = train_step(state, batch)
      step += 1
      step_log.add(step, step_metrics)
      bar.update(1)
      if step == start_step + 1:  # keep compilation out of tokens/s
        jax.block_until_ready(step_metrics)
        step_log.restart_clock()
      if step % tcfg.log_every == 0 or step == tcfg.num_steps:
        last = step_log.summary(step)
        writer.write_scalars(step, {**stage_row, **{f"train/{k}": v for k, v in last.items()}})
        bar.set_postfix(loss=f"{last['loss']:.3f}", **{metric: f"{last[metric]:.3f}"})
        say(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in last.items()))
        step_log.restart_clock()
      stop_reason = None
      if evaluator is not None and (step % tcfg.eval_every == 0 or step == tcfg.num_steps):
        res = evaluator.evaluate(state.params, "valid", max_steps=tcfg.eval_max_steps)
        if res["loss_nats"] is not None and np.isfinite(res["loss_nats"]):
          rundir.verification.params_good(step)
        writer.write_scalars(step, {**stage_row, **{f"valid/{k}": v for k, v in res.items()}})
        stop_reason = stopper.update(res.get(stopper.metric)) if stopper.enabled else None
        say(f"step {step}: valid " + metrics.scalars_line(res))
        if not res["tokens"]:
          report.log(metrics.empty_validation_warning(step, metric, tcfg.eval_max_steps))
        step_log.restart_clock()
      preempted = preemption.should_stop(step)
      if stop_reason:  # the marker first: a checkpoint without it would train on when resumed
        early_stop.write_marker(rundir.workdir, step, stop_reason)
      if (
          step % config.checkpoint.every_steps == 0
          or step == tcfg.num_steps
          or preempted
          or stop_reason
      ):
        step_log.drain()  # never save before every step since the last check is known to be finite
        rundir.save(step, state, iter_state)
        step_log.restart_clock()
      if preempted:
        what = stop_requested()
        say(
            f"{what if isinstance(what, str) and what else 'Stop requested'}: saved a checkpoint at step "
            f"{step}; stopping (the same command resumes here)."
        )
        last["preempted_at_step"] = step
        break
      if stop_reason:
        say(f"Stopping early at step {step}: {stop_reason}.")
        last["stopped_early_at_step"] = step
        break
    finished = True
  except metrics.NonFiniteError as err:
    set_aside = guards.set_aside_diverged(rundir, err)
    if set_aside is not None:
      raise set_aside from None
    raise
  finally:
    bar.close()
    if isinstance(batches, data.Prefetcher):
      batches.close()
    if finished:
      writer.close()
    else:  # the error that stops the run is the one to report, not a second one here
      with contextlib.suppress(Exception):
        writer.close()
  return last
