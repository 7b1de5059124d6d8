"""A run never loses good state, and bad input never gets a traceback.

In-process runs of ``train.train_and_evaluate`` on a toy corpus (one
device, a tiny model, one clean run shared by the module) cover the
non-finite policies, checkpoint verification and fallback; command-line
runs (``python -m transformer_xl.main`` over a small PTB sample, one trained
workdir shared by the module) cover the messages a user sees.
"""

import asyncio
import dataclasses
import errno
import gc
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import process_settings, user_errors
from transformer_xl.model import models
from transformer_xl.run import checkpointing, fingerprints, metrics, retention, run_dir
from transformer_xl.training import train_state, train_step
from transformer_xl.util import report

from helpers import (
    REPO,
    TOY_STEPS,
    TOY_VOCAB,
    damage_checkpoint,
    read_metrics,
    run_main,
    small_args,
    start_main,
    tiny_flags,
    tiny_model_config,
    toy_config,
    toy_corpus,
    train_toy,
    write_ptb_sample,
)

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """JAX's persistent compilation cache for this module's runs, in-process and
  in subprocesses: the same tiny train step is compiled by many runs here."""
  directory = str(tmp_path_factory.mktemp("jax_cache"))
  options = {
      "jax_compilation_cache_dir": directory,
      "jax_persistent_cache_min_compile_time_secs": 0,
      "jax_persistent_cache_min_entry_size_bytes": 0,
  }
  saved = {k: getattr(jax.config, k) for k in options}
  saved_env = {k.upper(): os.environ.get(k.upper()) for k in options}
  for k, v in options.items():
    jax.config.update(k, v)
    os.environ[k.upper()] = str(v)
  yield
  for k, v in saved.items():
    jax.config.update(k, v)
  for k, v in saved_env.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


class Poisoned:
  """A training iterator whose batches of the given (1-based) steps have NaN
  weights: their loss and gradients are NaN."""

  def __init__(self, it, steps):
    self._it, self._steps = it, set(steps)

  def __next__(self):
    s = self._it.get_state()
    step = s["epoch"] * self._it.steps_per_epoch + s["step"] + 1
    batch = next(self._it)
    if step in self._steps:
      batch = dict(batch, weights=np.full_like(batch["weights"], np.nan))
    return batch

  def get_state(self):
    return self._it.get_state()

  def set_state(self, state):
    self._it.set_state(state)


def poison(monkeypatch, steps):
  make = data.make_train_iterator
  monkeypatch.setattr(data, "make_train_iterator", lambda *a, **k: Poisoned(make(*a, **k), steps))


@pytest.fixture(scope="module")
def clean(tmp_path_factory, mesh):
  """A clean run of TOY_STEPS steps with a checkpoint every 2 steps (all kept)."""
  workdir = tmp_path_factory.mktemp("clean")
  train_toy(workdir, mesh)
  return workdir


def records(workdir):
  """{step: fingerprints} of every checkpoint in a workdir."""
  out = {}
  for path in (Path(workdir) / "checkpoints").iterdir():
    if path.name.isdigit():
      rec = json.loads((path / "integrity" / "metadata").read_text())
      out[int(path.name)] = {k: v["fingerprint"] for k, v in rec["leaves"].items()}
  return out


def copy_upto(src, dst, last_step):
  """A copy of a workdir without its checkpoints after last_step."""
  shutil.copytree(src, dst)
  for path in (Path(dst) / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > last_step:
      shutil.rmtree(path)
  return dst


def abstract_state(config, mesh):
  mcfg = default_config.model_config(config, TOY_VOCAB)
  return train_state.abstract_train_state(
      models.TransformerXL(mcfg),
      train_state.make_optimizer(config.train),
      config.train.global_batch,
      mesh,
  )[0]


# --------------------------------------------------------------------------- #
# Fingerprints and strict JSON.


@pytest.mark.smoke
def test_fingerprint_sees_one_and_two_bit_flips_and_ignores_placement():
  x = np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32)
  base = fingerprints.fingerprint({"x": jnp.asarray(x)})[0]["['x']"]
  bits = x.view(np.uint32).copy()
  bits[3, 5] ^= 1 << 7
  one = fingerprints.fingerprint({"x": jnp.asarray(bits.view(np.float32))})[0]["['x']"]
  # The same bit in a second element: an xor of the bit patterns cancels
  # (equal bits), or a sum does (opposite bits).
  bits[40, 1] ^= 1 << 7
  two = fingerprints.fingerprint({"x": jnp.asarray(bits.view(np.float32))})[0]["['x']"]
  assert len({base, one, two}) == 3
  # Moving two elements (the same bits, other places) changes it too.
  swapped = x.copy()
  swapped[[0, 1]] = swapped[[1, 0]]
  assert fingerprints.fingerprint({"x": jnp.asarray(swapped)})[0]["['x']"] != base
  # The same values sharded over 8 devices give the same fingerprint.
  mesh8 = sharding.make_mesh((4, 2), ("data", "model"))
  spread = jax.device_put(
      x, jax.sharding.NamedSharding(mesh8, jax.sharding.PartitionSpec("data", "model"))
  )
  assert fingerprints.fingerprint({"x": spread})[0]["['x']"] == base
  fps, finite = fingerprints.fingerprint(
      {
          "x": jnp.asarray(x),
          "y": jnp.asarray([1.0, np.inf]),
          "n": jnp.asarray([1, 2], jnp.int32),
          "h": jnp.asarray(x, jnp.bfloat16),
      }
  )
  assert finite == {"['h']": True, "['n']": True, "['x']": True, "['y']": False}


def test_a_full_restore_refuses_arrays_that_do_not_match_their_fingerprints(tmp_path):
  """Fast (a tiny state, no model, no training): a checkpoint whose arrays
  are not the recorded ones (one element of one array changed), or whose
  record's fingerprint of one array was changed, is refused by a full
  restore naming that array; an intact one restores, verified."""
  state = {
      "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
      "b": jnp.ones(4, jnp.float32),
      "n": jnp.asarray(3, jnp.int32),
  }
  manager = checkpointing.make_manager(str(tmp_path))
  checkpointing.save(manager, 1, state, {"step": 1})
  checkpointing.save(manager, 2, dict(state, w=state["w"].at[1, 2].add(1.0)), {"step": 2})
  checkpointing.save(manager, 3, state, {"step": 3})
  ckpt = tmp_path / "checkpoints"
  # Step 2: the arrays of step 1 under step 2's record ('w' differs in one element).
  shutil.rmtree(ckpt / "2" / "state")
  shutil.copytree(ckpt / "1" / "state", ckpt / "2" / "state")
  # Step 3: its arrays as written, its record's fingerprint of 'b' changed.
  path = ckpt / "3" / "integrity" / "metadata"
  record = json.loads(path.read_text())
  record["leaves"]["['b']"]["fingerprint"] ^= 1
  path.write_text(json.dumps(record))
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
  )
  good = checkpointing.restore(manager, 1, abstract)
  assert good.verified and all(np.array_equal(good.state[k], state[k]) for k in state)
  for step, leaf in ((2, "['w']"), (3, "['b']")):
    with pytest.raises(checkpointing.CheckpointError, match="fingerprint mismatch") as err:
      checkpointing.restore(manager, step, abstract)
    others = [k for k in ("['w']", "['b']", "['n']") if k != leaf]
    assert leaf in str(err.value) and not any(k in str(err.value) for k in others), step
  manager.close()


