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

import signal
import time
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from transformer_xl import (checkpointing, data, default_config, distributed, evaluate, metrics,
                            models, sharding, train_state)
from transformer_xl import workdir as wd
from transformer_xl.train_state import TrainState

Array = jax.Array


def _to_chunks(x: Array, n_chunk: int, axis: int) -> Array:
  """Splits rows along ``axis`` into n_chunk interleaved micro-batches.

  Row r goes to micro-batch r % n_chunk, so with rows sharded in contiguous
  blocks over ``data`` each device keeps its own rows (no communication).
  Returns the micro-batch axis first.
  """
  shape = x.shape
  x = x.reshape(shape[:axis] + (shape[axis] // n_chunk, n_chunk) + shape[axis + 1:])
  return jnp.moveaxis(x, axis + 1, 0)


def _from_chunks(x: Array, axis: int) -> Array:
  """Inverse of :func:`_to_chunks`."""
  n_chunk = x.shape[0]
  x = jnp.moveaxis(x, 0, axis + 1)
  shape = x.shape
  return x.reshape(shape[:axis] + (shape[axis] * n_chunk,) + shape[axis + 2:])


def make_train_step(model: models.TransformerXL, tx, mesh: Mesh, state_shardings,
                    batch_chunk: int, dropout_seed: int, loss_span: str = "full") -> Callable:
  """The jitted train step: (TrainState, batch) -> (TrainState, metrics).

  batch: the global batch (the batch contract of ``transformer_xl.data``): ``inputs``
  / ``targets`` int32 [B, T], ``weights`` float32 [B, T], ``reset`` bool [B]
  (rows whose memory is emptied first).  Loss = sum(weights * nll) /
  sum(weights), in nats per scored token; with ``loss_span="half"`` the
  weights of the first T // 2 positions of every segment are 0 (the "half
  loss" of Sec. 4.2: no loss on the positions with the shortest context).  Dropout keys are derived from
  (dropout_seed, step), so a resumed run draws the same masks.  metrics:
  ``loss`` (nats), ``grad_norm`` (before clipping); float32 scalars.
  """
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in ("inputs", "targets", "weights")}
  batch_shardings["reset"] = sharding.rows_sharding(mesh)

  def loss_fn(params, inputs, targets, weights, reset, memory, rng):
    nll_BxT, new_memory = model.apply({"params": params}, inputs, memory, targets,
                                      deterministic=False, reset_B=reset, rngs={"dropout": rng})
    return jnp.sum(nll_BxT * weights), new_memory

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: Mapping[str, Array]):
    rng = jax.random.fold_in(jax.random.PRNGKey(dropout_seed), state.step)
    weights_BxT = batch["weights"]
    if loss_span == "half":
      t = weights_BxT.shape[1]
      weights_BxT = weights_BxT * (jnp.arange(t) >= t // 2).astype(weights_BxT.dtype)
    inputs = (batch["inputs"], batch["targets"], weights_BxT, batch["reset"])
    if batch_chunk == 1:
      (loss_sum, new_memory), grads = grad_fn(state.params, *inputs, state.memory, rng)
    else:
      xs = (*(_to_chunks(x, batch_chunk, 0) for x in inputs),
            models.Memory(mems_LxBxMxD=_to_chunks(state.memory.mems_LxBxMxD, batch_chunk, 1),
                          mlen_B=_to_chunks(state.memory.mlen_B, batch_chunk, 0)),
            jax.random.split(rng, batch_chunk))

      def micro_step(carry, x):
        grads_acc, loss_acc = carry
        (loss_c, mem_c), grads_c = grad_fn(state.params, *x)
        grads_acc = jax.tree_util.tree_map(jnp.add, grads_acc, grads_c)
        return (grads_acc, loss_acc + loss_c), mem_c

      zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      (grads, loss_sum), mem_chunks = jax.lax.scan(micro_step, (zeros, jnp.zeros(())), xs)
      new_memory = models.Memory(mems_LxBxMxD=_from_chunks(mem_chunks.mems_LxBxMxD, 1),
                                 mlen_B=_from_chunks(mem_chunks.mlen_B, 0))
    n_tokens = jnp.maximum(jnp.sum(weights_BxT), 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / n_tokens, grads)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           memory=new_memory)
    return new_state, {"loss": loss_sum / n_tokens, "grad_norm": grad_norm}

  return jax.jit(train_step, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, sharding.replicated(mesh)),
                 donate_argnums=(0,))


