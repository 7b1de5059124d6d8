"""Multi-process training on 127.0.0.1, preemption (SIGTERM) and kill -9 recovery.

Every run here is a real `python -m transformer_xl.main` process.  Two
processes with 4 simulated CPU devices each (gloo collectives) must compute
exactly what one process with 8 devices computes, across a restart.
"""

import json
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from helpers import read_metrics, run_main, small_args, start_main, tiny_flags, write_ptb_sample

pytestmark = pytest.mark.slow  # multi-process, end to end

TINY = tiny_flags()


def _args(tmp_path, workdir, manual, *extra):
  """The quickstart config's command line, shrunk to the tiny model, on the PTB sample."""
  return small_args(tmp_path, workdir, manual, *TINY, *extra)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_single(tmp_path, workdir, manual, *extra, timeout=300):
  r = run_main(_args(tmp_path, workdir, manual, *extra), devices=8, timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  return r


def run_two_processes(tmp_path, workdir, manual, *extra, timeout=300):
  port = _free_port()
  procs = [
      start_main(
          _args(
              tmp_path,
              workdir,
              manual,
              *extra,
              f"--coordinator_address=127.0.0.1:{port}",
              "--num_processes=2",
              f"--process_id={i}",
          ),
          devices=4,
      )
      for i in range(2)
  ]
  outs = [p.communicate(timeout=timeout) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return outs


def final_state(workdir, step):
  """A checkpoint's state as numpy arrays, whatever topology wrote it."""
  path = Path(workdir) / "checkpoints" / str(step) / "state"
  ckptr = ocp.PyTreeCheckpointer()
  tree = ckptr.metadata(path)
  tree = getattr(getattr(tree, "item_metadata", tree), "tree", tree)
  args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  leaves = jax.tree_util.tree_leaves(
      ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
  )
  assert len(leaves) > 10
  return leaves


def test_two_processes_equal_one_process_across_a_restart(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  one, two = tmp_path / "one", tmp_path / "two"
  run_single(
      tmp_path, one, manual, "--config.train.num_steps=3", "--config.checkpoint.every_steps=3"
  )
  run_single(
      tmp_path, one, manual, "--config.train.num_steps=5", "--config.checkpoint.every_steps=3"
  )
  run_two_processes(
      tmp_path, two, manual, "--config.train.num_steps=3", "--config.checkpoint.every_steps=3"
  )
  outs = run_two_processes(
      tmp_path, two, manual, "--config.train.num_steps=5", "--config.checkpoint.every_steps=3"
  )
  assert "Resumed" in outs[0][0] + outs[0][1] and "2 process(es)" in outs[0][0]
  assert "Corpus" not in outs[1][0]  # only process 0 logs
  m1, m2 = read_metrics(one), read_metrics(two)
  assert sorted(m1) == sorted(m2) == [1, 2, 3, 4, 5]
  for step in m1:
    assert m2[step]["train/loss"] == pytest.approx(m1[step]["train/loss"], rel=1e-5)
  for a, b in zip(final_state(one, 5), final_state(two, 5)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def _wait_for_step(workdir, step, proc, timeout=240):
  path = Path(workdir) / "metrics.jsonl"
  t0 = time.time()
  while time.time() - t0 < timeout:
    if proc.poll() is not None:
      raise AssertionError(f"training exited early: {proc.stderr.read()[-3000:]}")
    if path.exists() and any(json.loads(l)["step"] >= step for l in path.read_text().splitlines()):
      return
    time.sleep(0.2)
  raise AssertionError("training made no progress")


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  proc = start_main(
      _args(
          tmp_path,
          workdir,
          manual,
          "--config.train.num_steps=100000",
          "--config.checkpoint.every_steps=100000",
      ),
      devices=8,
  )
  _wait_for_step(workdir, 3, proc)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert "SIGTERM: saved a checkpoint" in out + err
  steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(steps) == 1 and steps[0] >= 3
  r = run_single(
      tmp_path,
      workdir,
      manual,
      f"--config.train.num_steps={steps[0] + 2}",
      "--config.checkpoint.every_steps=100000",
  )
  assert f"at step {steps[0]}" in r.stdout + r.stderr


def test_kill_9_at_random_moments_resumes_from_last_complete_checkpoint(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  n_steps = 14
  common = [
      f"--config.train.num_steps={n_steps}",
      "--config.checkpoint.every_steps=1",
      "--config.checkpoint.max_to_keep=2",
  ]
  reference = tmp_path / "reference"
  run_single(tmp_path, reference, manual, *common)
  want = read_metrics(reference)

  workdir = tmp_path / "killed"
  rng = random.Random(0)
  kills = 0
  for attempt in range(12):
    proc = start_main(
        _args(tmp_path, workdir, manual, *common), devices=8, stdout=subprocess.DEVNULL
    )
    # Wait for the run to get going (past the start-up), then kill it at a
    # random moment; with a checkpoint after every step, many kills land in
    # the middle of a checkpoint write.
    done = sorted(read_metrics(workdir)) if (workdir / "metrics.jsonl").exists() else []
    try:
      _wait_for_step(workdir, (done[-1] if done else 0) + 1, proc)
    except AssertionError:
      if proc.poll() == 0:
        break
      raise
    time.sleep(rng.uniform(0.0, 0.6))
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      kills += 1
    else:
      assert proc.returncode == 0, proc.stderr.read()[-3000:]
      break
    if kills >= 5 and attempt >= 5:
      break
  assert kills >= 5
  run_single(tmp_path, workdir, manual, *common)
  # Every logged loss, from every (re)start, equals the uninterrupted run's.
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  rows = [r for r in rows if "train/loss" in r]
  assert {r["step"] for r in rows} == set(range(1, n_steps + 1))
  for r in rows:
    assert r["train/loss"] == pytest.approx(want[r["step"]]["train/loss"], rel=1e-6), r["step"]
  for a, b in zip(final_state(reference, n_steps), final_state(workdir, n_steps)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_two_processes_agree_on_falling_back_from_a_damaged_checkpoint(tmp_path):
  """Two processes resume over a damaged latest checkpoint and a partial
  write: both reject it, move it aside, remove the partial write and resume
  from the previous checkpoint together; each step is logged once."""
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  run_two_processes(
      tmp_path, workdir, manual, "--config.train.num_steps=4", "--config.checkpoint.every_steps=2"
  )
  (workdir / "checkpoints" / "4" / "state" / "_METADATA").unlink()
  (workdir / "checkpoints" / "6.orbax-checkpoint-tmp-99").mkdir()
  outs = run_two_processes(
      tmp_path, workdir, manual, "--config.train.num_steps=6", "--config.checkpoint.every_steps=2"
  )
  log = outs[0][0] + outs[0][1]
  assert f"Checkpoint {workdir / 'checkpoints' / '4'} is not usable" in log
  assert f"Resumed from {workdir / 'checkpoints' / '2'} at step 2" in log
  assert "Removed" in log and not (workdir / "checkpoints" / "6.orbax-checkpoint-tmp-99").exists()
  assert (workdir / "checkpoints_rejected" / "4").is_dir()
  steps = [json.loads(l)["step"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3, 4, 5, 6]
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir())[-2:] == [4, 6]