def test_strict_json_replaces_non_finite_values_and_says_so():
  out = metrics.strict_json(
      {"a": 1.0, "b": float("nan"), "c": {"d": float("inf"), "e": 2}, "f": np.float32(3.5)}
  )
  assert out == {"a": 1.0, "b": None, "c": {"d": None, "e": 2}, "f": 3.5, "nonfinite": ["b", "c.d"]}
  text = metrics.dumps({"loss": float("-inf")})
  assert json.loads(text) == {"loss": None, "nonfinite": ["loss"]}
  assert "Infinity" not in text and "NaN" not in text


def test_bits_per_byte_is_the_split_loss_in_bits_over_its_utf8_bytes(tmp_path):
  """``corpus_level`` against the definition worked out by hand: mean loss
  (nats) x tokens / (UTF-8 bytes x ln 2), on a word corpus (tokens and bytes
  differ; multi-byte characters) with a document per line."""
  from transformer_xl.data import text_builder
  from transformer_xl.data.text_settings import TextSettings

  (tmp_path / "train.txt").write_text("der Hund und die Katze\nGrüße aus Köln\n", "utf-8")
  valid = "Grüße  aus   Köln\nein Hund ü\nund\n"
  (tmp_path / "valid.txt").write_text(valid, "utf-8")
  corpus = text_builder.load_text_corpus(
      TextSettings(
          train_files=f"{tmp_path}/train.txt",
          valid_files=f"{tmp_path}/valid.txt",
          test_files=f"{tmp_path}/valid.txt",
          allow_split_overlap=True,
          tokenizer="word",
          document_separator="line",
      ),
      data_dir=tmp_path / "tfds",
  )
  lines = valid.splitlines()
  tokens = sum(len(line.split()) + 1 for line in lines)  # 3 + 3 + 1 words, an <eos> each
  num_bytes = sum(len(line.encode("utf-8")) + 1 for line in lines)  # 21 + 12 + 4
  assert (tokens, num_bytes) == (10, 37)
  assert corpus.splits["valid"].num_tokens == tokens and corpus.num_bytes["valid"] == num_bytes
  loss = 2.75
  out = metrics.corpus_level(loss, tokens, corpus, "valid")
  assert out["bits_per_byte"] == pytest.approx(loss * tokens / (num_bytes * math.log(2)), rel=1e-9)
  assert out["documents"] == len(lines)
  assert metrics.corpus_level(loss, tokens - 1, corpus, "valid") == {}  # not the whole split


# --------------------------------------------------------------------------- #
# The non-finite guard.


@pytest.mark.slow
def test_a_non_finite_step_changes_nothing(mesh):
  """NaN weights in one batch: its loss and gradients are NaN; parameters,
  optimizer state and memory after that step equal those before it; the
  next good step trains again."""
  config = toy_config()
  mcfg = default_config.model_config(config, TOY_VOCAB)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
  step_fn = train_step.make_train_step(model, tx, mesh, shardings, 1, 7)
  it = Poisoned(data.make_train_iterator(toy_corpus(), "train", 8, mcfg.tgt_len, seed=0), {3})
  snapshots, flags = [], []
  for _ in range(4):
    batch = data.to_global_batch(next(it), sharding.batch_sharding(mesh), 8)
    snapshots.append(jax.device_get(state))
    state, m = step_fn(state, batch)
    flags.append(bool(m["finite"]))
  after = jax.device_get(state)
  assert flags == [True, True, False, True]
  before_3, after_3 = snapshots[2], snapshots[3]
  assert int(after_3.step) == int(before_3.step) + 1
  for name in ("params", "opt_state", "memory"):
    for a, b in zip(
        jax.tree_util.tree_leaves(getattr(before_3, name)),
        jax.tree_util.tree_leaves(getattr(after_3, name)),
    ):
      np.testing.assert_array_equal(a, b, err_msg=name)
  assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(after.params))
  assert not np.allclose(
      jax.tree_util.tree_leaves(after.params)[0], jax.tree_util.tree_leaves(after_3.params)[0]
  )


def test_a_divergence_right_after_a_resume_keeps_the_checkpoint_resumed_from(
    tmp_path, mesh, monkeypatch, clean
):
  """Resumed from checkpoint 4, every later step diverges: no step of this run
  was finite, yet checkpoint 4 is the good one the run started from (the
  previous run verified it); it and 2 stay where they are and are named."""
  workdir = tmp_path / "w"
  copy_upto(clean, workdir, 4)
  poison(monkeypatch, set(range(5, 20)))
  with pytest.raises(metrics.NonFiniteError) as err:
    train_toy(workdir, mesh)
  message = str(err.value)
  assert "step 5:" in message, message
  assert f"The last good checkpoint is {workdir / 'checkpoints' / '4'} (step 4)" in message
  assert records(workdir) == {s: records(clean)[s] for s in (2, 4)}
  assert not (workdir / "checkpoints_rejected").exists()


@pytest.mark.parametrize("poisoned,good,moved", [({7}, 6, None), ({7, 8}, 4, 6)])
def test_stop_names_the_newest_verified_checkpoint_and_sets_aside_the_rest(
    tmp_path, mesh, monkeypatch, clean, poisoned, good, moved
):
  """train.nonfinite=stop, checkpoints every 2 steps, two kept, steps checked
  at step 5 and before saving step 8.  Step 7 alone diverges: step 8,
  computed from checkpoint 6's parameters (step 7 was not applied), is
  finite, so 6 is the good one and both 4 and 6 stay.  Steps 7 and 8 both
  diverge: no finite step came from checkpoint 6, so it is moved to
  checkpoints_rejected/ with its reason (not deleted) and 4 is named.
  Whatever remains equals the clean run's and restores verified."""
  poison(monkeypatch, poisoned)
  config = toy_config(log_every=5)
  config.checkpoint.max_to_keep = 2
  with pytest.raises(metrics.NonFiniteError) as err:
    train_toy(tmp_path, mesh, config)
  message = str(err.value)
  assert "step 7:" in message and "loss is nan" in message and "learning_rate" in message
  assert (
      f"The last good checkpoint is {tmp_path / 'checkpoints' / str(good)} (step {good})" in message
  )
  assert json.loads((tmp_path / "checkpoints_verified.json").read_text()) == {"step": good}
  kept = {4, 6} - {moved}
  assert records(tmp_path) == {s: records(clean)[s] for s in kept}
  if moved is None:
    assert "moved" not in message and not (tmp_path / "checkpoints_rejected").exists()
  else:
    assert f"were moved to {tmp_path / 'checkpoints_rejected'}" in message
    rejected = tmp_path / "checkpoints_rejected" / str(moved)
    assert "a step computed from it was not finite" in (rejected / "reason.txt").read_text()
    integrity = lambda d: json.loads((d / "integrity" / "metadata").read_text())["leaves"]
    assert integrity(rejected) == integrity(clean / "checkpoints" / str(moved))
  manager = checkpointing.make_manager(str(tmp_path))
  for step in kept:
    restored = checkpointing.restore(manager, step, abstract_state(config, mesh))
    assert restored.verified and int(restored.state.step) == step
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [5]  # the interval with step 7 was never logged


