"""Scoring a split with the evaluation settings (Dai et al. 2019, Sec. 3.2, 4).

Evaluation uses its own segment length, memory length, clamp_len and
same_length (``config.eval``; longer memory than in training, as in the
paper), the training parameters, and no dropout.  Every token of the split
is scored exactly once, the tail included (input_pipeline.EvalIterator);
rows carry their memory from segment to segment, starting empty.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import jax
from etils import epath
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from transformer_xl import datasets, input_pipeline, models, sharding


def eval_model_config(config: ml_collections.ConfigDict, train_cfg: models.ModelConfig
                      ) -> models.ModelConfig:
  """The training ModelConfig with the eval tgt_len, mem_len, clamp_len and same_length."""
  e = config.eval
  return dataclasses.replace(train_cfg, tgt_len=e.tgt_len, mem_len=e.mem_len,
                             clamp_len=e.clamp_len, same_length=e.same_length,
                             dropout=0.0, dropatt=0.0, ext_len=0)


class Evaluator:
  """Scores splits of a corpus; one compiled eval step, reused.

  Args:
    config: full config (``eval`` section used).
    train_model_cfg: the training ModelConfig (parameters are shared).
    corpus: the corpus.
    mesh: the device mesh; eval rows go over ``data``.
  """

  def __init__(self, config: ml_collections.ConfigDict, train_model_cfg: models.ModelConfig,
               corpus: datasets.Corpus, mesh: Mesh):
    self.cfg = eval_model_config(config, train_model_cfg)
    self.global_batch = config.eval.global_batch
    self.corpus = corpus
    self.mesh = mesh
    self.model = models.TransformerXL(self.cfg)
    self._batch_sharding = sharding.batch_sharding(mesh)
    mem_sharding = sharding.memory_sharding(mesh)
    batch_shardings = {k: self._batch_sharding for k in ("inputs", "targets", "weights")}
    batch_shardings["reset"] = sharding.rows_sharding(mesh)

    def eval_step(params, memory, batch):
      memory = models.reset_memory(memory, batch["reset"])
      nll_BxT, new_memory = self.model.apply({"params": params}, batch["inputs"], memory,
                                             batch["targets"], deterministic=True)
      w = batch["weights"]
      return jnp.sum(nll_BxT * w), jnp.sum(w), new_memory

    self._eval_step = jax.jit(
        eval_step, in_shardings=(None, mem_sharding, batch_shardings),
        out_shardings=(sharding.replicated(mesh), sharding.replicated(mesh), mem_sharding),
        donate_argnums=(1,))
    self._mem_sharding = mem_sharding

  def evaluate(self, params: Any, split: str, max_steps: int = 0) -> dict:
    """Scores ``split`` (all of it unless ``max_steps`` > 0 caps the segments).

    Returns:
      {"loss_nats": mean NLL per token (nats), "bpc" or "ppl": ...,
       "tokens": number of scored tokens}.
    """
    from transformer_xl import train  # metric helpers
    it = input_pipeline.EvalIterator(
        self.corpus.splits[split], self.global_batch, self.cfg.tgt_len,
        boundary_id=self.corpus.boundary_id,
        row_ids=input_pipeline.process_row_ids(self._batch_sharding, self.global_batch,
                                               self.cfg.tgt_len))
    memory = jax.jit(lambda: models.init_memory(self.cfg, self.global_batch),
                     out_shardings=self._mem_sharding)()
    sums = []  # per-step (nll, tokens) on device; summed in float64 at the end
    for i, local in enumerate(it):
      if max_steps and i >= max_steps:
        break
      batch = input_pipeline.to_global_batch(local, self._batch_sharding, self.global_batch)
      s, n, memory = self._eval_step(params, memory, batch)
      sums.append((s, n))
    host = np.asarray(jax.device_get(sums), np.float64).reshape(-1, 2)
    nll_sum, n_tok = host[:, 0].sum(), host[:, 1].sum()
    loss = nll_sum / max(n_tok, 1.0)
    metric = train.metric_name(self.corpus.unit)
    return {"loss_nats": loss, metric: train.metric_value(loss, self.corpus.unit),
            "tokens": int(round(n_tok))}


def write_results(workdir: str, results: Mapping[str, Mapping[str, Any]]) -> str:
  """Writes ``<workdir>/eval_results.json`` (process 0) and returns its path."""
  path = epath.Path(workdir) / "eval_results.json"
  if jax.process_index() == 0:
    path.write_text(json.dumps(results, indent=2, sort_keys=True))
  return str(path)
