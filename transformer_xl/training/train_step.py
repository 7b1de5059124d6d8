"""The jitted, sharded train step.

Reference semantics (Dai et al. 2019; reference ``train.py``): the memory
carried from step to step for each batch row, gradient accumulation over
``batch_chunk`` micro-batches, each with its own rows' memory.  The
optimizer and the state are in train_state.py; the loop that runs the step
(evaluation, checkpoints, divergence) is train.py.

One ``jax.jit`` with NamedShardings on a ("data", "model") mesh: parameters
placed by logical axis rules (sharding.py), batch and memory rows over
``data``; the TrainState (which holds the memory, so it never leaves the
devices) is donated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer_xl import sharding
from transformer_xl.model import models
from transformer_xl.training.train_state import TrainState

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
  ``step`` advances); the host decides what to do (``guards.NonFiniteGuard``).
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
  ``example_corpus.ExampleWindows``); the next state's memory is the one after
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