@pytest.mark.slow
def test_skip_goes_on_and_stops_after_max_skipped_in_a_row(tmp_path, mesh, monkeypatch, clean):
  poison(monkeypatch, {5, 9})
  config = toy_config(nonfinite="skip", max_skipped_steps=2)
  last = train_toy(tmp_path / "two", mesh, config)
  assert np.isfinite(last["loss"])
  rows = read_metrics(tmp_path / "two")
  assert sorted(rows) == list(range(1, TOY_STEPS + 1))
  assert [s for s, r in rows.items() if r["train/skipped_steps"]] == [5, 9]
  assert rows[5]["train/loss"] is None and rows[5]["nonfinite"] == [
      "train/loss",
      "train/ppl",
      "train/grad_norm",
  ]
  # Before the first skipped step the run equals the clean one.
  assert records(tmp_path / "two")[4] == records(clean)[4]
  assert set(records(tmp_path / "two")) == set(range(2, TOY_STEPS + 1, 2))

  monkeypatch.undo()
  poison(monkeypatch, {5, 6})
  with pytest.raises(metrics.NonFiniteError, match="steps 5 to 6: 2 steps in a row"):
    train_toy(tmp_path / "row", mesh, config)
  # Both steps computed from checkpoint 4 failed: it is set aside, 2 is the good one.
  assert set(records(tmp_path / "row")) == {2}
  assert (tmp_path / "row" / "checkpoints_rejected" / "4" / "reason.txt").exists()


# --------------------------------------------------------------------------- #
# Damaged checkpoints.


@pytest.fixture(scope="module")
def resumed_from_4(tmp_path_factory, mesh, clean):
  """The reference: a run resumed from checkpoint 4 directly."""
  workdir = copy_upto(clean, tmp_path_factory.mktemp("from4") / "wd", 4)
  train_toy(workdir, mesh)
  return workdir


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("xor_400_bytes", marks=SLOW),
        pytest.param("two_bit_flips", marks=SLOW),
        pytest.param("truncated", marks=SLOW),
        "data_file_deleted",
        pytest.param("metadata_deleted", marks=SLOW),
        pytest.param("other_arrays", marks=SLOW),
        pytest.param("record_damaged", marks=SLOW),
        "record_deleted",
    ],
)
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(
    tmp_path, mesh, clean, resumed_from_4, kind, reports
):
  workdir = copy_upto(clean, tmp_path / "wd", 6)
  step6 = workdir / "checkpoints" / "6"
  damage_checkpoint(step6, kind, workdir / "checkpoints" / "4")
  train_toy(workdir, mesh)
  out = reports.text
  assert f"Checkpoint {step6} is not usable" in out, out
  assert f"Resumed from {workdir / 'checkpoints' / '4'} at step 4." in out
  assert (workdir / "checkpoints_rejected" / "6").is_dir() and "Moved the checkpoint" in out
  reason = (workdir / "checkpoints_rejected" / "6" / "reason.txt").read_text()
  assert reason and reason.strip() in out
  # The same losses and final state as a run resumed from checkpoint 4 directly.
  got, want = read_metrics(workdir), read_metrics(resumed_from_4)
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  steps = [json.loads(line)["step"] for line in lines]
  assert steps == list(range(1, TOY_STEPS + 1))  # the redone steps 5 and 6 are not repeated
  for step in range(5, TOY_STEPS + 1):
    assert got[step]["train/loss"] == pytest.approx(want[step]["train/loss"], rel=1e-6), step
  assert records(workdir)[TOY_STEPS] == records(resumed_from_4)[TOY_STEPS]


def test_reasons_are_named_and_no_usable_checkpoint_is_an_error(tmp_path, mesh, clean, reports):
  workdir = copy_upto(clean, tmp_path / "wd", 4)
  damage_checkpoint(workdir / "checkpoints" / "4", "other_arrays", workdir / "checkpoints" / "2")
  damage_checkpoint(workdir / "checkpoints" / "2", "data_file_deleted", None)
  manager = checkpointing.make_manager(str(workdir))
  with pytest.raises(checkpointing.CheckpointError) as err:
    checkpointing.restore_latest(manager, abstract_state(toy_config(), mesh))
  logged = reports.lines
  message = str(err.value)
  for step in (2, 4):
    assert str(workdir / "checkpoints" / str(step)) in message
  assert "fingerprint mismatch in" in message and "cannot be read" in message
  assert "Nothing was changed" in message and " mv " not in message  # nothing to discard
  assert len(logged) == 2 and "Trying the previous one" in logged[0]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]


@pytest.mark.smoke
def test_partial_writes_are_removed_at_start(tmp_path, mesh, clean, reports):
  workdir = copy_upto(clean, tmp_path / "wd", 10)
  leftover = workdir / "checkpoints" / "12.orbax-checkpoint-tmp-1234"
  shutil.copytree(clean / "checkpoints" / "12", leftover)
  train_toy(workdir, mesh)
  out = reports.text
  assert f"Removed {leftover}" in out and not leftover.exists()
  assert records(workdir)[12] == records(clean)[12]


def abandon_a_failed_task(exc: BaseException) -> None:
  """What orbax does when one array's write fails: the other write tasks
  fail too and are dropped unretrieved with their event loop, so asyncio
  logs "Task exception was never retrieved" (a traceback) when they are
  garbage collected."""

  async def write():
    raise exc

  loop = asyncio.new_event_loop()
  task = loop.create_task(write())
  loop.run_until_complete(asyncio.sleep(0))
  loop.close()
  del task
  gc.collect()


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, mesh, clean, monkeypatch, caplog):
  """The writer raising ENOSPC (as on a full disk): one message with the path,
  the space needed and the intact previous checkpoint, which then resumes;
  no traceback logged for the write tasks orbax abandons."""
  workdir = copy_upto(clean, tmp_path / "wd", 4)
  real_save = checkpointing.ocp.CheckpointManager.save
  for name in ("absl", "asyncio"):  # undone with monkeypatch: other tests see no filters
    monkeypatch.setattr(logging.getLogger(name), "filters", list(logging.getLogger(name).filters))
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  logging.getLogger("asyncio").setLevel(logging.NOTSET)  # as in a fresh process
  process_settings.configure_logging(debug=False)  # as the command line does

  def full_disk(self, step, *args, **kwargs):
    if step >= 6:
      (self.directory / f"{step}.orbax-checkpoint-tmp-1").mkdir()  # a partial write
      abandon_a_failed_task(OSError(errno.ENOSPC, "No space left on device"))
      raise OSError(errno.ENOSPC, "No space left on device")
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpointing.ocp.CheckpointManager, "save", full_disk)
  with caplog.at_level(logging.DEBUG), pytest.raises(checkpointing.CheckpointError) as err:
    train_toy(workdir, mesh)
  assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
  message = str(err.value)
  assert f"Could not write checkpoint {workdir / 'checkpoints' / '6'}" in message
  assert "no space left" in message and "MiB" in message
  assert f"previous checkpoint {workdir / 'checkpoints' / '4'} is intact" in message
  assert not list((workdir / "checkpoints").glob("*tmp*"))
  monkeypatch.undo()
  assert records(workdir) == {s: records(clean)[s] for s in (2, 4)}
  manager = checkpointing.make_manager(str(workdir))
  assert checkpointing.restore_latest(manager, abstract_state(toy_config(), mesh)).step == 4


# --------------------------------------------------------------------------- #
# Out of memory.


def test_an_allocation_xla_cannot_make_is_one_line_naming_its_size_and_the_settings():
  """XLA's failed allocation (1 TiB here: refused at once, nothing touched)
  was a JaxRuntimeError traceback; ``report`` makes it one line."""
  with pytest.raises(SystemExit) as exit_info:
    with user_errors.report(debug=False):
      jax.jit(lambda: jnp.ones((2**38,), jnp.float32))().block_until_ready()
  line = str(exit_info.value.code)
  assert line.startswith("error: out of memory on the cpu device (it asked for 1,024.00 GiB)")
  assert "train.global_batch" in line and "eval.mem_len" in line and "\n" not in line, line
  with pytest.raises(jax.errors.JaxRuntimeError):  # --debug: the traceback
    with user_errors.report(debug=True):
      jax.jit(lambda: jnp.ones((2**38,), jnp.float32))().block_until_ready()
  with pytest.raises(jax.errors.JaxRuntimeError):  # another runtime error stays a bug's traceback
    with user_errors.report(debug=False):
      raise jax.errors.JaxRuntimeError("INTERNAL: something else")


