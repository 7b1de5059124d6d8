"""The evaluation model and its jitted steps (Dai et al. 2019, Sec. 3.2, 4).

Evaluation uses its own segment length, memory length, clamp_len and
same_length (``config.eval``; longer memory than in training, as in the
paper), the training parameters, and no dropout: ``eval_model_config``
(segments with memory) and ``window_model_config`` (the sliding windows of
Al-Rfou et al. 2018).  Their steps: ``make_eval_step`` (one segment, the
memory carried and donated) and ``make_window_step`` (one window, no
memory).  ``evaluate.Evaluator`` runs them over a split or token streams;
training validates with it, and ``training/lowering.py`` and the
benchmarks compile these steps alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from transformer_xl import sharding
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models


def eval_model_config(
    config: ml_collections.ConfigDict, train_cfg: models.ModelConfig
) -> models.ModelConfig:
  """The model of the segment evaluation: the training ModelConfig with the
  eval tgt_len, mem_len, clamp_len, same_length and the memory variants'
  evaluation settings (``eval.<variant>``: ``memory.eval_settings``), no
  dropout, and the training tables' length (``max_klen``) kept."""
  e = config.eval
  return dataclasses.replace(
      train_cfg,
      tgt_len=e.tgt_len,
      mem_len=e.mem_len,
      memory_settings=memory_lib.eval_settings(train_cfg, e.to_dict()),
      clamp_len=e.clamp_len,
      same_length=e.same_length,
      dropout=0.0,
      dropatt=0.0,
      max_klen=train_cfg.pos_table_len,
  )


def window_model_config(
    config: ml_collections.ConfigDict, train_cfg: models.ModelConfig
) -> models.ModelConfig:
  """The model of the sliding-window evaluation: segments of ``eval.window``
  positions (0 = the training attention length tgt_len + mem_len), no
  memory (the memory variants' settings for a sliding window:
  ``memory.eval_settings``), the eval clamp_len, no dropout."""
  window = config.eval.window or train_cfg.tgt_len + train_cfg.mem_len
  return dataclasses.replace(
      train_cfg,
      tgt_len=window,
      mem_len=0,
      memory_settings=memory_lib.eval_settings(train_cfg, {}, sliding=True),
      same_length=False,
      clamp_len=config.eval.clamp_len,
      dropout=0.0,
      dropatt=0.0,
      max_klen=train_cfg.pos_table_len,
  )


def segment_nll(
    model: models.TransformerXL, params: Any, memory: memory_lib.Memory, batch: dict
) -> tuple[jax.Array, memory_lib.Memory]:
  """One evaluation segment, traced: (nll_BxT float32 nats, the next memory)
  of ``batch`` (``make_eval_step``'s keys), no dropout."""
  return model.apply(
      {"params": params},
      batch["inputs"],
      memory,
      batch["targets"],
      deterministic=True,
      reset_B=batch["reset"],
      doc_pos_BxT=batch.get("doc_pos"),
  )


def segment_nll_correct(
    model: models.TransformerXL, params: Any, memory: memory_lib.Memory, batch: dict
) -> tuple[jax.Array, jax.Array, memory_lib.Memory]:
  """``segment_nll`` and whether each position's argmax prediction is its
  target: (nll_BxT float32 nats, correct_BxT bool, the next memory).

  The prediction is the argmax of the full distribution (the model's
  log-probabilities, ``TransformerXL.__call__`` without targets: with an
  adaptive softmax, over every cluster's tokens, not the head's alone);
  ties go to the lower id.  The NLL is read from the same log-probabilities
  (what ``nll`` computes, without the [B, T, V] array; equal to float32
  rounding).
  """
  logp_BxTxV, new_memory = model.apply(
      {"params": params},
      batch["inputs"],
      memory,
      None,
      deterministic=True,
      reset_B=batch["reset"],
      doc_pos_BxT=batch.get("doc_pos"),
  )
  targets_BxT = batch["targets"]
  nll_BxT = -jnp.take_along_axis(logp_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
  correct_BxT = jnp.argmax(logp_BxTxV, axis=-1) == targets_BxT
  return nll_BxT, correct_BxT, new_memory


def make_eval_step(model: models.TransformerXL, mesh: Mesh, correct: bool = False) -> Callable:
  """The jitted eval step: (params, memory, batch) -> (nll_BxT, memory);
  with ``correct``, (nll_BxT, correct_BxT, memory) (``segment_nll_correct``:
  bool [B, T], replicated, the argmax prediction equals the target).

  ``batch``: ``inputs``/``targets`` int32 [B, T], ``reset`` bool [B]
  (rows whose memory is emptied first) and, optionally, ``doc_pos`` int32
  [B, T] (offsets in the documents, ``models.TransformerXL.hidden``),
  global arrays with their rows over ``data``.  ``nll_BxT`` is float32,
  nats, replicated (it is small, so every process can read all of it); the
  memory stays sharded over the rows and is donated.  No dropout.
  """
  # Rows over ``data`` for every array, [B] or [B, T]: a prefix of the batch
  # dict whatever its keys (``doc_pos`` is optional).
  batch_shardings = sharding.rows_sharding(mesh)
  mem_sharding = memory_lib.shardings(model.config, mesh)

  def eval_step(params, memory, batch):
    if correct:
      return segment_nll_correct(model, params, memory, batch)
    return segment_nll(model, params, memory, batch)

  replicated = sharding.replicated(mesh)
  return jax.jit(
      sharding.traced_with_mesh(eval_step, mesh),
      in_shardings=(None, mem_sharding, batch_shardings),
      out_shardings=(replicated, replicated, mem_sharding)
      if correct
      else (replicated, mem_sharding),
      donate_argnums=(1,),
  )


def make_window_step(model: models.TransformerXL, mesh: Mesh, stride: int) -> Callable:
  """The jitted sliding-window step: (params, batch) -> nll_BxL.

  ``batch``: ``inputs``/``targets`` int32 [B, L] and ``front_pad`` int32 [B]
  (``data.SlidingWindowIterator``).  Every row is a fresh window: no memory
  (mem_len 0), its first ``front_pad`` positions masked as keys.  Only the
  last ``stride`` positions of a window are ever scored, so the softmax runs
  on those alone (as the reference, whose window is ``tgt_len = stride``
  scored positions after ``L - stride`` unscored ones of extended context);
  ``nll_BxL`` float32 nats, replicated, 0 at the other positions.
  """
  batch_shardings = {
      "inputs": sharding.batch_sharding(mesh),
      "targets": sharding.batch_sharding(mesh),
      "front_pad": sharding.rows_sharding(mesh),
  }

  def window_step(params, batch):
    memory = memory_lib.init_memory(model.config, batch["inputs"].shape[0], mem_len=0)
    memory = memory.with_front_padding(batch["front_pad"])
    variables = {"params": params}
    hidden_BxLxD, _ = model.apply(
        variables, batch["inputs"], memory, deterministic=True, method=models.TransformerXL.hidden
    )
    nll_BxS = model.apply(
        variables,
        hidden_BxLxD[:, -stride:],
        batch["targets"][:, -stride:],
        method=models.TransformerXL.nll,
    )
    window = batch["inputs"].shape[1]
    return jnp.pad(nll_BxS, ((0, 0), (window - stride, 0)))

  return jax.jit(
      sharding.traced_with_mesh(window_step, mesh),
      in_shardings=(None, batch_shardings),
      out_shardings=sharding.replicated(mesh),
  )
