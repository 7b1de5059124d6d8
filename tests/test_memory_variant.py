"""A memory variant written against the ``model/memory/`` package alone trains, resumes and evaluates.

The proof that the memory is one place: ``PooledMemory`` below (test only)
keeps, besides the XL memory of mem_len slots, one extra slot per layer
holding a learned summary (a Dense projection of the mean) of the inputs
that the XL memory dropped in the last segment, and sows an auxiliary loss
(the projection's squared error against that mean) into the ``losses``
collection.  It is defined here, registered with ``memory.register`` and
chosen with ``model.memory``; nothing else of the package knows of it.  The
extra slot sits at the front of the key layout, so the masks and relative
positions need no change: it becomes visible once mem_len + 1 slots are
valid, which is exactly when the XL memory first dropped an input.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config, sharding
from transformer_xl.inference import evaluate
from transformer_xl.model import attention_ops, memory, models
from transformer_xl.run import run_dir
from transformer_xl.training import train

from helpers import TOY_VOCAB as CORPUS_VOCAB
from helpers import tiny_config, tiny_model_config, toy_corpus

VOCAB = 64
SIZES = dict(n_token=VOCAB, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32)


@memory.register
class PooledMemory(memory.MemoryVariant):
  """The XL memory plus one slot: a learned summary of what it last dropped."""

  name = "pooled_test"
  decode_cache = False  # not a FIFO of the layer inputs

  @staticmethod
  def slots(mem_len: int, cfg) -> int:
    return mem_len + 1 if mem_len else 0

  @staticmethod
  def layer_update(module, cfg, mem_BxMxD, h_BxTxD, key_count_B):
    if mem_BxMxD.shape[1] == 0:
      return memory.layer_update(mem_BxMxD, h_BxTxD)
    tgt_len = h_BxTxD.shape[1]
    xl_BxMxD = mem_BxMxD[:, 1:]
    cat_BxKxD = jnp.concatenate([xl_BxMxD, h_BxTxD], axis=1)
    dropped_mean_Bx1xD = cat_BxKxD[:, :tgt_len].mean(axis=1, keepdims=True)
    summary_Bx1xD = nn.Dense(
        cfg.d_model,
        dtype=cfg.compute_dtype,
        name="pool_proj",
        kernel_init=attention_ops.normal_init(cfg.init_std, "embed", "kv"),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("kv",)),
    )(jax.lax.stop_gradient(dropped_mean_Bx1xD))
    module.sow(
        "losses",
        "pool_mse",
        jnp.mean(jnp.square(summary_Bx1xD.astype(jnp.float32) - dropped_mean_Bx1xD)),
    )
    new_xl_BxMxD = memory.layer_update(xl_BxMxD, h_BxTxD)
    return jax.lax.stop_gradient(
        jnp.concatenate([summary_Bx1xD.astype(h_BxTxD.dtype), new_xl_BxMxD], axis=1)
    )


def pooled_config(**train_kw):
  c = tiny_config(**train_kw)
  c.model.update(memory=PooledMemory.name, dropout=0.0, dropatt=0.0)
  return c


def test_the_variant_is_chosen_by_the_config_and_unknown_names_are_refused():
  cfg = tiny_model_config(**SIZES, tgt_len=6, mem_len=6, memory=PooledMemory.name)
  assert memory.variant(cfg) is PooledMemory
  assert models.init_memory(cfg, 3).mems_LxBxMxD.shape == (2, 3, 7, 16)
  assert cfg.pos_table_len == 6 + 7  # the learned position tables cover the extra slot
  problems = default_config.config_problems({"memory": "nope"})
  assert problems == [f"model.memory='nope': use one of {tuple(sorted(memory.VARIANTS))}."]
  with pytest.raises(ValueError, match="already|exists"):
    memory.register(type("Other", (memory.MemoryVariant,), {"name": PooledMemory.name}))


def test_the_extra_slot_is_hidden_until_the_xl_memory_drops_an_input():
  """Segments 1-3 score as the XL model with the same parameters (4, 8, 8
  valid XL slots, the summary slot masked); segment 3 is the first whose XL
  update drops inputs, so from segment 4 on the summary slot is read."""
  kw = dict(**SIZES, tgt_len=4, mem_len=8, dropout=0.0)
  pooled = models.TransformerXL(tiny_model_config(**kw, memory=PooledMemory.name))
  xl = models.TransformerXL(tiny_model_config(**kw))
  params = nn.unbox(models.init_params(pooled, jax.random.PRNGKey(0)))
  # A summary far from the states (bias 3), so that reading it shows in the scores.
  params["layers"]["pool_proj"]["bias"] = jnp.full_like(params["layers"]["pool_proj"]["bias"], 3.0)
  xl_params = jax.tree_util.tree_map(lambda x: x, params)
  del xl_params["layers"]["pool_proj"]
  assert jax.tree_util.tree_structure(xl_params) == jax.tree_util.tree_structure(
      nn.unbox(models.init_params(xl, jax.random.PRNGKey(0)))
  )
  tokens = np.random.default_rng(1).integers(0, VOCAB, size=(3, 5 * 4 + 1)).astype(np.int32)
  mem_p, mem_x = models.init_memory(pooled.config, 3), models.init_memory(xl.config, 3)
  for s in range(5):
    x, y = tokens[:, 4 * s : 4 * s + 4], tokens[:, 4 * s + 1 : 4 * s + 5]
    (nll_p, mem_p), sown = pooled.apply({"params": params}, x, mem_p, y, mutable=["losses"])
    nll_x, mem_x = xl.apply({"params": xl_params}, x, mem_x, y)
    assert sown["losses"]["layers"]["pool_mse"][0].shape == (2,)  # one per layer
    if s < 3:  # 0, 4, 8 valid slots before the segment: the summary slot (0 of 9) is masked
      np.testing.assert_allclose(nll_p, nll_x, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(mem_p.mems_LxBxMxD[:, :, 1:], mem_x.mems_LxBxMxD, atol=1e-6)
    else:
      assert np.abs(np.asarray(nll_p) - np.asarray(nll_x)).max() > 1e-3
  with pytest.raises(NotImplementedError, match="no decoding cache"):
    pooled.apply({"params": params}, tokens[:, :1], mem_p, None, method=pooled.decode)


def _fingerprints(workdir, step):
  rec = json.loads(
      (Path(workdir) / "checkpoints" / str(step) / "integrity" / "metadata").read_text()
  )
  return {k: v["fingerprint"] for k, v in rec["leaves"].items()}


@pytest.mark.slow
def test_it_trains_sharded_with_accumulation_resumes_exactly_and_evaluates(tmp_path):
  mesh = sharding.make_mesh((4, 2), ("data", "model"))  # 8 simulated devices
  config = pooled_config(num_steps=6, batch_chunk=2, log_every=1, eval_every=0, aux_loss_weight=0.5)
  config.checkpoint.update(every_steps=2, max_to_keep=10)
  straight = tmp_path / "straight"
  train.train_and_evaluate(config, str(straight), toy_corpus(), mesh)

  rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
  logged = [r for r in rows if "train/aux_loss/pool_mse" in r]
  assert len(logged) == 6 and all(np.isfinite(r["train/aux_loss/pool_mse"]) for r in logged)
  for r in logged:  # the objective: the loss plus the weighted auxiliary loss (summed over layers)
    assert r["train/total_loss"] == pytest.approx(
        r["train/loss"] + 0.5 * r["train/aux_loss/pool_mse"], rel=1e-5
    )
  # Step 1 drops only empty (zero) slots, which the zero-bias projection maps to 0 exactly.
  assert logged[0]["train/aux_loss/pool_mse"] == 0
  assert all(r["train/aux_loss/pool_mse"] > 0 for r in logged[1:])

  resumed = tmp_path / "resumed"  # the straight run's workdir as it was after step 4
  shutil.copytree(straight, resumed)
  for path in (resumed / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > 4:
      shutil.rmtree(path)
  train.train_and_evaluate(config, str(resumed), toy_corpus(), mesh)
  assert _fingerprints(resumed, 6) == _fingerprints(straight, 6)  # params, optimizer, memory

  mcfg = default_config.model_config(config, CORPUS_VOCAB)
  step, params = run_dir.restore_params(str(straight), mcfg, mesh)
  assert step == 6 and "pool_proj" in params["layers"]
  config.eval.update(tgt_len=6, mem_len=12, global_batch=8)
  result = evaluate.Evaluator(config, mcfg, toy_corpus(), mesh).evaluate(params, "valid")
  assert np.isfinite(result["loss_nats"]) and result["loss_nats"] < 2 * np.log(CORPUS_VOCAB)
