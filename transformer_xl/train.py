"""Optimizer, the jitted and sharded train step, and the training loop.

Reference semantics (Dai et al. 2019; reference ``train.py``): Adam with
linear warmup then cosine decay, global-norm clipping at ``clip``, the
memory carried from step to step for each batch row and emptied at the
start of every epoch, gradient accumulation over ``batch_chunk``
micro-batches, each with its own rows' memory.

One ``jax.jit`` with NamedShardings on a ("data", "model") mesh: parameters
placed by logical axis rules (sharding.py), batch and memory rows over
``data``; the TrainState (which holds the memory, so it never leaves the
devices) is donated.
"""
from __future__ import annotations

import json
import signal
import time
from typing import Any, Callable, Mapping

import flax.linen as nn
from etils import epath
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from jax.sharding import Mesh, NamedSharding

from transformer_xl import checkpointing, data, evaluate, models, sharding

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the iterator position.

  Attributes:
    step: int32 scalar, optimizer steps taken.
    params: model parameters (float32).
    opt_state: optax state.
    memory: the training :class:`models.Memory` of every batch row.
  """

  step: Array
  params: Any
  opt_state: Any
  memory: models.Memory


def model_config(config: ml_collections.ConfigDict, n_token: int) -> models.ModelConfig:
  """The training :class:`models.ModelConfig` from ``config.model``."""
  return models.ModelConfig(n_token=n_token, **config.model.to_dict())


def learning_rate_schedule(train_cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup from 0 to learning_rate, then cosine decay to min_lr.

  The cosine spans num_steps including the warmup (optax
  ``warmup_cosine_decay_schedule``; the reference's CosineAnnealingLR over
  max_step).
  """
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if train_cfg.warmup_steps > 0 else train_cfg.learning_rate,
      peak_value=train_cfg.learning_rate,
      warmup_steps=train_cfg.warmup_steps,
      decay_steps=max(train_cfg.num_steps, train_cfg.warmup_steps + 1),
      end_value=train_cfg.min_lr)


