"""Training: sharded == single device, accumulation, resume, end to end, errors."""

import json
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from transformer_xl import data, default_config, sharding
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.training import train_state, train_step

from helpers import (
    REPO,
    read_metrics,
    run_main,
    run_steps,
    small_args,
    tiny_config,
    tiny_flags,
    write_ptb_sample,
)

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")


@pytest.fixture(scope="module")
def tokens():
  return np.random.default_rng(0).integers(0, 64, size=8 * 6 * 5 + 8).astype(np.int32)


@pytest.mark.smoke
def test_sharded_step_matches_single_device(tokens):
  assert jax.device_count() == 8
  config = tiny_config()
  mesh1 = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  mesh8 = sharding.make_mesh((4, 2), ("data", "model"))
  losses1, state1 = run_steps(config, mesh1, tokens, 3)
  losses8, state8 = run_steps(config, mesh8, tokens, 3)
  np.testing.assert_allclose(losses8, losses1, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(state8), jax.tree_util.tree_leaves(state1)):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-4, atol=2e-6
    )
  assert losses1[-1] != losses1[0]


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [1, 3])
def test_sharded_step_matches_single_device_for_the_learned_position_types(tokens, attn_type):
  config = tiny_config()
  config.model.attn_type = attn_type
  mesh1 = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  mesh8 = sharding.make_mesh((4, 2), ("data", "model"))
  losses1, state1 = run_steps(config, mesh1, tokens, 2)
  losses8, state8 = run_steps(config, mesh8, tokens, 2)
  np.testing.assert_allclose(losses8, losses1, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(state8), jax.tree_util.tree_leaves(state1)):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-4, atol=2e-6
    )


@pytest.mark.smoke
def test_parameters_and_memory_are_sharded():
  config = tiny_config()
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  model = models.TransformerXL(default_config.model_config(config, 64))
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  layers = shardings.params["layers"]
  assert layers["attn"]["qkv_net"]["kernel"].spec == P(None, None, None, "model", None)
  assert layers["pos_ff"]["ff_1"]["kernel"].spec == P(None, None, "model")
  assert shardings.params["word_emb"]["emb_layers_0"].spec == P("model", None)
  assert shardings.memory.mems_LxBxMxD.spec == P(None, "data", None, None)
  # Adam moments follow their parameters.
  mu = shardings.opt_state[1][0].mu
  assert mu["layers"]["attn"]["qkv_net"]["kernel"].spec == P(None, None, None, "model", None)


def test_gradient_accumulation_equals_full_batch():
  tokens = np.random.default_rng(1).integers(0, 64, size=16 * 6 * 4 + 16).astype(np.int32)
  # Two devices: on 8 simulated ones XLA's CPU collectives aborted this test's worker
  # twice in a row under a loaded full suite (8-device sharding: the tests above).
  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  c1 = tiny_config(global_batch=16, batch_chunk=1)
  c2 = tiny_config(global_batch=16, batch_chunk=2)
  for c in (c1, c2):
    c.model.update(dropout=0.0, dropatt=0.0)
  losses1, state1 = run_steps(c1, mesh, tokens, 3)
  losses2, state2 = run_steps(c2, mesh, tokens, 3)
  np.testing.assert_allclose(losses2, losses1, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(state2), jax.tree_util.tree_leaves(state1)):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-4, atol=2e-6
    )


@pytest.mark.parametrize("attn_type", [0, pytest.param(2, marks=SLOW)])
def test_half_loss_is_the_mean_nll_of_the_last_half_only(attn_type):
  config = tiny_config(global_batch=8, loss_span="half")
  config.model.update(dropout=0.0, dropatt=0.0, attn_type=attn_type, tgt_len=7)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  mcfg = default_config.model_config(config, 64)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  step_fn = train_step.make_train_step(model, tx, mesh, shardings, 1, 7, loss_span="half")
  rng = np.random.default_rng(4)
  batch = {
      "inputs": rng.integers(0, 64, (8, 7)).astype(np.int32),
      "targets": rng.integers(0, 64, (8, 7)).astype(np.int32),
      "weights": np.ones((8, 7), np.float32),
      "reset": np.ones((8,), bool),
  }

  def run(b):
    state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
    params = jax.device_get(state.params)
    state, metrics = step_fn(state, data.to_global_batch(b, sharding.batch_sharding(mesh), 8))
    return params, jax.device_get(state), float(metrics["loss"])

  params, after, loss = run(batch)
  nll, _ = model.apply(
      {"params": params}, batch["inputs"], memory_lib.init_memory(mcfg, 8), batch["targets"]
  )
  assert loss == pytest.approx(float(np.mean(np.asarray(nll)[:, 3:])), rel=1e-5)  # 7 // 2 = 3
  # The first half's targets get no gradient: other targets there, the same update.
  other = dict(batch, targets=batch["targets"].copy())
  other["targets"][:, :3] = (other["targets"][:, :3] + 1) % 64
  _, after2, loss2 = run(other)
  assert loss2 == loss
  for a, b in zip(
      jax.tree_util.tree_leaves(after.params), jax.tree_util.tree_leaves(after2.params)
  ):
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- #
# Through the command line, in fresh processes.


