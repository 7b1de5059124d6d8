"""The training state, its optimizer, and the one way it is created on a mesh.

Reference semantics (Dai et al. 2019; reference ``train.py``): Adam with
linear warmup then cosine decay, global-norm clipping at ``clip``.

One init path (big_vision's): a pure ``init(rng)`` that builds the whole
``TrainState``; ``jax.eval_shape`` of it gives shapes, the logical axis
names of the parameters give their shardings (sharding.py), and
``jax.jit(init, out_shardings=...)`` creates every array directly on its
devices.  Training, the converter and the benchmarks all go through
``abstract_train_state`` and ``create_train_state``.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from transformer_xl import sharding
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.run import param_shapes

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the iterator position.

  Attributes:
    step: int32 scalar, optimizer steps taken.
    params: model parameters (float32).
    opt_state: optax state.
    memory: the training ``memory_lib.Memory`` of every batch row.
  """

  step: Array
  params: Any
  opt_state: Any
  memory: memory_lib.Memory


def state_bytes(state: TrainState) -> dict[str, int]:
  """Bytes of each part of a train state, as a checkpoint holds them
  (before any compression of the checkpoint format):
  {"params", "opt_state", "memory"}; the memory is every row's (e.g. a kNN
  store: ``2 N B H S Dh`` values), which a checkpoint saves whole."""
  size = lambda tree: sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))
  return {
      "params": size(state.params),
      "opt_state": size(state.opt_state),
      "memory": size(state.memory),
  }


