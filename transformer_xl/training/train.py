"""The jitted, sharded train step and the training loop.

Reference semantics (Dai et al. 2019; reference ``train.py``): the memory
carried from step to step for each batch row and emptied at the start of
every epoch, gradient accumulation over ``batch_chunk`` micro-batches, each
with its own rows' memory.  The optimizer and the state are in
train_state.py.

One ``jax.jit`` with NamedShardings on a ("data", "model") mesh: parameters
placed by logical axis rules (sharding.py), batch and memory rows over
``data``; the TrainState (which holds the memory, so it never leaves the
devices) is donated.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from transformer_xl import data, default_config, sharding
from transformer_xl.data import synthetic, text_vocab
from transformer_xl.inference import evaluate
from transformer_xl.model import models
from transformer_xl.run import distributed, metrics, run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import train_state
from transformer_xl.training.train_state import TrainState
from transformer_xl.util import report

Array = jax.Array


def _to_chunks(x: Array, n_chunk: int, axis: int) -> Array:
  """Splits rows along ``axis`` into n_chunk interleaved micro-batches.

  Row r goes to micro-batch r % n_chunk, so with rows sharded in contiguous
  blocks over ``data`` each device keeps its own rows (no communication).
  Returns the micro-batch axis first.
  """
  shape = x.shape
  x = x.reshape(shape[:axis] + (shape[axis] // n_chunk, n_chunk) + shape[axis + 1 :])
  return jnp.moveaxis(x, axis + 1, 0)


def _from_chunks(x: Array, axis: int) -> Array:
  """Inverse of ``_to_chunks``."""
  n_chunk = x.shape[0]
  x = jnp.moveaxis(x, 0, axis + 1)
  shape = x.shape
  return x.reshape(shape[:axis] + (shape[axis] * n_chunk,) + shape[axis + 2 :])


def _all_finite(tree) -> Array:
  """bool scalar: every element of every array of ``tree`` is finite."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def aux_losses(variables: Mapping[str, Any]) -> dict[str, Array]:
  """The auxiliary losses sown into the ``losses`` collection, by name.

  A module adds one with ``self.sow("losses", name, scalar)``; each sown
  value is summed (a value sown in the scanned layers is stacked over
  them, [n_layer]), and values of one name from several modules are
  added.

  Args:
    variables: the mutated collections that ``model.apply(...,
      mutable=["losses"])`` returned.

  Returns:
    {name: float32 scalar}, sorted by name; empty when nothing was sown.
  """
  sums: dict[str, Array] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables.get("losses", {}))[0]:
    name = next(str(k.key) for k in reversed(path) if isinstance(k, jax.tree_util.DictKey))
    value = jnp.sum(jnp.asarray(leaf, jnp.float32))
    sums[name] = sums[name] + value if name in sums else value
  return dict(sorted(sums.items()))


def aux_loss_means(rows: list[Mapping[str, Any]]) -> dict[str, float]:
  """Means over the host metrics of steps (``rows``) of the auxiliary-loss
  metrics (``aux_loss/<name>``, ``total_loss``), for the log; {} without any."""
  keys = sorted({k for row in rows for k in row if k.startswith("aux_loss/") or k == "total_loss"})
  return {k: float(np.mean([row[k] for row in rows if k in row])) for k in keys}