def test_an_evaluation_too_large_for_memory_is_one_line_and_changes_no_file(tmp_path):
  """``--mode=eval`` of a trained workdir (tests/fixtures) with a memory of
  2**34 slots: one line from the command line, the workdir as it was."""
  workdir = tmp_path / "w"
  shutil.copytree(Path(__file__).parent / "fixtures" / "legacy_workdirs" / "compressive", workdir)
  before = file_hashes(workdir)
  r = run_main([f"--workdir={workdir}", "--mode=eval", f"--config.eval.mem_len={2**34}"], devices=1)
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  line = r.stderr.strip().splitlines()[-1]
  assert line.startswith("error: out of memory on the cpu device (it asked for "), line
  assert file_hashes(workdir) == before


# --------------------------------------------------------------------------- #
# Through the command line.

TINY = tiny_flags(checkpoint__every_steps=2, eval__global_batch=8)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
  """A workdir trained for 4 steps by the command line (checkpoints 2, 4)."""
  root = tmp_path_factory.mktemp("cli")
  manual = write_ptb_sample(root / "ptb")
  workdir = root / "wd"
  args = small_args(root, workdir, manual, *TINY, "--config.train.num_steps=4")
  r = run_main(args)
  assert r.returncode == 0, r.stderr[-3000:]
  return root, manual, workdir, args


def file_hashes(directory):
  return {
      str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
      for p in Path(directory).rglob("*")
      if p.is_file()
  }


@pytest.mark.slow
def test_a_different_model_over_a_trained_workdir_changes_nothing(cli, tmp_path):
  root, manual, workdir, args = cli
  copy = tmp_path / "wd"
  shutil.copytree(workdir, copy)
  before = file_hashes(copy)
  r = run_main(
      [a.replace(str(workdir), str(copy)) for a in args]
      + ["--config.model.d_model=64", "--config.model.n_head=4", "--config.train.num_steps=6"]
  )
  assert r.returncode == 1
  assert "Traceback" not in r.stderr
  assert "the workdir was trained with model.d_model=32; this run asks for 64" in r.stderr
  assert "the workdir was trained with model.n_head=2; this run asks for 4" in r.stderr
  assert "model.d_head" not in r.stderr  # only the differing keys
  assert "Nothing in the workdir was changed" in r.stderr
  assert file_hashes(copy) == before


def _ro_workdir(tmp_path):
  """A read-only directory: a read-only tmpfs as root, chmod otherwise (None: neither)."""
  path = tmp_path / "ro"
  path.mkdir()
  if os.geteuid() == 0:
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], capture_output=True
    )
    return path if r.returncode == 0 else None
  path.chmod(0o555)
  return path