def learning_rate_schedule(train_cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup from 0 to learning_rate, then a decay to min_lr.

  ``train.schedule``: "cosine" (optax ``warmup_cosine_decay_schedule``, the
  cosine spanning the steps including the warmup: the reference's
  CosineAnnealingLR over max_step) or "linear" (HuggingFace's
  ``get_linear_schedule_with_warmup``, which the ARMT and RMT authors
  train with: ``lr * step / warmup``, then a straight line to min_lr).  The
  decay reaches min_lr at ``train.schedule_steps`` (0 = ``num_steps``; the
  ARMT authors set twice their iterations) and stays there.
  """
  lr, end = train_cfg.learning_rate, train_cfg.min_lr
  warmup = train_cfg.warmup_steps
  total = train_cfg.get("schedule_steps", 0) or train_cfg.num_steps
  if train_cfg.get("schedule", "cosine") == "linear":
    decay = optax.linear_schedule(lr, end, max(total - warmup, 1))
    if not warmup:
      return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup > 0 else lr,
      peak_value=lr,
      warmup_steps=warmup,
      decay_steps=max(total, warmup + 1),
      end_value=end,
  )


def make_optimizer(
    train_cfg: ml_collections.ConfigDict, model_cfg: models.ModelConfig | None = None
) -> optax.GradientTransformation:
  """Clipping, then Adam (AdamW with ``train.weight_decay`` > 0) on
  ``learning_rate_schedule``.

  Clipping: each gradient value to ``[-train.clip_value, clip_value]``
  when set (torch's ``clip_grad_value_``, the ARMT authors'), then the
  global norm to ``train.clip`` (the reference's; inf: none).  AdamW is
  torch's ``AdamW`` (and optax's ``adamw``): the parameters decay by
  ``lr * weight_decay`` apart from the Adam step, every parameter alike.

  A model whose memory has parameters of its own optimised apart
  (``memory.Plan.param_groups``, e.g. a compression network that its paper
  optimises apart from the language model) has
  each group clipped apart from the rest (``clip_groups_by_global_norm``),
  each to ``train.clip``: an auxiliary loss's gradient then takes nothing
  from the language model's clipped step.  Adam works per parameter, so
  this is one optimiser per group with the same settings; the state is the
  plain chain's (checkpoints keep their layout; without ``clip_value`` and
  weight decay, the layout of the versions before them).
  """
  groups = memory_lib.plan(model_cfg).param_groups() if model_cfg is not None else ()
  if groups:
    clip = clip_groups_by_global_norm(train_cfg.clip, groups)
  else:
    clip = optax.clip_by_global_norm(train_cfg.clip)
  schedule = learning_rate_schedule(train_cfg)
  adam = dict(b1=train_cfg.adam_b1, b2=train_cfg.adam_b2, eps=train_cfg.adam_eps)
  decay = train_cfg.get("weight_decay", 0.0)
  step = (
      optax.adamw(schedule, weight_decay=decay, **adam) if decay else optax.adam(schedule, **adam)
  )
  value = train_cfg.get("clip_value", 0.0)
  return optax.chain(optax.clip(value), clip, step) if value else optax.chain(clip, step)


def clip_groups_by_global_norm(
    max_norm: float, groups: tuple[tuple[str, ...], ...]
) -> optax.GradientTransformation:
  """``optax.clip_by_global_norm`` applied to each group on its own: the
  leaves under a key in ``groups[i]`` (parameter names, as
  ``memory.Plan.param_groups`` gives them; the first group that names a
  key of the leaf's path), and the others.  Stateless
  (``optax.EmptyState``)."""

  def group_of(path) -> int:
    keys = [getattr(k, "key", None) for k in path]
    return next((i for i, names in enumerate(groups) if any(k in names for k in keys)), -1)

  def update_fn(updates, state, params=None):
    del params
    flat = jax.tree_util.tree_flatten_with_path(updates)[0]
    norms = {
        group: optax.tree.norm([u for path, u in flat if group_of(path) == group])
        for group in (*range(len(groups)), -1)
    }

    def clip(path, u):
      norm = norms[group_of(path)]
      return jnp.where(norm < max_norm, u, (u / norm.astype(u.dtype)) * max_norm)

    return jax.tree_util.tree_map_with_path(clip, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def _state_from_params(model: models.TransformerXL, tx, global_batch: int, params) -> TrainState:
  """Step 0, fresh optimizer state and an empty memory around ``params``."""
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      memory=memory_lib.init_memory(model.config, global_batch),
  )


def _init(model: models.TransformerXL, tx, global_batch: int, rng: Array) -> TrainState:
  """The whole initial state from a PRNG key (reference initialisation)."""
  params = nn.unbox(models.init_params(model, rng))
  return _state_from_params(model, tx, global_batch, params)


def abstract_train_state(model: models.TransformerXL, tx, global_batch: int, mesh: Mesh):
  """Shapes and shardings of the state, without allocating anything.

  Parameters are placed by their logical axis names; optimizer moments
  follow their parameters; scalars are replicated; the memory's rows go
  over the data-parallel axes.

  Returns:
    (abstract TrainState of jax.ShapeDtypeStruct with shardings, TrainState
    of NamedShardings).
  """
  shapes = jax.eval_shape(functools.partial(_init, model, tx, global_batch), jax.random.PRNGKey(0))
  _, param_shardings = param_shapes.abstract_params(model, mesh)
  opt_shardings = optax.tree_map_params(
      tx,
      lambda _, s: s,
      shapes.opt_state,
      param_shardings,
      transform_non_params=lambda _: sharding.replicated(mesh),
      is_leaf=lambda x: isinstance(x, NamedSharding),
  )
  shardings = TrainState(
      step=sharding.replicated(mesh),
      params=param_shardings,
      opt_state=opt_shardings,
      memory=memory_lib.shardings(model.config, mesh),
  )
  abstract = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
  )
  return abstract, shardings


def create_train_state(
    model: models.TransformerXL,
    tx,
    global_batch: int,
    mesh: Mesh,
    rng: Array | None = None,
    state_shardings=None,
    params: Any | None = None,
) -> TrainState:
  """A step-0 TrainState created on the mesh, each array on its devices.

  Args:
    model: as ``abstract_train_state``.
    tx: as ``abstract_train_state``.
    global_batch: as ``abstract_train_state``.
    mesh: as ``abstract_train_state``.
    rng: PRNG key of the parameter initialisation (when ``params`` is None).
    state_shardings: from ``abstract_train_state`` (computed if None).
    params: existing parameters (host arrays, e.g. converted ones) instead
      of fresh ones; the optimizer state is initialised for them.

  Raises:
    ValueError: neither ``rng`` nor ``params`` given.
  """
  if state_shardings is None:
    _, state_shardings = abstract_train_state(model, tx, global_batch, mesh)
  if params is not None:
    from_params = functools.partial(_state_from_params, model, tx, global_batch)
    return jax.jit(
        from_params, in_shardings=(state_shardings.params,), out_shardings=state_shardings
    )(params)
  if rng is None:
    raise ValueError("create_train_state needs rng (fresh parameters) or params.")
  init = functools.partial(_init, model, tx, global_batch)
  return jax.jit(init, out_shardings=state_shardings)(rng)
