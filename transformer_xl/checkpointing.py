"""Orbax checkpoints of the whole training state.

A checkpoint holds the TrainState (parameters, optimizer state, step and
the training memory, all global jax.Arrays, so multi-process saving works)
and the input iterator's position (JSON), so that a resumed run continues
exactly where it stopped.  Checkpoints live in ``<workdir>/checkpoints``.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath


def make_manager(workdir: str, max_to_keep: int) -> ocp.CheckpointManager:
  """CheckpointManager in ``<workdir>/checkpoints`` keeping ``max_to_keep``.

  Raises:
    ValueError: max_to_keep < 1.
  """
  if max_to_keep < 1:
    raise ValueError(f"checkpoint.max_to_keep={max_to_keep} must be >= 1.")
  directory = epath.Path(workdir) / "checkpoints"  # a local path or gs://
  if "://" not in str(workdir):
    directory = directory.absolute()
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
  return ocp.CheckpointManager(directory, options=options,
                               item_names=("state", "iterator"))


def save(manager: ocp.CheckpointManager, step: int, state: Any, iterator_state: dict,
         force: bool = False) -> bool:
  """Saves ``state`` (a pytree of global arrays) and the iterator position.

  Returns whether a checkpoint was written (the manager may skip a step
  already saved).  Waits until the write is complete, so a crash right
  after cannot leave a half-written latest checkpoint behind.
  """
  saved = manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(_without_empty(state)),
                              iterator=ocp.args.JsonSave(iterator_state)),
      force=force)
  manager.wait_until_finished()
  return saved


def restore_latest(manager: ocp.CheckpointManager, abstract_state: Any
                   ) -> Optional[tuple[int, Any, dict]]:
  """Restores the latest checkpoint, or returns None when there is none.

  Args:
    abstract_state: pytree of jax.ShapeDtypeStruct with shardings, the
      layout to restore into (so arrays land directly on their devices).

  Returns:
    (step, state, iterator_state) or None.
  """
  step = manager.latest_step()
  if step is None:
    return None
  restored = manager.restore(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardRestore(_without_empty(abstract_state)),
                              iterator=ocp.args.JsonRestore()))
  return step, _with_empty(restored["state"], abstract_state), dict(restored["iterator"])


def _without_empty(tree: Any) -> Any:
  """``tree`` with its zero-size arrays (the memory of a model without
  recurrence, mem_len 0) replaced by None: orbax cannot save them."""
  return jax.tree_util.tree_map(lambda x: None if x.size == 0 else x, tree)


def _with_empty(restored: Any, abstract: Any) -> Any:
  """Puts the zero-size arrays of ``abstract`` back where ``restored`` has None."""
  leaves, treedef = jax.tree_util.tree_flatten(abstract)
  got = jax.tree_util.tree_flatten(restored, is_leaf=lambda x: x is None)[0]
  return treedef.unflatten([
      r if a.size else jax.device_put(np.zeros(a.shape, a.dtype), a.sharding)
      for r, a in zip(got, leaves)])