class PreemptionGuard:
  """Turns SIGTERM (what a preempted Cloud TPU VM receives) into a clean stop.

  While active, SIGTERM only sets a flag; :meth:`should_stop` tells the
  training loop, at a step boundary, to write a checkpoint and return.  With
  several processes the flag is agreed on by an all-gather every
  ``sync_every`` steps (not every step: the all-gather waits for the
  devices and would stall the pipelined dispatch of steps), so that every
  process stops after the same step although a SIGTERM reaches the workers
  of a slice at slightly different times.
  """

  def __init__(self, sync_every: int = 10):
    self._flag = False
    self._previous = None
    self._sync_every = sync_every

  def __enter__(self):
    self._previous = signal.signal(signal.SIGTERM, self._handler)
    return self

  def __exit__(self, *exc):
    signal.signal(signal.SIGTERM, self._previous)

  def _handler(self, signum, frame):
    self._flag = True

  def should_stop(self, step: int) -> bool:
    """True on every process once any process has received SIGTERM
    (checked at every step with one process, every ``sync_every`` with several)."""
    if jax.process_count() > 1 and step % self._sync_every:
      return False
    return distributed.any_process(self._flag)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, corpus: data.Corpus,
                       mesh: Mesh) -> dict:
  """Trains until ``config.train.num_steps``, resuming from ``workdir`` if possible.

  Saves the run's config.json and model_config.json (workdir.py); logs loss
  (nats), bpc or ppl, learning rate, gradient norm and tokens/s (tokens =
  global_batch * tgt_len per step) every ``log_every`` steps to TensorBoard,
  metrics.jsonl and a console progress bar (metrics.py); validates every
  ``eval_every`` steps with the eval settings; checkpoints every
  ``checkpoint.every_steps``, at the end and on SIGTERM.

  Returns:
    The last logged training metrics (dict of floats).

  Raises:
    default_config.ConfigError: the model does not fit the corpus's vocabulary.
  """
  tcfg = config.train
  mcfg = default_config.model_config(config, corpus.vocab_size)
  wd.save_config(workdir, config)
  wd.save_model_config(workdir, mcfg, corpus.unit, corpus.name)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(tcfg)
  schedule = train_state.learning_rate_schedule(tcfg)
  abstract_state, state_shardings = train_state.abstract_train_state(
      model, tx, tcfg.global_batch, mesh)

  manager = checkpointing.make_manager(workdir, config.checkpoint.max_to_keep)
  # Ordered contiguous rows, or (One Billion Word) shuffled-sentence rows.
  train_iter = data.make_train_iterator(
      corpus, "train", tcfg.global_batch, mcfg.tgt_len, seed=tcfg.seed,
      row_ids=data.process_row_ids(sharding.batch_sharding(mesh), tcfg.global_batch,
                                   mcfg.tgt_len))
  restored = checkpointing.restore_latest(manager, abstract_state)
  if restored is None:
    state = train_state.create_train_state(model, tx, tcfg.global_batch, mesh,
                                           jax.random.PRNGKey(tcfg.seed), state_shardings)
    start_step = 0
  else:
    start_step, state, iter_state = restored
    if iter_state:  # {} = a checkpoint made elsewhere (e.g. converted): data from the start
      train_iter.set_state(iter_state)
    metrics.log(f"Resumed from {manager.directory} at step {start_step}.")

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  paper = ""
  if config.paper.n_params:
    paper = (f"; paper: {config.paper.n_params / 1e6:.0f}M "
             f"({100 * (n_params / config.paper.n_params - 1):+.1f}%), {config.paper.result}")
  metrics.log(f"Model: {n_params:,} parameters ({n_params / 1e6:.1f}M{paper}).")
  train_step = make_train_step(model, tx, mesh, state_shardings, tcfg.batch_chunk, tcfg.seed,
                               tcfg.loss_span)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh) if tcfg.eval_every else None
  writer = metrics.MetricWriter(workdir)
  metric = metrics.metric_name(corpus.unit)
  tokens_per_step = tcfg.global_batch * mcfg.tgt_len

  last = {}
  pending, t_last, steps_since = [], time.perf_counter(), 0
  bar = metrics.progress_bar(tcfg.num_steps, start_step)
  say = bar.write if jax.process_index() == 0 else (lambda msg: None)
  step = start_step
  with PreemptionGuard() as preemption:
    while step < tcfg.num_steps:
      batch = data.to_global_batch(next(train_iter), sharding.batch_sharding(mesh),
                                             tcfg.global_batch)
      state, step_metrics = train_step(state, batch)
      step += 1
      steps_since += 1
      pending.append(step_metrics)
      bar.update(1)
      if step == start_step + 1:  # keep compilation out of tokens/s
        jax.block_until_ready(step_metrics)
        t_last, steps_since = time.perf_counter(), 0
      if step % tcfg.log_every == 0 or step == tcfg.num_steps:
        host = jax.device_get(pending)
        elapsed = time.perf_counter() - t_last
        loss = float(np.mean([m["loss"] for m in host]))
        last = {"loss": loss, metric: metrics.metric_value(loss, corpus.unit),
                "grad_norm": float(host[-1]["grad_norm"]),
                "learning_rate": float(schedule(step - 1))}
        if steps_since:
          last["tokens_per_sec"] = steps_since * tokens_per_step / elapsed
        writer.write_scalars(step, {f"train/{k}": v for k, v in last.items()})
        bar.set_postfix(loss=f"{loss:.3f}", **{metric: f"{last[metric]:.3f}"})
        say(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in last.items()))
        pending, t_last, steps_since = [], time.perf_counter(), 0
      if evaluator is not None and (step % tcfg.eval_every == 0 or step == tcfg.num_steps):
        res = evaluator.evaluate(state.params, "valid", max_steps=tcfg.eval_max_steps)
        writer.write_scalars(step, {f"valid/{k}": v for k, v in res.items()})
        say(f"step {step}: valid " + ", ".join(f"{k}={v:.4g}" for k, v in res.items()))
        t_last, steps_since = time.perf_counter(), 0
      preempted = preemption.should_stop(step)
      if step % config.checkpoint.every_steps == 0 or step == tcfg.num_steps or preempted:
        checkpointing.save(manager, step, state, train_iter.get_state())
        t_last, steps_since = time.perf_counter(), 0
      if preempted:
        say(f"SIGTERM: saved a checkpoint at step {step}; stopping (a restart resumes here).")
        last["preempted_at_step"] = step
        break
  bar.close()
  writer.close()
  manager.close()
  return last