def make_train_step(
    model: models.TransformerXL,
    tx,
    mesh: Mesh,
    state_shardings,
    batch_chunk: int,
    dropout_seed: int,
    loss_span: str = "full",
    aux_loss_weight: float = 1.0,
    mem_backprop_depth: int = 0,
    bptt_bp: bool = False,
    window_advance: int = 1,
) -> Callable:
  """The jitted train step: (TrainState, batch) -> (TrainState, metrics).

  batch: the global batch (the batch contract of ``transformer_xl.data``): ``inputs``
  / ``targets`` int32 [B, T], ``weights`` float32 [B, T], ``reset`` bool [B]
  (rows whose memory is emptied first) and, optionally, ``doc_pos`` int32
  [B, T] (offsets in the documents: no attention across documents,
  ``models.TransformerXL.hidden``); every array's rows over ``data``.
  Loss = sum(weights * nll) / sum(weights), in nats per scored token; with
  ``loss_span="half"`` the weights of the first T // 2 positions of every
  segment are 0 (the "half loss" of Sec. 4.2: no loss on the positions with
  the shortest context).  Dropout keys are derived from (dropout_seed,
  step), so a resumed run draws the same masks.  metrics:
  ``loss`` (nats), ``grad_norm`` (before clipping); float32 scalars; and
  ``finite`` (bool scalar): whether the loss, the gradient norm and the
  updated parameters are all finite.  Auxiliary losses (``aux_losses``:
  scalars a module sows into ``losses``) are added to the objective, each
  times ``aux_loss_weight`` (averaged over the micro-batches), and reported
  as ``aux_loss/<name>`` (unweighted) and ``total_loss`` (``loss`` plus the
  weighted auxiliary losses, the objective); ``loss`` stays the
  cross-entropy.  With nothing sown there are no such metrics and the step
  is unchanged.  A step that is not finite is not
  applied: parameters, optimizer state and memory stay as they were (only
  ``step`` advances); the host decides what to do (``NonFiniteGuard``).
  Everything is computed on the devices; the metrics are replicated, so
  every process reads the same values.

  Backpropagation through segments (``mem_backprop_depth`` = k > 0; the
  memory tokens of Bulatov et al. 2022): the batch is a window of k + 1
  consecutive segments per row (``data.SegmentWindows``: arrays [B, (k + 1)
  T], ``reset`` [B, k + 1]) and the state's memory is the one before the
  window's first segment.  The segments run one after the other in the
  step, each reading the memory the previous one left; the gradient flows
  back through the memory tokens they write (the XL memory stays
  stop-gradient), so the newest segment's loss reaches the parameters
  through the k segments before it.  Only the newest segment's loss counts
  (the authors' default), or every segment's with ``bptt_bp``; ``loss``
  is the mean over the counted tokens.  The next state's memory is the one
  after the window's first segment: the next window starts one segment
  later.  The authors' ``train.py`` replays the k earlier segments with the
  XL memories it stored when it first ran them; here they are computed
  again from the window's start with the current parameters (the same for
  k = 1).  ``window_advance``: segments from one window's start to the
  next's, 1 (sliding windows, ``data.SegmentWindows``) or k + 1 (windows
  side by side: the synthetic tasks' whole examples,
  ``synthetic.ExampleWindows``); the next state's memory is the one after
  the window's first ``window_advance`` segments.
  """
  # One sharding for every array of the batch, [B] or [B, T]: rows over
  # ``data`` (as ``sharding.batch_sharding`` for [B, T]); a prefix of the
  # batch dict whatever its keys, so the optional ``doc_pos`` needs no entry.
  batch_shardings = sharding.rows_sharding(mesh)

  def segment_nll(params, inputs, targets, reset, doc_pos, memory, rng):
    """One segment: (nll_BxT, next memory, auxiliary losses)."""
    (nll_BxT, new_memory), sown = model.apply(
        {"params": params},
        inputs,
        memory,
        targets,
        deterministic=False,
        reset_B=reset,
        doc_pos_BxT=doc_pos,
        rngs={"dropout": rng},
        mutable=["losses"],
    )
    return nll_BxT, new_memory, aux_losses(sown)

  def window_nll(params, inputs, targets, reset, doc_pos, memory, rng):
    """The k + 1 segments of a window in order, the memory (tokens with their
    gradient) carried from one to the next: (nll [B, (k + 1) T], the memory
    after the first ``window_advance`` segments (the next window's start),
    the auxiliary losses averaged over segments)."""
    n_seg = mem_backprop_depth + 1
    t = inputs.shape[1] // n_seg
    cut = lambda x, j: None if x is None else x[:, j * t : (j + 1) * t]
    nlls, auxes, next_memory = [], [], None
    for j in range(n_seg):
      nll_BxT, memory, aux = segment_nll(
          params,
          cut(inputs, j),
          cut(targets, j),
          reset[:, j],
          cut(doc_pos, j),
          memory,
          jax.random.fold_in(rng, j),
      )
      nlls.append(nll_BxT)
      auxes.append(aux)
      next_memory = memory if j == window_advance - 1 else next_memory
    aux = {k: sum(a[k] for a in auxes) / n_seg for k in auxes[0]}
    return jnp.concatenate(nlls, axis=1), jax.lax.stop_gradient(next_memory), aux

  run = window_nll if mem_backprop_depth else segment_nll

  def loss_fn(params, inputs, targets, weights, reset, doc_pos, memory, rng, n_tokens):
    """(objective, (next memory, sum of weights * nll, auxiliary losses)); the
    objective is the weighted nll sum plus, scaled to it (the gradient is
    divided by n_tokens), the weighted auxiliary losses of this micro-batch."""
    nll_BxT, new_memory, aux = run(params, inputs, targets, reset, doc_pos, memory, rng)
    loss_sum = jnp.sum(nll_BxT * weights)
    objective = loss_sum
    if aux:
      objective = loss_sum + n_tokens * (aux_loss_weight * sum(aux.values())) / batch_chunk
    return objective, (new_memory, loss_sum, aux)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: Mapping[str, Array]):
    rng = jax.random.fold_in(jax.random.PRNGKey(dropout_seed), state.step)
    weights_BxT = batch["weights"]
    n_seg = mem_backprop_depth + 1
    t = weights_BxT.shape[1] // n_seg  # the segment length
    if loss_span == "half":
      weights_BxT = weights_BxT * (jnp.arange(n_seg * t) % t >= t // 2).astype(weights_BxT.dtype)
    if n_seg > 1 and not bptt_bp:  # the newest segment's loss only
      weights_BxT = weights_BxT * (jnp.arange(n_seg * t) >= (n_seg - 1) * t).astype(
          weights_BxT.dtype
      )
    inputs = (
        batch["inputs"],
        batch["targets"],
        weights_BxT,
        batch["reset"],
        batch.get("doc_pos"),
    )  # None (no leaf) without documents
    n_tokens = jnp.maximum(jnp.sum(weights_BxT), 1.0)
    if batch_chunk == 1:
      (_, (new_memory, loss_sum, aux)), grads = grad_fn(
          state.params, *inputs, state.memory, rng, n_tokens
      )
    else:
      xs = (
          *jax.tree_util.tree_map(lambda x: _to_chunks(x, batch_chunk, 0), inputs),
          state.memory.map_rows(lambda x, axis: _to_chunks(x, batch_chunk, axis)),
          jax.random.split(rng, batch_chunk),
      )

      def micro_step(carry, x):
        grads_acc, loss_acc = carry
        (_, (mem_c, loss_c, aux_c)), grads_c = grad_fn(state.params, *x, n_tokens)
        grads_acc = jax.tree_util.tree_map(jnp.add, grads_acc, grads_c)
        return (grads_acc, loss_acc + loss_c), (mem_c, aux_c)

      zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      (grads, loss_sum), (mem_chunks, aux) = jax.lax.scan(micro_step, (zeros, jnp.zeros(())), xs)
      aux = {name: jnp.mean(v) for name, v in aux.items()}  # over the micro-batches
      # The micro-batch axis leads each field; ``axis`` is the field's rows axis.
      new_memory = mem_chunks.map_rows(_from_chunks)
    grads = jax.tree_util.tree_map(lambda g: g / n_tokens, grads)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    loss = loss_sum / n_tokens
    step_metrics = {"loss": loss, "grad_norm": grad_norm}
    if aux:
      step_metrics.update({f"aux_loss/{name}": v for name, v in aux.items()})
      step_metrics["total_loss"] = loss + aux_loss_weight * sum(aux.values())
    finite = (
        jnp.isfinite(step_metrics.get("total_loss", loss))
        & jnp.isfinite(grad_norm)
        & _all_finite(params)
    )
    # The non-finite guard: such a step keeps the old state (a select on the
    # devices, no host sync).
    keep = lambda new, old: jnp.where(finite, new, old)
    new_state = TrainState(
        step=state.step + 1,
        params=jax.tree_util.tree_map(keep, params, state.params),
        opt_state=jax.tree_util.tree_map(keep, opt_state, state.opt_state),
        memory=jax.tree_util.tree_map(keep, new_memory, state.memory),
    )
    return new_state, {**step_metrics, "finite": finite}

  return jax.jit(
      sharding.traced_with_mesh(train_step, mesh),
      in_shardings=(state_shardings, batch_shardings),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=(0,),
  )


class PreemptionGuard:
  """Agrees across processes on a request to stop (SIGTERM on a preempted
  Cloud TPU VM), so that every process writes its checkpoint after the same
  step.

  ``stop_requested`` is this process's flag (the command line passes
  ``process_settings.StopSignals.received``: SIGTERM or Ctrl-C).  With several processes the
  flag is agreed on by an all-gather every ``sync_every`` steps (not every
  step: the all-gather waits for the devices and would stall the pipelined
  dispatch of steps), as a SIGTERM reaches the workers of a slice at
  slightly different times.
  """

  def __init__(self, stop_requested: Callable[[], bool], sync_every: int = 10):
    self._stop_requested = stop_requested
    self._sync_every = sync_every

  def should_stop(self, step: int) -> bool:
    """True on every process once any process's flag is set (checked at
    every step with one process, every ``sync_every`` with several)."""
    if jax.process_count() > 1 and step % self._sync_every:
      return False
    return distributed.any_process(bool(self._stop_requested()))


class NonFiniteGuard:
  """The host side of the non-finite policy (``train.nonfinite``).

  The train step never applies a step whose loss, gradient norm or updated
  parameters are not finite (``make_train_step``); the host learns of it
  when it reads the metrics anyway: at log steps, and before every
  checkpoint (so that a checkpoint is only written once every step since
  the last check is known).  Every process reads the same replicated flags
  and so takes the same decision.

  Policies: "stop" raises at the first non-finite step; "skip" reports it,
  counts it (``skipped``), and raises once ``max_skipped`` steps in a row
  were skipped.

  Args:
    policy: "stop" or "skip".
    max_skipped: the run stops when this many steps in a row were skipped.
    train_cfg: ``config.train`` (quoted in the advice of the message).
    last_checkpoint: returns a description of the newest good checkpoint
      (``retention.Verification.describe``).
    say: where "skip" reports each skipped step.
  """

  def __init__(
      self,
      policy: str,
      max_skipped: int,
      train_cfg: ml_collections.ConfigDict,
      last_checkpoint: Callable[[], str],
      say: Callable[[str], None],
  ):
    self.policy, self.max_skipped = policy, max_skipped
    self.skipped = 0
    self._in_a_row = []
    self._cfg = train_cfg
    self._last_checkpoint = last_checkpoint
    self._say = say

  @staticmethod
  def _what(row: Mapping[str, float]) -> str:
    bad = [
        f"the {name} is {row[key]}"
        for key, name in (("loss", "loss"), ("grad_norm", "gradient norm"))
        if not np.isfinite(row[key])
    ]
    return " and ".join(bad) or "the update made parameters non-finite"

  def _advice(self) -> str:
    t = self._cfg
    return (
        f"The last good checkpoint is {self._last_checkpoint()}; nothing non-finite was "
        f"saved. Try a lower --config.train.learning_rate (now {t.learning_rate}), a "
        f"smaller --config.train.clip (now {t.clip}) or a longer "
        f"--config.train.warmup_steps (now {t.warmup_steps}): the same command with such "
        "a change resumes from that checkpoint."
    )

  def check(self, rows: list[Mapping[str, Any]]) -> int:
    """Applies the policy to the metrics of consecutive steps, in order.

    Args:
      rows: host metrics of steps, each with ``step``, ``loss``,
        ``grad_norm`` and ``finite``.

    Returns:
      How many of ``rows`` were skipped.

    Raises:
      metrics.NonFiniteError: "stop" and a non-finite step, or "skip" and
        ``max_skipped`` skipped steps in a row.
    """
    skipped = 0
    for row in rows:
      if row["finite"]:
        self._in_a_row = []
        continue
      if self.policy == "stop":
        raise metrics.NonFiniteError(
            f"step {row['step']}: {self._what(row)} (train.nonfinite=stop): the run stopped "
            f"before applying that step. {self._advice()} "
            "(--config.train.nonfinite=skip skips such steps instead.)"
        )
      skipped += 1
      self.skipped += 1
      self._in_a_row.append(row["step"])
      self._say(
          f"step {row['step']}: {self._what(row)}; the update was skipped "
          f"({len(self._in_a_row)} in a row, at most {self.max_skipped})."
      )
      if len(self._in_a_row) >= self.max_skipped:
        raise metrics.NonFiniteError(
            f"steps {self._in_a_row[0]} to {self._in_a_row[-1]}: {len(self._in_a_row)} steps in "
            f"a row had a non-finite loss or gradient (train.max_skipped_steps="
            f"{self.max_skipped}); the run stopped. {self._advice()}"
        )
    return skipped


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str,
    corpus: data.Corpus,
    mesh: Mesh,
    stop_requested: Callable[[], bool | str] = lambda: False,
) -> dict:
  """Trains until ``config.train.num_steps``, resuming from ``workdir`` if possible.

  Resumes from the newest usable checkpoint (damaged ones are reported,
  skipped and moved to ``checkpoints_rejected/``; checkpointing.py and retention.py), after
  checking that it was made with the same model, data and batch (before
  anything is compiled; a difference stops the run and leaves the workdir
  unchanged).  Then saves the run's config.json and model_config.json
  (workdir.py); logs loss (nats), bpc or ppl, learning rate, gradient norm
  and tokens/s (tokens = global_batch * tgt_len per step) every
  ``log_every`` steps to TensorBoard, metrics.jsonl and a console progress
  bar (metrics.py); validates every ``eval_every`` steps with the eval
  settings; checkpoints every ``checkpoint.every_steps``, at the end and
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

  Returns:
    The last logged training metrics (dict of floats).

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
  meta = wd.checkpoint_meta(mcfg, corpus.unit, corpus.name, tcfg.global_batch)
  with run_dir.RunDir(workdir, meta, config.checkpoint.max_to_keep) as rundir:
    return _train_and_evaluate(config, mcfg, rundir, corpus, mesh, stop_requested)


def _train_and_evaluate(
    config: ml_collections.ConfigDict,
    mcfg: models.ModelConfig,
    rundir: run_dir.RunDir,
    corpus: data.Corpus,
    mesh: Mesh,
    stop_requested: Callable[[], bool | str],
) -> dict:
  """``train_and_evaluate``'s work in its run directory (lock held)."""
  workdir = rundir.workdir
  tcfg = config.train
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(tcfg, mcfg)
  schedule = train_state.learning_rate_schedule(tcfg)
  abstract_state, state_shardings = train_state.abstract_train_state(
      model, tx, tcfg.global_batch, mesh
  )
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
  if depth and isinstance(train_iter, synthetic.ExampleIterator):  # a step per whole example
    if depth + 1 != train_iter.segments or not tcfg.get("bptt_bp", False):
      raise default_config.ConfigError(
          f"train.mem_backprop_depth={depth}: a synthetic task trains on whole examples "
          f"(the authors' train_synthetic.py): set train.mem_backprop_depth="
          f"{train_iter.segments - 1} (its {train_iter.segments} segments of "
          f"{mcfg.tgt_len}) and train.bptt_bp=True (the whole answer's loss), or 0."
      )
    train_iter, window_advance = synthetic.ExampleWindows(train_iter), depth + 1
  elif depth:  # windows of k + 1 segments, sliding by one
    try:
      train_iter = data.SegmentWindows(train_iter, depth)
    except ValueError as err:
      raise default_config.ConfigError(str(err)) from None
  restored = rundir.restore(abstract_state)
  if restored is None:
    state = train_state.create_train_state(
        model, tx, tcfg.global_batch, mesh, jax.random.PRNGKey(tcfg.seed), state_shardings
    )
    start_step = 0
  else:
    start_step, state = restored.step, restored.state
    if restored.iterator_state:  # {} = a checkpoint made elsewhere (e.g. converted)
      try:
        train_iter.set_state(restored.iterator_state)
      except ValueError as err:
        raise default_config.ConfigError(
            f"The data position saved in {restored.path} does not fit this run's data: {err} "
            "Resume with the workdir's data settings, or use a new --workdir."
        ) from None
  rundir.start(restored, config, mcfg)
  verification = rundir.verification
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

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  paper = ""
  if config.paper.n_params:
    paper = (
        f"; paper: {config.paper.n_params / 1e6:.0f}M "
        f"({100 * (n_params / config.paper.n_params - 1):+.1f}%), {config.paper.result}"
    )
  elif config.paper.result:
    paper = f"; paper: no parameter count reported, {config.paper.result}"
  report.log(f"Model: {n_params:,} parameters ({n_params / 1e6:.1f}M{paper}).")
  train_step = make_train_step(
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
      window_advance,
  )
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh) if tcfg.eval_every else None
  writer = metrics.MetricWriter(workdir, start_step)
  metric = metrics.metric_name(corpus.unit)
  tokens_per_step = tcfg.global_batch * mcfg.tgt_len * window_advance  # new tokens a step

  last = {}
  pending, t_last, steps_since = [], time.perf_counter(), 0
  interval = []  # host metrics of the steps since the last log
  bar = metrics.progress_bar(tcfg.num_steps, start_step)
  say = bar.write if jax.process_index() == 0 else (lambda msg: None)

  guard = NonFiniteGuard(tcfg.nonfinite, tcfg.max_skipped_steps, tcfg, verification.describe, say)

  def drain():
    """Reads the metrics of the steps run since the last read; applies the guard."""
    nonlocal pending
    if pending:
      host = jax.device_get([m for _, m in pending])
      rows = [
          {"step": s, **{k: (bool(v) if k == "finite" else float(v)) for k, v in m.items()}}
          for (s, _), m in zip(pending, host)
      ]
      pending = []
      interval.extend(rows)
      for row in rows:  # a finite step verifies the parameters it was computed from
        if np.isfinite(row["loss"]) and np.isfinite(row["grad_norm"]):
          verification.params_good(row["step"] - 1)
      verification.write()
      guard.check(rows)

  def place(rows):
    return data.to_global_batch(rows, sharding.batch_sharding(mesh), tcfg.global_batch)

  # Each batch comes with the iterator's position after it: what a checkpoint saves.
  batches = (
      data.Prefetcher(train_iter, place, tcfg.prefetch)
      if tcfg.prefetch
      else ((place(rows), train_iter.get_state()) for rows in train_iter)
  )
  step = start_step
  finished = False
  preemption = PreemptionGuard(stop_requested)
  try:
    while step < tcfg.num_steps:
      batch, iter_state = next(batches)
      state, step_metrics = train_step(state, batch)
      step += 1
      steps_since += 1
      pending.append((step, step_metrics))
      bar.update(1)
      if step == start_step + 1:  # keep compilation out of tokens/s
        jax.block_until_ready(step_metrics)
        t_last, steps_since = time.perf_counter(), 0
      if step % tcfg.log_every == 0 or step == tcfg.num_steps:
        drain()
        elapsed = time.perf_counter() - t_last
        good = [m for m in interval if m["finite"]]
        loss = float(np.mean([m["loss"] for m in good])) if good else float("nan")
        last = {
            "loss": loss,
            metric: metrics.metric_value(loss, corpus.unit),
            "grad_norm": good[-1]["grad_norm"] if good else float("nan"),
            "learning_rate": float(schedule(step - 1)),
        }
        last.update(aux_loss_means(good))
        if tcfg.nonfinite == "skip":
          last["skipped_steps"] = len(interval) - len(good)
        if steps_since:
          last["tokens_per_sec"] = steps_since * tokens_per_step / elapsed
        writer.write_scalars(step, {f"train/{k}": v for k, v in last.items()})
        bar.set_postfix(loss=f"{loss:.3f}", **{metric: f"{last[metric]:.3f}"})
        say(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in last.items()))
        interval.clear()
        t_last, steps_since = time.perf_counter(), 0
      if evaluator is not None and (step % tcfg.eval_every == 0 or step == tcfg.num_steps):
        res = evaluator.evaluate(state.params, "valid", max_steps=tcfg.eval_max_steps)
        if np.isfinite(res["loss_nats"]):
          verification.params_good(step)
        writer.write_scalars(step, {f"valid/{k}": v for k, v in res.items()})
        say(f"step {step}: valid " + ", ".join(f"{k}={v:.4g}" for k, v in res.items()))
        t_last, steps_since = time.perf_counter(), 0
      preempted = preemption.should_stop(step)
      if step % config.checkpoint.every_steps == 0 or step == tcfg.num_steps or preempted:
        drain()  # never save before every step since the last check is known to be finite
        rundir.save(step, state, iter_state)
        t_last, steps_since = time.perf_counter(), 0
      if preempted:
        what = stop_requested()
        say(
            f"{what if isinstance(what, str) and what else 'Stop requested'}: saved a checkpoint at step "
            f"{step}; stopping (the same command resumes here)."
        )
        last["preempted_at_step"] = step
        break
    finished = True
  except metrics.NonFiniteError as err:
    went = rundir.set_aside_unverified(
        "set aside when the run diverged: a step computed from it was not finite"
    )
    if went:
      where = (
          "deleted (this file system cannot move them)"
          if "deleted" in went
          else f"moved to {rundir.rejected_dir}"
      )
      raise metrics.NonFiniteError(
          f"{err} The {len(went)} checkpoint(s) saved after it were {where} (a step computed "
          "from them was not finite)."
      ) from None
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
