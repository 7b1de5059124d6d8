"""Scoring a split with the evaluation settings (Dai et al. 2019, Sec. 3.2, 4).

Evaluation uses its own segment length, memory length, clamp_len and
same_length (``config.eval``; longer memory than in training, as in the
paper), the training parameters, and no dropout.  Every token of the split
is scored exactly once, the tail included (data.EvalIterator);
rows carry their memory from segment to segment, starting empty.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

import jax
from etils import epath
import ml_collections
import numpy as np
from jax.sharding import Mesh

from transformer_xl import data, models, sharding


def eval_model_config(config: ml_collections.ConfigDict, train_cfg: models.ModelConfig
                      ) -> models.ModelConfig:
  """The training ModelConfig with the eval tgt_len, mem_len, clamp_len and same_length."""
  e = config.eval
  return dataclasses.replace(train_cfg, tgt_len=e.tgt_len, mem_len=e.mem_len,
                             clamp_len=e.clamp_len, same_length=e.same_length,
                             dropout=0.0, dropatt=0.0, ext_len=0)


class Evaluator:
  """Scores token streams with the eval settings; one compiled step, reused.

  Args:
    config: full config (``eval`` section used).
    train_model_cfg: the training ModelConfig (parameters are shared).
    corpus: the corpus (for :meth:`evaluate`; None when only scoring arrays).
    mesh: the device mesh; rows go over the data-parallel axes.
  """

  def __init__(self, config: ml_collections.ConfigDict, train_model_cfg: models.ModelConfig,
               corpus: Optional[data.Corpus], mesh: Mesh):
    self.cfg = eval_model_config(config, train_model_cfg)
    self.global_batch = config.eval.global_batch
    self.corpus = corpus
    self.mesh = mesh
    self.model = models.TransformerXL(self.cfg)
    self._batch_sharding = sharding.batch_sharding(mesh)
    self._mem_sharding = sharding.memory_sharding(mesh)
    self._init_memory = {}  # batch size -> jitted constructor
    batch_shardings = {k: self._batch_sharding for k in ("inputs", "targets")}
    batch_shardings["reset"] = sharding.rows_sharding(mesh)

    def nll_step(params, memory, batch):
      memory = models.reset_memory(memory, batch["reset"])
      return self.model.apply({"params": params}, batch["inputs"], memory, batch["targets"],
                              deterministic=True)

    # Per-token NLL comes back replicated (it is small), so every process
    # can read all of it; the memory stays sharded and is donated.
    self._nll_step = jax.jit(
        nll_step, in_shardings=(None, self._mem_sharding, batch_shardings),
        out_shardings=(sharding.replicated(mesh), self._mem_sharding), donate_argnums=(1,))

  def _empty_memory(self, batch_size: int) -> models.Memory:
    """Empty eval memory for ``batch_size`` rows, made on the devices (one
    compilation per batch size)."""
    if batch_size not in self._init_memory:
      self._init_memory[batch_size] = jax.jit(
          lambda: models.init_memory(self.cfg, batch_size), out_shardings=self._mem_sharding)
    return self._init_memory[batch_size]()

  def evaluate(self, params: Any, split: str, max_steps: int = 0) -> dict:
    """Scores ``split`` of the corpus (all of it unless ``max_steps`` > 0).

    Returns:
      {"loss_nats": mean NLL per token (nats), "bpc" or "ppl": ...,
       "tokens": number of scored tokens}.
    """
    from transformer_xl import train  # metric helpers
    # The eval batch need not divide the data-parallel size: rows are padded
    # with dummy rows of weight 0 (the reference's eval batch of 10 works on
    # any slice).  Each process reads only its own real rows.
    source, b, seg = self.corpus.splits[split], self.global_batch, self.cfg.tgt_len
    b_pad = -(-b // sharding.data_parallel_size(self.mesh)) * sharding.data_parallel_size(self.mesh)
    rows = data.process_row_ids(self._batch_sharding, b_pad, seg)
    real = [r for r in rows if r < b]
    num_steps = len(data.EvalIterator(source, b, seg, self.corpus.boundary_id, row_ids=[0]))
    it = (data.EvalIterator(source, b, seg, self.corpus.boundary_id, row_ids=real)
          if real else None)
    n_dummy = len(rows) - len(real)
    memory = self._empty_memory(b_pad)
    nll_sum, n_tok = 0.0, 0.0
    pending = []  # (nll on device, weights) of steps not yet summed
    for i in range(num_steps):
      if max_steps and i >= max_steps:
        break
      local = next(it) if it is not None else None
      if n_dummy:
        dummy = {"inputs": np.zeros((n_dummy, seg), np.int32),
                 "targets": np.zeros((n_dummy, seg), np.int32),
                 "weights": np.zeros((n_dummy, seg), np.float32),
                 "reset": np.full((n_dummy,), i == 0)}
        local = dummy if local is None else {k: np.concatenate([local[k], dummy[k]])
                                             for k in dummy}
      batch = data.to_global_batch(local, self._batch_sharding, b_pad)
      weights = batch.pop("weights")
      nll_BxT, memory = self._nll_step(params, memory, batch)
      pending.append((nll_BxT, weights))
    for nll_BxT, w_BxT in pending:  # float64 sums over every scored token
      w = np.asarray(jax.device_get(_fully_replicated(w_BxT)), np.float64)
      nll_sum += float(np.sum(np.asarray(jax.device_get(nll_BxT), np.float64) * w))
      n_tok += float(w.sum())
    loss = nll_sum / max(n_tok, 1.0)
    metric = train.metric_name(self.corpus.unit)
    return {"loss_nats": loss, metric: train.metric_value(loss, self.corpus.unit),
            "tokens": int(round(n_tok))}

  def score(self, params: Any, tokens_BxT1: np.ndarray) -> np.ndarray:
    """Per-token NLL of contiguous streams, segment by segment with memory.

    Row b of ``tokens_BxT1`` is one stream; segments of the eval tgt_len go
    left to right, carrying a memory of the eval mem_len that starts empty.
    Rows are padded to a multiple of the data-parallel size and the last
    segment to tgt_len; padding comes after the real tokens of a row, so it
    cannot change their scores (causality), and is cut off.

    Args:
      params: model parameters.
      tokens_BxT1: integer array [B, T + 1] of token ids (all processes pass
        the same array).

    Returns:
      float32 [B, T]: entry (b, t) is -log p(token t+1 | tokens <= t), nats.

    Raises:
      ValueError: not a 2-D array with T >= 1, or ids outside [0, n_token).
    """
    tokens = np.asarray(tokens_BxT1)
    if tokens.ndim != 2 or tokens.shape[1] < 2 or not np.issubdtype(tokens.dtype, np.integer):
      raise ValueError(f"tokens must be an integer array [B, T+1] with T >= 1; got "
                       f"{tokens.dtype} {tokens.shape}.")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= self.cfg.n_token):
      raise ValueError(f"token ids must be in [0, {self.cfg.n_token}); got "
                       f"[{tokens.min()}, {tokens.max()}].")
    b, t1 = tokens.shape
    t, seg = t1 - 1, self.cfg.tgt_len
    n_data = sharding.data_parallel_size(self.mesh)
    b_pad, n_seg = -(-b // n_data) * n_data, -(-t // seg)
    padded = np.zeros((b_pad, n_seg * seg + 1), np.int32)
    padded[:b, :t1] = tokens
    memory = self._empty_memory(b_pad)
    rows = data.process_row_ids(self._batch_sharding, b_pad, seg)
    out = []
    for s in range(n_seg):
      local = {"inputs": padded[rows, s * seg:(s + 1) * seg],
               "targets": padded[rows, s * seg + 1:(s + 1) * seg + 1],
               "reset": np.full((len(rows),), s == 0)}
      batch = data.to_global_batch(local, self._batch_sharding, b_pad)
      nll_BxT, memory = self._nll_step(params, memory, batch)
      out.append(nll_BxT)
    return np.concatenate([np.asarray(jax.device_get(x)) for x in out], axis=1)[:b, :t].astype(
        np.float32)


def _fully_replicated(x: jax.Array) -> jax.Array:
  """``x`` gathered onto every device, so that any process can read it."""
  if x.is_fully_replicated:
    return x
  return jax.jit(lambda a: a, out_shardings=jax.sharding.NamedSharding(
      x.sharding.mesh, jax.sharding.PartitionSpec()))(x)


def write_results(workdir: str, results: Mapping[str, Mapping[str, Any]]) -> str:
  """Writes ``<workdir>/eval_results.json`` (process 0) and returns its path."""
  path = epath.Path(workdir) / "eval_results.json"
  if jax.process_index() == 0:
    path.write_text(json.dumps(results, indent=2, sort_keys=True))
  return str(path)