@pytest.mark.slow
def test_resume_in_new_process_equals_straight_run(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  tiny = tiny_flags(checkpoint__every_steps=3)
  straight = tmp_path / "straight"
  r = run_main(small_args(tmp_path, straight, manual, *tiny, "--config.train.num_steps=6"))
  assert r.returncode == 0, r.stderr[-3000:]
  resumed = tmp_path / "resumed"
  r = run_main(small_args(tmp_path, resumed, manual, *tiny, "--config.train.num_steps=3"))
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_main(small_args(tmp_path, resumed, manual, *tiny, "--config.train.num_steps=6"))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "Resumed from" in r.stdout + r.stderr and "at step 3" in r.stdout + r.stderr

  m_straight, m_resumed = read_metrics(straight), read_metrics(resumed)
  assert sorted(m_resumed) == sorted(m_straight) == [1, 2, 3, 4, 5, 6]
  for step in range(1, 7):
    assert m_resumed[step]["train/loss"] == pytest.approx(m_straight[step]["train/loss"], rel=1e-6)

  ckpt = ocp.StandardCheckpointer()
  a = ckpt.restore(straight / "checkpoints" / "6" / "state")
  b = ckpt.restore(resumed / "checkpoints" / "6" / "state")
  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(leaves_a) == len(leaves_b) > 10
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
  # The saved iterator positions agree too (step 6 of epoch 0).
  it_a = json.loads((straight / "checkpoints" / "6" / "iterator" / "metadata").read_text())
  it_b = json.loads((resumed / "checkpoints" / "6" / "iterator" / "metadata").read_text())
  assert it_a == it_b and (it_a["epoch"], it_a["step"]) == (0, 6)


@pytest.mark.slow
def test_main_trains_quickstart_and_evaluates(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  r = run_main(
      small_args(
          tmp_path,
          workdir,
          manual,
          "--config.train.num_steps=40",
          "--config.train.log_every=10",
          "--config.train.warmup_steps=5",
          "--config.train.eval_every=40",
          "--config.train.eval_max_steps=2",
      )
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "parameters" in r.stdout
  metrics = read_metrics(workdir)
  assert sorted(metrics) == [10, 20, 30, 40]
  assert metrics[40]["train/loss"] < metrics[10]["train/loss"] - 0.5, metrics
  assert any(n.startswith("events.out.tfevents") for n in os.listdir(workdir / "tensorboard"))

  r = run_main(small_args(tmp_path, workdir, manual, "--mode=eval"))
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  corpus = data.load_corpus(
      "ptb", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False
  )
  for split in ("valid", "test"):
    assert results[split]["tokens"] == corpus.splits[split].num_tokens
    assert results[split]["ppl"] == pytest.approx(np.exp(results[split]["loss_nats"]))
    # Much better than uniform over the vocabulary: the model learnt something.
    assert results[split]["ppl"] < 0.5 * corpus.vocab_size


def test_missing_enwik8_stops_at_once_with_instructions(tmp_path):
  t0 = time.time()
  r = run_main(
      [
          f"--config={REPO / 'configs' / 'enwik8_24l.py'}",
          f"--workdir={tmp_path / 'wd'}",
          f"--config.data.data_dir={tmp_path / 'tfds'}",
      ],
      timeout=120,
  )
  assert r.returncode != 0
  err = r.stderr
  assert "enwik8.zip" in err and "a1fa5ffddb56f4953e226637dabbb36a" in err
  assert str(tmp_path / "tfds" / "downloads" / "manual") in err
  assert "Traceback" not in err
  assert time.time() - t0 < 60
  assert not (tmp_path / "wd" / "checkpoints").exists()


def test_unknown_config_key_is_a_clear_error(tmp_path):
  r = run_main(
      [
          f"--config={REPO / 'configs' / 'quickstart.py'}",
          f"--workdir={tmp_path}",
          "--config.model.n_layerz=3",
      ],
      timeout=120,
  )
  assert r.returncode != 0
  assert "unknown config key" in r.stderr and "n_layer" in r.stderr
  assert "Traceback" not in r.stderr
