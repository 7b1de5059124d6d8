"""The run directory: ``RunDir`` (what training restores and saves) and
``restore_params`` (what every reader uses: parameters only, verified)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_xl import default_config, errors, sharding
from transformer_xl.model import models
from transformer_xl.run import checkpointing, param_shapes, run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import train_state

from helpers import tiny_model_config

VOCAB = 40


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


def small():
  return tiny_model_config(n_token=VOCAB)


def save_state(workdir, state, step, mcfg):
  """``state`` as checkpoint ``step`` (its step set to it: a checkpoint whose
  state names another step is refused when read)."""
  meta = wd.checkpoint_meta(mcfg, "word", "toy", 4)
  with run_dir.RunDir(str(workdir), meta, max_to_keep=5) as rd:
    rd.start(None, default_config.get_config(), mcfg)
    rd.save(step, state.replace(step=jnp.asarray(step, jnp.int32)), {"epoch": 0, "step": step})


def trained_state(mesh, tx, mcfg, global_batch=4):
  model = models.TransformerXL(mcfg)
  state = train_state.create_train_state(model, tx, global_batch, mesh, jax.random.PRNGKey(3))
  # Moments that are not zero, so that a restore that mixed them up would show.
  return state.replace(
      step=jnp.asarray(7, jnp.int32),
      opt_state=jax.tree_util.tree_map(
          lambda x: x + 0.5 if x.dtype == jnp.float32 else x, state.opt_state
      ),
  )


@pytest.mark.smoke
def test_restore_params_reads_parameters_only_whatever_the_optimizer(tmp_path, mesh):
  """A checkpoint saved with an optimizer state the reader could not build
  (plain SGD with momentum, and a memory of 3 rows) gives its parameters and
  step, equal to what was saved; the full state restores as well."""
  mcfg = small()
  tx = optax.sgd(0.1, momentum=0.9)
  state = trained_state(mesh, tx, mcfg, global_batch=3)
  save_state(tmp_path, state, 7, mcfg)
  step, params = run_dir.restore_params(str(tmp_path), mcfg, mesh)
  assert step == 7
  got, want = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(state.params)
  assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
  # Each parameter lands with the sharding the model asks for.
  shardings = jax.tree_util.tree_leaves(
      param_shapes.abstract_params(models.TransformerXL(mcfg), mesh)[1]
  )
  assert [x.sharding for x in got] == shardings


def _edit_record(workdir, step, which):
  path = workdir / "checkpoints" / str(step) / "integrity" / "metadata"
  record = json.loads(path.read_text())
  key = next(k for k in sorted(record["leaves"]) if k.startswith(which))
  record["leaves"][key]["fingerprint"] ^= 1
  path.write_text(json.dumps(record))
  return key


def test_restore_params_verifies_what_it_reads(tmp_path, mesh, caplog):
  """A parameter whose fingerprint does not match makes the checkpoint
  unusable for a reader (the previous one is used, reported); a mismatch in
  the optimizer state, which a reader does not read, does not, while a
  training's full restore refuses it."""
  caplog.set_level("INFO")
  mcfg = small()
  tx = train_state.make_optimizer(default_config.get_config().train)
  state = trained_state(mesh, tx, mcfg)
  save_state(tmp_path, state, 2, mcfg)
  save_state(tmp_path, state.replace(step=jnp.asarray(4, jnp.int32)), 4, mcfg)
  key = _edit_record(tmp_path, 4, ".params")
  step, _ = run_dir.restore_params(str(tmp_path), mcfg, mesh)
  assert step == 2
  assert f"Checkpoint {tmp_path / 'checkpoints' / '4'} is not usable" in caplog.text
  assert "fingerprint mismatch" in caplog.text and key in caplog.text

  other = tmp_path / "other"
  save_state(other, state, 2, mcfg)
  _edit_record(other, 2, ".opt_state")
  assert run_dir.restore_params(str(other), mcfg, mesh)[0] == 2
  abstract = train_state.abstract_train_state(models.TransformerXL(mcfg), tx, 4, mesh)[0]
  manager = checkpointing.make_manager(str(other), create=False)
  with pytest.raises(errors.CheckpointError, match="fingerprint mismatch"):
    checkpointing.restore_latest(manager, abstract)
  manager.close()


def test_restore_params_refuses_another_model_and_an_empty_workdir(tmp_path, mesh):
  mcfg = small()
  tx = train_state.make_optimizer(default_config.get_config().train)
  save_state(tmp_path, trained_state(mesh, tx, mcfg), 2, mcfg)
  wider = dataclasses.replace(mcfg, d_inner=64)
  with pytest.raises(errors.ConfigError, match="model.d_inner=32; this run asks for 64"):
    run_dir.restore_params(str(tmp_path), wider, mesh)
  with pytest.raises(FileNotFoundError, match="No checkpoint in"):
    run_dir.restore_params(str(tmp_path / "empty"), mcfg, mesh)


def test_run_dir_sets_aside_what_restore_rejected_and_keeps_the_newest_good(tmp_path, mesh, caplog):
  """restore() changes nothing; start() moves the damaged checkpoint aside and
  opens the verification record; save() rotates but keeps the newest good
  checkpoint."""
  caplog.set_level("INFO")
  mcfg = small()
  tx = train_state.make_optimizer(default_config.get_config().train)
  state = trained_state(mesh, tx, mcfg)
  for step in (2, 4):
    save_state(tmp_path, state.replace(step=jnp.asarray(step, jnp.int32)), step, mcfg)
  _edit_record(tmp_path, 4, ".params")
  abstract = train_state.abstract_train_state(models.TransformerXL(mcfg), tx, 4, mesh)[0]
  meta = wd.checkpoint_meta(mcfg, "word", "toy", 4)
  with run_dir.RunDir(str(tmp_path), meta, max_to_keep=1) as rd:
    restored = rd.restore(abstract)
    assert restored.step == 2 and (tmp_path / "checkpoints" / "4").is_dir()  # nothing moved yet
    rd.start(restored, default_config.get_config(), mcfg)
    assert (tmp_path / "checkpoints_rejected" / "4" / "reason.txt").exists()
    assert f"Resumed from {tmp_path / 'checkpoints' / '2'} at step 2." in caplog.text
    assert json.loads((tmp_path / "model_config.json").read_text())["unit"] == "word"
    # Step 2 is good (the run resumed from it, nothing says otherwise) and stays.
    rd.verification.params_good(2)
    for step in (6, 8):
      rd.save(step, restored.state.replace(step=jnp.asarray(step, jnp.int32)), {})
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "8"]