def make_optimizer(train_cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Global-norm clipping then Adam on the schedule above."""
  return optax.chain(
      optax.clip_by_global_norm(train_cfg.clip),
      optax.adam(learning_rate_schedule(train_cfg), b1=train_cfg.adam_b1,
                 b2=train_cfg.adam_b2, eps=train_cfg.adam_eps))


def abstract_train_state(model: models.TransformerXL, tx, global_batch: int, mesh: Mesh):
  """(abstract TrainState with shardings, TrainState of shardings)."""
  cfg = model.config

  def init(rng):
    tok = jnp.zeros((1, cfg.tgt_len), jnp.int32)
    variables = model.init(rng, tok, models.init_memory(cfg, 1), tok)
    return variables["params"]

  boxed_params = jax.eval_shape(init, jax.random.PRNGKey(0))
  param_shardings = sharding.logical_shardings(boxed_params, mesh)
  params_shape = nn.unbox(boxed_params)
  opt_shape = jax.eval_shape(tx.init, params_shape)
  # Optimizer moments follow their parameters; scalars are replicated.
  opt_shardings = optax.tree_map_params(
      tx, lambda _, s: s, opt_shape, param_shardings,
      transform_non_params=lambda _: sharding.replicated(mesh),
      is_leaf=lambda x: isinstance(x, NamedSharding))
  mem_shape = jax.eval_shape(lambda: models.init_memory(cfg, global_batch))
  shardings = TrainState(step=sharding.replicated(mesh), params=param_shardings,
                         opt_state=opt_shardings, memory=sharding.memory_sharding(mesh))
  shapes = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params_shape,
                      opt_state=opt_shape, memory=mem_shape)
  abstract = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)
  return abstract, shardings


def create_train_state(model: models.TransformerXL, tx, global_batch: int, mesh: Mesh,
                       rng: Array, state_shardings) -> TrainState:
  """Initialises parameters (reference init), optimizer and empty memory on the mesh."""
  cfg = model.config

  def init(rng):
    tok = jnp.zeros((1, cfg.tgt_len), jnp.int32)
    params = nn.unbox(model.init(rng, tok, models.init_memory(cfg, 1), tok)["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      memory=models.init_memory(cfg, global_batch))

  return jax.jit(init, out_shardings=state_shardings)(rng)


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
                    batch_chunk: int, dropout_seed: int) -> Callable:
  """The jitted train step: (TrainState, batch) -> (TrainState, metrics).

  batch: dict of global arrays, ``inputs``/``targets`` int32 [B, T],
  ``weights`` float32 [B, T], ``reset`` bool [B] (rows whose memory is
  emptied first).  Loss = sum(weights * nll) / sum(weights), in nats per
  token.  Dropout keys are derived from (dropout_seed, step), so a resumed
  run draws the same masks.  metrics: ``loss`` (nats), ``grad_norm``
  (before clipping), ``learning_rate``; float32 scalars.
  """
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in ("inputs", "targets", "weights")}
  batch_shardings["reset"] = sharding.rows_sharding(mesh)

  def loss_fn(params, inputs, targets, weights, memory, rng):
    nll_BxT, new_memory = model.apply({"params": params}, inputs, memory, targets,
                                      deterministic=False, rngs={"dropout": rng})
    return jnp.sum(nll_BxT * weights), new_memory

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: Mapping[str, Array]):
    rng = jax.random.fold_in(jax.random.PRNGKey(dropout_seed), state.step)
    memory = models.reset_memory(state.memory, batch["reset"])
    if batch_chunk == 1:
      (loss_sum, new_memory), grads = grad_fn(state.params, batch["inputs"], batch["targets"],
                                              batch["weights"], memory, rng)
    else:
      xs = (_to_chunks(batch["inputs"], batch_chunk, 0), _to_chunks(batch["targets"], batch_chunk, 0),
            _to_chunks(batch["weights"], batch_chunk, 0),
            models.Memory(mems_LxBxMxD=_to_chunks(memory.mems_LxBxMxD, batch_chunk, 1),
                          mlen_B=_to_chunks(memory.mlen_B, batch_chunk, 0)),
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
    n_tokens = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / n_tokens, grads)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           memory=new_memory)
    metrics = {"loss": loss_sum / n_tokens, "grad_norm": grad_norm}
    return new_state, metrics

  return jax.jit(train_step, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, sharding.replicated(mesh)),
                 donate_argnums=(0,))


def log(msg: str) -> None:
  """Prints on process 0 only (every process runs the same program)."""
  if jax.process_index() == 0:
    print(msg, flush=True)


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
    if jax.process_count() == 1:
      return self._flag
    if step % self._sync_every:
      return False
    from jax.experimental import multihost_utils
    flags = multihost_utils.process_allgather(np.asarray([self._flag], np.int32))
    return bool(np.any(flags))


def metric_name(unit: str) -> str:
  """"bpc" for byte/char-level corpora, "ppl" for word level."""
  return "ppl" if unit == "word" else "bpc"


def metric_value(loss_nats: float, unit: str) -> float:
  """bpc = loss / ln 2 (bits per character); ppl = exp(loss)."""
  return float(np.exp(loss_nats)) if unit == "word" else float(loss_nats / np.log(2.0))


class _Writer:
  """Metrics to TensorBoard event files (tensorboardX) and to
  ``<workdir>/metrics.jsonl`` (one JSON object per line: step and scalars),
  on process 0; a no-op elsewhere."""

  def __init__(self, workdir: str):
    self._writer = self._jsonl = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter
      self._writer = SummaryWriter(logdir=str(epath.Path(workdir) / "tensorboard"))
      self._jsonl = (epath.Path(workdir) / "metrics.jsonl").open("a")

  def scalars(self, step: int, scalars: Mapping[str, float]):
    """Writes {name: value} at ``step``."""
    if self._writer is not None:
      for k, v in scalars.items():
        self._writer.add_scalar(k, v, step)
      self._writer.flush()
      self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
      self._jsonl.flush()

  def close(self):
    if self._writer is not None:
      self._writer.close()
      self._jsonl.close()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, corpus: data.Corpus,
                       mesh: Mesh) -> dict:
  """Trains until ``config.train.num_steps``, resuming from ``workdir`` if possible.

  Logs loss (nats), bpc or ppl, learning rate, gradient norm and tokens/s
  (tokens = global_batch * tgt_len per step) every ``log_every`` steps to
  TensorBoard (``<workdir>/tensorboard``) and a console progress bar;
  validates every ``eval_every`` steps with the eval settings; checkpoints
  every ``checkpoint.every_steps`` and at the end.

  Returns:
    The last logged training metrics (dict of floats).
  """
  tcfg = config.train
  mcfg = model_config(config, corpus.vocab_size)
  model = models.TransformerXL(mcfg)
  tx = make_optimizer(tcfg)
  schedule = learning_rate_schedule(tcfg)
  abstract_state, state_shardings = abstract_train_state(model, tx, tcfg.global_batch, mesh)

  manager = checkpointing.make_manager(workdir, config.checkpoint.max_to_keep)
  # Ordered contiguous rows, or (One Billion Word) shuffled-sentence rows.
  train_iter = data.make_train_iterator(
      corpus, "train", tcfg.global_batch, mcfg.tgt_len, seed=tcfg.seed,
      row_ids=data.process_row_ids(sharding.batch_sharding(mesh), tcfg.global_batch,
                                   mcfg.tgt_len))
  restored = checkpointing.restore_latest(manager, abstract_state)
  if restored is None:
    state = create_train_state(model, tx, tcfg.global_batch, mesh,
                               jax.random.PRNGKey(tcfg.seed), state_shardings)
    start_step = 0
  else:
    start_step, state, iter_state = restored
    if iter_state:  # {} = a checkpoint made elsewhere (e.g. converted): data from the start
      train_iter.set_state(iter_state)
    log(f"Resumed from {manager.directory} at step {start_step}.")

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  paper = ""
  if config.paper.n_params:
    paper = (f"; paper: {config.paper.n_params / 1e6:.0f}M "
             f"({100 * (n_params / config.paper.n_params - 1):+.1f}%), {config.paper.result}")
  log(f"Model: {n_params:,} parameters ({n_params / 1e6:.1f}M{paper}).")
  train_step = make_train_step(model, tx, mesh, state_shardings, tcfg.batch_chunk, tcfg.seed)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh) if tcfg.eval_every else None
  writer = _Writer(workdir)
  metric = metric_name(corpus.unit)
  tokens_per_step = tcfg.global_batch * mcfg.tgt_len

  last = {}
  pending, t_last, steps_since = [], time.perf_counter(), 0
  bar = tqdm.tqdm(total=tcfg.num_steps, initial=start_step, disable=jax.process_index() != 0,
                  desc="train", unit="step", dynamic_ncols=True)
  say = bar.write if jax.process_index() == 0 else (lambda msg: None)
  step = start_step
  with PreemptionGuard() as preemption:
    while step < tcfg.num_steps:
      batch = data.to_global_batch(next(train_iter), sharding.batch_sharding(mesh),
                                   tcfg.global_batch)
      state, metrics = train_step(state, batch)
      step += 1
      steps_since += 1
      pending.append(metrics)
      bar.update(1)
      if step == start_step + 1:  # keep compilation out of tokens/s
        jax.block_until_ready(metrics)
        t_last, steps_since = time.perf_counter(), 0
      if step % tcfg.log_every == 0 or step == tcfg.num_steps:
        host = jax.device_get(pending)
        elapsed = time.perf_counter() - t_last
        loss = float(np.mean([m["loss"] for m in host]))
        last = {"loss": loss, metric: metric_value(loss, corpus.unit),
                "grad_norm": float(host[-1]["grad_norm"]),
                "learning_rate": float(schedule(step - 1))}
        if steps_since:
          last["tokens_per_sec"] = steps_since * tokens_per_step / elapsed
        writer.scalars(step, {f"train/{k}": v for k, v in last.items()})
        bar.set_postfix(loss=f"{loss:.3f}", **{metric: f"{last[metric]:.3f}"})
        say(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in last.items()))
        pending, t_last, steps_since = [], time.perf_counter(), 0
      if evaluator is not None and (step % tcfg.eval_every == 0 or step == tcfg.num_steps):
        res = evaluator.evaluate(state.params, "valid", max_steps=tcfg.eval_max_steps)
        writer.scalars(step, {f"valid/{k}": v for k, v in res.items()})
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