def _cases(root, manual, workdir, tmp):
  """(name, argv, expected substrings of stderr) of each bad input."""
  np.save(tmp / "ids_out_of_range.npy", np.array([[1, 2, 10**6]]))
  np.save(tmp / "floats.npy", np.ones((2, 5), np.float32))
  np.save(tmp / "one_d.npy", np.arange(5))
  np.save(tmp / "empty.npy", np.zeros((0, 5), np.int64))
  (tmp / "not_npy.npy").write_text("1 2 3\n")
  good = tmp / "good.npy"
  np.save(good, np.ones((1, 5), np.int64))
  score = [f"--workdir={workdir}", "--mode=score", f"--out={tmp / 'nll.npy'}"]
  bad_source = tmp / "bad_ptb"
  shutil.copytree(manual, bad_source)
  text = (bad_source / "ptb.train.txt").read_bytes()
  (bad_source / "ptb.train.txt").write_bytes(text[:300] + b"\xff\xfe" + text[300:])
  damaged = tmp / "tfds_damaged"
  shutil.copytree(root / "tfds", damaged)
  (valid,) = damaged.rglob("*valid.array_record*")
  valid.write_bytes(valid.read_bytes()[: valid.stat().st_size // 2])
  (tmp / "a_file").write_text("")
  (tmp / "syntax.py").write_text("def get_config(:\n  pass\n")
  (tmp / "raises.py").write_text("def get_config():\n  return 1 / 0\n")
  ro = _ro_workdir(tmp)
  quick = f"--config={REPO / 'configs' / 'quickstart.py'}"
  data_flags = [
      f"--config.data.manual_dir={manual}",
      f"--config.data.data_dir={root / 'tfds'}",
      "--config.data.verify_checksums=false",
  ]
  train = [quick, *data_flags, *TINY, "--config.train.num_steps=4"]
  cases = [
      (
          "score ids out of range",
          score + [f"--tokens={tmp / 'ids_out_of_range.npy'}"],
          ["token ids must be in [0, "],
      ),
      (
          "score float array",
          score + [f"--tokens={tmp / 'floats.npy'}"],
          ["floats.npy", "integer array [B, T+1]", "float32 (2, 5)"],
      ),
      ("score 1-D array", score + [f"--tokens={tmp / 'one_d.npy'}"], ["int64 (5,)"]),
      ("score empty array", score + [f"--tokens={tmp / 'empty.npy'}"], ["B >= 1", "(0, 5)"]),
      ("score not .npy", score + [f"--tokens={tmp / 'not_npy.npy'}"], ["is not a .npy array"]),
      (
          "score --out checked first",
          [
              f"--workdir={workdir}",
              "--mode=score",
              f"--tokens={good}",
              f"--out={tmp / 'missing_dir' / 'nll.npy'}",
          ],
          ["missing_dir does not exist"],
      ),
      (
          "non-UTF-8 source, checksums off",
          [
              quick,
              f"--workdir={tmp / 'w1'}",
              f"--config.data.manual_dir={bad_source}",
              f"--config.data.data_dir={tmp / 'tfds1'}",
              "--config.data.verify_checksums=false",
              *TINY,
          ],
          [f"{bad_source / 'ptb.train.txt'} is not UTF-8 text (line ", "byte 0xff"],
      ),
      (
          "checksum error names the flag",
          [
              quick,
              f"--workdir={tmp / 'w2'}",
              f"--config.data.manual_dir={bad_source}",
              f"--config.data.data_dir={tmp / 'tfds2'}",
              *TINY,
          ],
          ["Checksum mismatch for ptb.train.txt", "--config.data.verify_checksums=false"],
      ),
      (
          "damaged prepared dataset",
          [
              quick,
              f"--workdir={workdir}",
              "--mode=eval",
              f"--config.data.manual_dir={manual}",
              f"--config.data.data_dir={damaged}",
              "--config.data.verify_checksums=false",
              *TINY,
          ],
          ["is damaged", "Delete it to rebuild it", str(damaged / "txl_ptb" / "1.0.0")],
      ),
      (
          "workdir is a file",
          [f"--workdir={tmp / 'a_file'}", *train],
          [f"--workdir={tmp / 'a_file'} is a file"],
      ),
      (
          "missing config file",
          [f"--config={tmp / 'nope.py'}", f"--workdir={tmp / 'w3'}"],
          [f"{tmp / 'nope.py'} is not a file", "configs/quickstart.py"],
      ),
      (
          "config syntax error",
          [f"--config={tmp / 'syntax.py'}", f"--workdir={tmp / 'w3'}"],
          [f"syntax error in {tmp / 'syntax.py'}, line 1"],
      ),
      (
          "config that raises",
          [f"--config={tmp / 'raises.py'}", f"--workdir={tmp / 'w3'}"],
          ["failed to build the config: ZeroDivisionError"],
      ),
      (
          "bad flag value",
          [f"--workdir={tmp / 'w3'}", *train, "--config.train.num_steps=abc"],
          ["--config.train.num_steps=abc"],
      ),
      (
          "values that cannot work",
          [
              f"--workdir={tmp / 'w3'}",
              *train,
              "--config.model.dropout=1.5",
              "--config.train.learning_rate=-1",
              "--config.train.warmup_steps=9",
          ],
          [
              "model.dropout=1.5 must be in [0, 1)",
              "train.learning_rate=-1.0 must be > 0",
              "train.warmup_steps=9 must be <= train.num_steps=4",
          ],
      ),
      (
          "eval without a checkpoint",
          [f"--workdir={tmp / 'w3'}", "--mode=eval", *train],
          ["No checkpoint in"],
      ),
  ]
  if ro is not None:
    cases.append(
        ("read-only workdir", [f"--workdir={ro}", *train], [f"--workdir={ro} cannot be written"])
    )
  return cases, ro


@pytest.mark.slow
def test_bad_inputs_get_one_message_and_exit_status_1(cli, tmp_path):
  root, manual, workdir, _ = cli
  before = file_hashes(workdir)
  cases, ro = _cases(root, manual, workdir, tmp_path)
  failures = []
  try:
    for name, argv, expected in cases:
      r = run_main(argv, timeout=240)
      err = r.stderr
      problems = [f"missing {e!r}" for e in expected if e not in err]
      if r.returncode != 1:
        problems.append(f"exit status {r.returncode}")
      if "Traceback" in err:
        problems.append("a traceback")
      if "error: " not in err:
        problems.append("no 'error: ' line")
      if problems:
        failures.append(f"{name}: {', '.join(problems)}\n{err[-1500:]}")
  finally:
    if ro is not None and os.geteuid() == 0:
      subprocess.run(["umount", str(ro)], check=False)
  assert not failures, "\n\n".join(failures)
  assert file_hashes(workdir) == before  # eval and score read the workdir, never write it


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
  (tmp_path / "raises.py").write_text("def get_config():\n  return 1 / 0\n")
  r = run_main(
      [f"--config={tmp_path / 'raises.py'}", f"--workdir={tmp_path / 'w'}", "--debug"], timeout=120
  )
  assert r.returncode == 1 and "Traceback" in r.stderr and "ZeroDivisionError" in r.stderr


@pytest.mark.slow
def test_divergence_from_the_command_line(cli, tmp_path):
  """learning rate 1e30 over a trained workdir: the run stops at the first
  non-finite step, exit status 1, every checkpoint kept, eval still works."""
  root, manual, workdir, args = cli
  copy = tmp_path / "wd"
  shutil.copytree(workdir, copy)
  before = {p: h for p, h in file_hashes(copy).items() if p.startswith("checkpoints/")}
  args = [a.replace(str(workdir), str(copy)) for a in args]
  r = run_main(args + ["--config.train.learning_rate=1e30", "--config.train.num_steps=10"])
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert "error: step 6: the loss is nan" in r.stderr
  assert f"The last good checkpoint is {copy / 'checkpoints' / '4'} (step 4)" in r.stderr
  assert {p: h for p, h in file_hashes(copy).items() if p.startswith("checkpoints/")} == before
  for line in (copy / "metrics.jsonl").read_text().splitlines():
    json.loads(line, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
  r = run_main([f"--workdir={copy}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-2000:]
  results = (copy / "eval_results.json").read_text()
  assert json.loads(results)["step"] == 4 and "NaN" not in results


@pytest.mark.parametrize("name", ["9", "99999999999999999999"])
def test_a_checkpoint_folder_renamed_to_another_step_is_not_used_as_it(cli, tmp_path, name):
  """checkpoints/4 renamed to another step: its state says step 4, so it is
  refused with the reason and the previous checkpoint (2) is used: by eval,
  and by a resumed training (the huge name was a ValueError traceback of
  tensorboardX's purge_step)."""
  root, manual, workdir, args = cli
  copy = tmp_path / "wd"
  shutil.copytree(workdir, copy)
  (copy / "checkpoints" / "4").rename(copy / "checkpoints" / name)
  r = run_main([f"--workdir={copy}", "--mode=eval"])
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert json.loads((copy / "eval_results.json").read_text())["step"] == 2
  out = r.stdout + r.stderr
  assert f"its folder names step {name} but its state is step 4" in out, out[-3000:]
  if name != "9":
    args = [a.replace(str(workdir), str(copy)) for a in args]
    r = run_main(args + ["--config.train.num_steps=6"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"Resumed from {copy / 'checkpoints' / '2'} at step 2." in r.stdout + r.stderr
    assert (copy / "checkpoints" / "6").is_dir() and not (copy / "checkpoints" / name).exists()


@pytest.mark.slow
def test_score_text_reports_unknown_words(cli, tmp_path):
  _, manual, workdir, _ = cli
  text = tmp_path / "text.txt"
  text.write_text(" the cat sat on the zebra \n the giraffe ran \n")
  r = run_main(
      [f"--workdir={workdir}", "--mode=score", f"--text={text}", f"--out={tmp_path / 'nll.npy'}"]
  )
  assert r.returncode == 0, r.stderr[-2000:]
  # the cat sat on the zebra <eos> the giraffe ran <eos>: 11 tokens, 2 unknown.
  assert "11 tokens; 2 unknown word(s) (18.18%)" in r.stdout
  assert np.load(tmp_path / "nll.npy").shape == (1, 11)


@pytest.mark.slow
def test_a_full_disk_stops_with_the_previous_checkpoint_intact(cli, tmp_path):
  """A tmpfs as small as the workdir plus half a checkpoint (root only; the
  patched writer of test_a_failed_write_keeps_the_previous_checkpoint covers
  the rest)."""
  root, manual, workdir, args = cli
  pages = lambda d: sum(
      -(-p.stat().st_size // 4096) * 4096 for p in d.rglob("*") if p.is_file()
  )  # tmpfs holds whole pages
  # Without checkpoint 2, which the rotation could delete while 6 is written (and so
  # make room for it, depending on timing): only 4 is there, and it must stay.
  older = workdir / "checkpoints" / "2"
  size, step_size = pages(workdir) - pages(older), pages(workdir / "checkpoints" / "4")
  disk = tmp_path / "disk"
  disk.mkdir()
  if (
      os.geteuid() != 0
      or subprocess.run(
          [
              "mount",
              "-t",
              "tmpfs",
              "-o",
              f"size={(size + step_size // 2) // 1024 + 8}k",
              "tmpfs",
              str(disk),
          ],
          capture_output=True,
      ).returncode
  ):
    pytest.skip("needs root and mount -t tmpfs")
  try:
    full = disk / "wd"
    shutil.copytree(workdir, full, ignore=lambda d, names: ["2"] if Path(d) == older.parent else [])
    before = file_hashes(full / "checkpoints" / "4")
    run_args = [a.replace(str(workdir), str(full)) for a in args]
    r = run_main(run_args + ["--config.train.num_steps=8"])
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"Could not write checkpoint {full / 'checkpoints' / '6'}: no space left" in r.stderr
    assert f"The previous checkpoint {full / 'checkpoints' / '4'} is intact" in r.stderr
    assert "MiB" in r.stderr
    assert file_hashes(full / "checkpoints" / "4") == before
    assert not [p for p in (full / "checkpoints").iterdir() if "tmp" in p.name]
    moved = tmp_path / "moved"
    shutil.copytree(full, moved)
  finally:
    subprocess.run(["umount", str(disk)], check=False)
  r = run_main([a.replace(str(workdir), str(moved)) for a in args] + ["--config.train.num_steps=8"])
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"Resumed from {moved / 'checkpoints' / '4'} at step 4" in r.stdout


def test_a_checkpoint_with_non_finite_values_is_not_used(tmp_path, mesh, clean, reports):
  """A checkpoint written without a record (an older version) that holds a
  NaN: rejected for it, the previous one is used."""
  workdir = copy_upto(clean, tmp_path / "wd", 4)
  manager = checkpointing.make_manager(str(workdir))
  state = checkpointing.restore(manager, 4, abstract_state(toy_config(), mesh)).state
  params = jax.tree_util.tree_map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan), state.params)
  manager.save(
      6,
      args=checkpointing.ocp.args.Composite(
          state=checkpointing.ocp.args.StandardSave(state.replace(params=params)),
          iterator=checkpointing.ocp.args.JsonSave({}),
      ),
  )
  manager.wait_until_finished()
  restored = checkpointing.restore_latest(manager, abstract_state(toy_config(), mesh))
  logged = reports.lines
  assert restored.step == 4 and restored.verified
  assert "non-finite values in .params[" in logged[0] and "/checkpoints/6" in logged[0]


def test_run_differences_lists_what_a_checkpoint_cannot_take():
  from transformer_xl.run import workdir as wd

  cfg = tiny_model_config(n_token=32)
  saved = wd.checkpoint_meta(cfg, "word", "ptb", 8)
  same = wd.checkpoint_meta(dataclasses.replace(cfg, remat="full"), "word", "ptb", 8)
  assert wd.run_differences(saved, same) == []  # remat only changes how it is computed
  deep, other_depth = (wd.checkpoint_meta(cfg, "word", "ptb", 8, depth) for depth in (2, 1))
  assert wd.run_differences(deep, saved) == []  # a checkpoint or run without a depth
  (line,) = wd.run_differences(deep, other_depth)
  assert line.startswith("the workdir was trained with train.mem_backprop_depth=2; this run ")
  other = wd.checkpoint_meta(
      dataclasses.replace(cfg, d_model=64, cutoffs=(10,)),
      "word",
      "wikitext2",
      16,
  )
  assert wd.run_differences(saved, other) == [
      "the workdir was trained with model.cutoffs=[]; this run asks for [10]",
      "the workdir was trained with model.d_model=16; this run asks for 64",
      "the workdir was trained with data.dataset='ptb'; this run asks for 'wikitext2'",
      "the workdir was trained with train.global_batch=8; this run asks for 16",
  ]
  converted = wd.checkpoint_meta(cfg, "word", "converted", 8)
  assert wd.run_differences(converted, saved) == []
  assert wd.run_differences(saved, {"model": saved["model"]}) == []  # eval: the model only
  # Equivalent spellings of the same model (a converted checkpoint's d_embed=None).
  spelled = dict(saved, model=dict(saved["model"], d_embed=None))
  assert wd.run_differences(spelled, saved) == []
  assert wd.run_differences(dict(saved, model=dict(saved["model"], d_embed=16)), saved) == []


# --------------------------------------------------------------------------- #
# metrics.jsonl after a crash.


@pytest.mark.parametrize("cut", [1, 7, -25, -1])
def test_a_torn_metrics_line_is_moved_aside_and_every_step_stays_once(tmp_path, cut, reports):
  """A run killed while writing row 3 leaves it torn (cut at several byte
  offsets, the last one only without its newline); the resumed run (from
  step 2) moves the torn text to metrics.jsonl.corrupt with a warning,
  keeps steps 1-2, then appends 3-4: strict JSON, each step once."""
  writer = metrics.MetricWriter(str(tmp_path))
  for step in (1, 2, 3):
    writer.write_scalars(step, {"train/loss": 3.0 - 0.1 * step})
  writer.close()
  path = tmp_path / "metrics.jsonl"
  text = path.read_text()
  start = text.index('{"step": 3')
  path.write_text(text[: start + cut] if cut > 0 else text[: len(text) + cut])
  torn = path.read_text()[start:]
  writer = metrics.MetricWriter(str(tmp_path), start_step=2)
  for step in (3, 4):
    writer.write_scalars(step, {"train/loss": 3.0 - 0.1 * step})
  writer.close()
  rows = [
      json.loads(line, parse_constant=lambda c: pytest.fail(c))
      for line in path.read_text().split("\n")[:-1]
  ]
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and path.read_text().endswith("\n")
  assert (tmp_path / "metrics.jsonl.corrupt").read_text() == torn + "\n"
  logged = reports.lines
  assert len(logged) == 1 and "metrics.jsonl.corrupt" in logged[0]


def test_metrics_lines_that_are_not_rows_or_repeat_a_step_are_cleaned(tmp_path):
  """Lines that are not strict-JSON rows go to the side file; a step written
  twice (two runs in one workdir before locks) keeps its last row."""
  path = tmp_path / "metrics.jsonl"
  path.write_text(
      '{"step": 1, "a": 1}\n{"step": 2, "a": NaN}\n[1, 2]\n{"step": 1, "a": 2}\n'
      '{"step": 2, "a": 3}\n'
  )
  metrics.MetricWriter(str(tmp_path), start_step=5).close()
  assert [json.loads(l) for l in path.read_text().splitlines()] == [
      {"step": 1, "a": 2},
      {"step": 2, "a": 3},
  ]
  assert (tmp_path / "metrics.jsonl.corrupt").read_text() == '{"step": 2, "a": NaN}\n[1, 2]\n'


def test_a_resume_keeps_the_training_and_the_validation_row_of_a_step(tmp_path):
  """A step with both a training row and a validation row (every eval_every
  steps) keeps both when a run resumes after it; rows after the restored step
  go, and a repeated row of one kind keeps its last."""
  path = tmp_path / "metrics.jsonl"
  writer = metrics.MetricWriter(str(tmp_path))
  for step in (1, 2, 3):
    writer.write_scalars(step, {"train/loss": 1.0 * step, "train/lr": 0.1})
    if step % 2 == 0 or step == 3:
      writer.write_scalars(step, {"valid/loss_nats": 2.0 * step})
  writer.write_scalars(2, {"train/loss": 9.0, "train/lr": 0.1})
  writer.close()
  metrics.MetricWriter(str(tmp_path), start_step=2).close()
  assert [json.loads(l) for l in path.read_text().splitlines()] == [
      {"step": 1, "train/loss": 1.0, "train/lr": 0.1},
      {"step": 2, "train/loss": 9.0, "train/lr": 0.1},
      {"step": 2, "valid/loss_nats": 4.0},
  ]


# --------------------------------------------------------------------------- #
# One training per workdir; readers beside it.

HOLD_LOCK = """
import sys, time
from transformer_xl.run import lock
with lock.training_lock(sys.argv[1]):
  print("held", flush=True)
  time.sleep(120)
"""


def _hold_lock(directory):
  proc = subprocess.Popen(
      [sys.executable, "-c", HOLD_LOCK, str(directory)],
      cwd=REPO,
      stdout=subprocess.PIPE,
      text=True,
      env=dict(os.environ, PYTHONPATH=str(REPO)),
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def _lock_is_free(path):
  """Whether no process holds the flock on ``path`` (tried, then let go)."""
  import fcntl

  fd = os.open(path, os.O_RDWR)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return False
  finally:
    os.close(fd)  # closing releases a flock it got
  return True


def test_the_training_lock_names_its_holder_and_is_taken_over_when_it_is_gone(tmp_path, caplog):
  from transformer_xl import errors
  from transformer_xl.run import lock

  caplog.set_level(logging.INFO)
  record = tmp_path / "train.lock.json"  # the holder's record, beside the lock
  holder = _hold_lock(tmp_path)
  try:
    with pytest.raises(errors.WorkdirError) as err:
      with lock.training_lock(str(tmp_path)):
        pytest.fail("a second holder")
    assert f"is in use by another training (pid {holder.pid} on host " in str(err.value)
    assert str(tmp_path / "train.lock") in str(err.value)
  finally:
    holder.kill()  # kill -9: no release; the record keeps the holder's details
    holder.wait()
  assert f'"pid": {holder.pid}' in record.read_text()
  assert _lock_is_free(tmp_path / "train.lock")  # the kernel released it
  with lock.training_lock(str(tmp_path)):
    (note,) = [r.getMessage() for r in caplog.records if "Took over" in r.getMessage()]
    assert f"pid {holder.pid} on host" in note
    assert json.loads(record.read_text())["pid"] == os.getpid()
    with lock.training_lock(str(tmp_path)):  # re-entrant in one process
      pass
    assert record.exists() and not _lock_is_free(tmp_path / "train.lock")
  assert not record.exists() and _lock_is_free(tmp_path / "train.lock")  # released


def test_the_training_lock_released_cleanly_leaves_no_record_and_no_note(tmp_path, caplog):
  """A clean release removes the holder's record, so the next taker (here a
  second process) takes it without a "Took over" note."""
  from transformer_xl.run import lock

  caplog.set_level(logging.INFO)
  record = tmp_path / "train.lock.json"
  with lock.training_lock(str(tmp_path / "new")):  # the workdir is created
    assert (tmp_path / "new" / "train.lock.json").exists()
  assert not (tmp_path / "new" / "train.lock.json").exists()
  with lock.training_lock(str(tmp_path)):
    held = json.loads(record.read_text())
    assert held["pid"] == os.getpid() and set(held) == {"host", "pid", "started"}
  assert not record.exists()
  assert not [r for r in caplog.records if "Took over" in r.getMessage()]
  holder = _hold_lock(tmp_path)  # another process takes it at once
  holder.kill()
  holder.wait()


def test_a_training_lock_holder_killed_with_sigkill_is_taken_over_with_a_note(tmp_path, caplog):
  """SIGKILL gives the holder no chance to release: the kernel frees the
  lock, its record stays, and the next taker says whose lock it took."""
  from transformer_xl.run import lock

  caplog.set_level(logging.INFO)
  holder = _hold_lock(tmp_path)
  os.kill(holder.pid, signal.SIGKILL)
  assert holder.wait() == -signal.SIGKILL
  assert _lock_is_free(tmp_path / "train.lock")
  assert json.loads((tmp_path / "train.lock.json").read_text())["pid"] == holder.pid
  with lock.training_lock(str(tmp_path)):
    notes = [r for r in caplog.records if "Took over" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno >= logging.INFO
    note = notes[0].getMessage()
    assert note.startswith(
        f"Took over {os.path.realpath(tmp_path / 'train.lock')} from a training that ended "
        f"without releasing it (pid {holder.pid} on host "
    )


def test_a_refused_training_names_the_live_holder_and_leaves_its_lock(tmp_path):
  from transformer_xl import errors
  from transformer_xl.run import lock

  holder = _hold_lock(tmp_path)
  try:
    before = (tmp_path / "train.lock.json").read_text()
    t = time.monotonic()
    with pytest.raises(errors.WorkdirError) as err:
      with lock.training_lock(str(tmp_path)):
        pytest.fail("a second holder")
    assert time.monotonic() - t < 5  # no waiting
    assert f"(pid {holder.pid} on host " in str(err.value)
    assert (tmp_path / "train.lock.json").read_text() == before  # the holder's record stays
    assert holder.poll() is None and not _lock_is_free(tmp_path / "train.lock")
  finally:
    holder.kill()
    holder.wait()


def test_the_training_lock_is_not_taken_on_a_remote_workdir(tmp_path):
  from transformer_xl.run import lock

  with lock.training_lock("gs://bucket/none"):
    pass


def _wait_for(predicate, what, timeout=240):
  end = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < end, f"timed out waiting for {what}"
    time.sleep(0.1)


@pytest.mark.slow
def test_a_second_training_stops_and_readers_work_beside_a_training(cli, tmp_path):
  """A training that checkpoints every step (two kept) runs; a second
  training of the same workdir stops within seconds naming it, changing
  nothing; meanwhile 20 restores (what eval, score and generate do) each get
  a checkpoint with no false "not usable" report, and a --mode=score runs;
  then the first training is killed (-9) and the next one takes its lock
  over."""
  from transformer_xl.run import workdir as wd

  root, manual, workdir, args = cli
  copy = tmp_path / "wd"
  shutil.copytree(workdir, copy)
  args = [a.replace(str(workdir), str(copy)) for a in args] + [
      "--config.checkpoint.every_steps=1",
      "--config.checkpoint.max_to_keep=2",
  ]
  first = start_main([*args, "--config.train.num_steps=100000"], stdout=subprocess.DEVNULL)
  try:
    _wait_for(
        lambda: (copy / "checkpoints" / "8").exists() or first.poll() is not None,
        "the first training's checkpoints",
    )
    assert first.poll() is None, first.stderr.read()[-3000:]
    metrics_before = (copy / "config.json").read_text()
    t = time.monotonic()
    second = run_main(
        args + ["--config.train.num_steps=100000", "--config.train.learning_rate=0.5"]
    )
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert time.monotonic() - t < 60
    assert f"is in use by another training (pid {first.pid} on host" in second.stderr
    assert "Corpus" not in second.stdout  # it stopped before loading the data
    assert (copy / "config.json").read_text() == metrics_before

    wd.load_config(str(copy))
    model_cfg, _ = wd.load_model_config(str(copy))
    mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
    logged, steps = [], []
    real_log = report.log
    report.log = logged.append
    try:
      for _ in range(20):
        step, params = run_dir.restore_params(str(copy), model_cfg, mesh)
        steps.append(step)
    finally:
      report.log = real_log
    assert first.poll() is None
    assert not [m for m in logged if "not usable" in m], logged
    assert len(steps) == 20 and steps == sorted(steps)  # (how far it got depends on load)
    r = run_main(
        [
            f"--workdir={copy}",
            "--mode=score",
            f"--text={manual / 'ptb.valid.txt'}",
            f"--out={tmp_path / 'nll.npy'}",
        ]
    )
    assert r.returncode == 0 and "not usable" not in r.stdout + r.stderr, r.stderr[-2000:]
  finally:
    first.kill()
    first.wait()
  r = run_main(args + ["--config.train.num_steps=2"])
  assert r.returncode == 0, r.stderr[-2000:]
  assert (
      f"Took over {copy / 'train.lock'} from a training that ended without releasing it "
      f"(pid {first.pid} on host" in r.stdout + r.stderr  # a report (stdout)
  )


# --------------------------------------------------------------------------- #
# Ctrl-C.


@pytest.mark.slow
def test_ctrl_c_saves_and_the_resumed_run_is_exact(cli, tmp_path):
  """The first Ctrl-C (SIGINT) during training: a checkpoint of the current
  step, one line, exit status 0; resumed two steps further, the run equals a
  straight one (losses and final checkpoint).  (A second Ctrl-C:
  test_process_settings.py.)"""
  root, manual, workdir, args = cli
  constant = ["--config.train.learning_rate=1e-3", "--config.train.min_lr=1e-3"]
  stopped, straight = tmp_path / "stopped", tmp_path / "straight"
  for d in (stopped, straight):
    shutil.copytree(workdir, d)
  run_args = lambda d: [a.replace(str(workdir), str(d)) for a in args] + constant
  proc = start_main(run_args(stopped) + ["--config.train.num_steps=100000"])
  _wait_for(
      lambda: proc.poll() is not None
      or (stopped / "metrics.jsonl").exists()
      and max(read_metrics(stopped), default=0) >= 6,
      "training steps",
  )
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
  saved = [line for line in (out + err).splitlines() if "SIGINT: saved a checkpoint" in line]
  assert len(saved) == 1, out + err
  n = int(saved[0].split("at step ")[1].split(";")[0])
  assert n >= 6 and max(int(p.name) for p in (stopped / "checkpoints").iterdir()) == n
  r = run_main(run_args(stopped) + [f"--config.train.num_steps={n + 2}"])
  assert r.returncode == 0 and f"Resumed from {stopped / 'checkpoints' / str(n)}" in r.stdout
  r = run_main(run_args(straight) + [f"--config.train.num_steps={n + 2}"])
  assert r.returncode == 0, r.stderr[-2000:]
  got, want = read_metrics(stopped), read_metrics(straight)
  assert sorted(got) == sorted(want) == list(range(1, n + 3))
  for step in range(5, n + 3):
    assert got[step]["train/loss"] == pytest.approx(want[step]["train/loss"], rel=1e-6), step
  assert records(stopped)[n + 2] == records(straight)[n + 2]


@pytest.mark.slow
def test_a_diverged_run_names_a_used_checkpoint_and_a_lower_rate_resumes_from_it(cli, tmp_path):
  """The reported case: learning rate 1e30 from scratch, a checkpoint every
  step.  Step 2's loss is finite but its update leaves parameters from
  which step 3 is NaN, so checkpoint 2 holds finite values yet is bad: it is
  moved to checkpoints_rejected/ and the message names checkpoint 1 (step 2
  came from it); the same command with a lower learning rate resumes from 1
  and trains to the end, finite; eval then uses the new checkpoints."""
  root, manual, _, _ = cli
  workdir = tmp_path / "wd"
  args = small_args(
      root,
      workdir,
      manual,
      *TINY,
      "--config.checkpoint.every_steps=1",
      "--config.checkpoint.max_to_keep=2",
      "--config.train.num_steps=8",
  )
  r = run_main(args + ["--config.train.learning_rate=1e30"])
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(error) == 1 and error[0].startswith("error: step 3: the loss is nan"), r.stderr
  assert f"The last good checkpoint is {workdir / 'checkpoints' / '1'} (step 1)" in error[0]
  assert f"moved to {workdir / 'checkpoints_rejected'}" in error[0]
  assert os.listdir(workdir / "checkpoints") == ["1"]
  assert (workdir / "checkpoints_rejected" / "2" / "reason.txt").exists()
  r = run_main(args + ["--config.train.learning_rate=1e-3"])
  assert r.returncode == 0, r.stderr[-3000:]
  assert f"Resumed from {workdir / 'checkpoints' / '1'} at step 1." in r.stdout
  rows = read_metrics(workdir)
  assert sorted(rows) == list(range(1, 9))
  assert all(np.isfinite(rows[s]["train/loss"]) for s in rows)
  assert json.loads((workdir / "checkpoints_verified.json").read_text()) == {"step": 7}
  r = run_main([f"--workdir={workdir}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-2000:]
  assert json.loads((workdir / "eval_results.json").read_text())["step"] == 8


class _Steps:
  """The part of a CheckpointManager that retention.Verification reads."""

  def __init__(self, directory, steps):
    self.directory, self._steps = directory, list(steps)

  def all_steps(self):
    return list(self._steps)


@pytest.mark.parametrize(
    "recorded,restored,good",
    [
        (6, 4, 4),  # resumed from an older good one: the later history is redone
        (6, 6, 6),
        (4, 6, 4),  # resumed from a checkpoint no finite step has come from yet
        (None, 6, 4),  # no record (an older version): the ones before the restored one
        (6, None, None),
    ],
)  # a fresh start: the record of an earlier run is removed
def test_which_checkpoint_a_resumed_run_counts_as_good(tmp_path, recorded, restored, good):
  if recorded is not None:
    (tmp_path / retention.VERIFIED_FILE).write_text(json.dumps({"step": recorded}))
  manager = _Steps(tmp_path / "checkpoints", [2, 4, 6] if restored else [])
  v = retention.Verification(str(tmp_path), manager, restored)
  assert v.newest() == good
  record = tmp_path / retention.VERIFIED_FILE  # rewritten at once: what this run counts
  assert (json.loads(record.read_text()) if record.exists() else None) == (
      None if good is None else {"step": good}
  )
  if restored:
    v.params_good(restored)  # a finite step came from the restored checkpoint
    v.write()
    assert json.loads((tmp_path / retention.VERIFIED_FILE).read_text()) == {"step": restored}


def test_rotation_keeps_the_newest_good_checkpoint_older_than_those_kept(tmp_path):
  """max_to_keep=1 with the newest good checkpoint (2) older than the newest
  one (6): rotation deletes 4 only, 2 stays (and the record naming it);
  without ``keep`` only the newest stays."""
  manager = checkpointing.make_manager(str(tmp_path))
  v = retention.Verification(str(tmp_path), manager, None)
  for step in (2, 4, 6):
    checkpointing.save(manager, step, {"a": jnp.full(3, float(step))}, {"step": step})
  v.params_good(2)  # a finite step came from checkpoint 2; none from 4 or 6 yet
  v.write()
  assert v.newest() == 2
  assert retention.prune(manager, 1, keep=v.newest()) == [4]
  assert sorted(manager.all_steps()) == [2, 6]
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "6"]
  assert json.loads((tmp_path / retention.VERIFIED_FILE).read_text()) == {"step": 2}
  assert retention.prune(manager, 2, keep=2) == []  # 2 is among the newest two anyway
  assert retention.prune(manager, 1) == [2]
  assert manager.all_steps() == [6]
  manager.close()


def test_listing_checkpoints_while_the_rotation_removes_some(tmp_path):
  """Orbax lists the step directories, then reads each one's metadata (or
  its modification time): a step that a training's rotation removes in
  between raised FileNotFoundError out of a reader (``--mode=score`` beside
  a training: "[Errno 2] ... checkpoints/44"; here, without the retry, dozens
  of listings failed).  A thread saves and rotates as fast as it can
  while readers are made and reloaded for 8 s: no listing may fail."""
  import threading

  import orbax.checkpoint as ocp

  writer = checkpointing.make_manager(str(tmp_path))
  directory = tmp_path / "checkpoints"

  def save(step):
    writer.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave({"a": jnp.ones(3)}),
            iterator=ocp.args.JsonSave({}),
            integrity=ocp.args.JsonSave({"format": 0}),
        ),
    )

  for step in range(3):
    save(step)
  stop, failures = threading.Event(), []

  def rotate():
    step = 3
    while not stop.is_set():
      save(step)
      old = directory / str(step - 2)
      old.rename(directory / f"{step - 2}.orbax-checkpoint-tmp-deleted")  # as prune does
      shutil.rmtree(directory / f"{step - 2}.orbax-checkpoint-tmp-deleted")
      writer.reload()
      step += 1

  thread = threading.Thread(target=rotate, daemon=True)
  thread.start()
  listings, end = 0, time.monotonic() + 8
  try:
    while time.monotonic() < end:
      try:
        reader = checkpointing.make_manager(str(tmp_path), create=False)
        for _ in range(3):
          checkpointing.reload(reader)
        assert len(reader.all_steps()) >= 1
        reader.close()
        listings += 1
      except OSError as err:
        failures.append(repr(err))
  finally:
    stop.set()
    thread.join()
    writer.close()
  assert listings > 5 and not failures, failures[:3]
