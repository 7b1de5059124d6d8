"""The kNN memory (Memorizing Transformers) through the real command line: what
its commands add to the ladder every memory runs (test_memory_cli.py).

``python -m transformer_xl.main`` in subprocesses on a tiny PTB-format
corpus (``helpers.write_ptb_sample``): the paper's recipe, a Transformer-XL
workdir fine-tuned with a store in one command (``train.init_from``) and
resumed exactly; the checkpoint's size said at the start, the store in it.
"""

from __future__ import annotations

import json
import re
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from helpers import memory_run_flags, run_main, small_args, write_ptb_sample

pytestmark = pytest.mark.slow  # six commands, all of them train

T, M = 8, 8  # eval segment, XL memory
S, K = 32, 4  # the store, neighbours
ROWS = 2
TINY_XL = memory_run_flags(T, M, ROWS)  # the model without a store (the fine-tuning's source)
KNN = [
    f"--config.model.knn.memory_size={S}",
    f"--config.model.knn.num_neighbors={K}",
    "--config.model.knn.layers=(-1,)",
    "--config.model.memory=knn",
]
TINY = [*TINY_XL, *KNN]


def _ok(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout + r.stderr


def test_fine_tune_a_trained_workdir_with_a_store_in_one_command_and_resume_exactly(tmp_path):
  """The paper's recipe (Sec. 4.4) from the command line: a Transformer-XL
  workdir trained without a store, then one command that starts a kNN
  model from it (``train.init_from``), run once to step 4 and once stopped
  at step 2 and resumed: the same losses and the same parameters (the
  store comes back from the checkpoint; a fresh store would score steps 3
  and 4 differently)."""
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 8, 8))
  source = tmp_path / "xl"
  _ok(run_main(small_args(tmp_path, source, manual, *TINY_XL, "--config.train.num_steps=2")))
  assert json.loads((source / "model_config.json").read_text())["model"]["memory"] == "xl"

  def fine_tune(workdir, steps):
    return _ok(
        run_main(
            small_args(
                tmp_path,
                workdir,
                manual,
                *TINY,
                f"--config.train.init_from={source}",
                f"--config.train.num_steps={steps}",
                "--config.train.min_lr=0.05",  # a constant rate: the schedule ignores num_steps
            )
        )
    )

  out = fine_tune(tmp_path / "once", 4)
  assert f"Starting from {source} (step 2)" in out, out[-3000:]
  assert "2 new: " in out and "knn_gate_bias" in out and "knn_scale" in out
  saved = json.loads((tmp_path / "once" / "config.json").read_text())
  assert saved["train"]["init_from"] == str(source) and saved["model"]["memory"] == "knn"
  fine_tune(tmp_path / "twice", 2)
  out = fine_tune(tmp_path / "twice", 4)
  assert "Resumed from" in out and "at step 2" in out and "Starting from" not in out

  def losses(workdir):
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

  once, twice = losses(tmp_path / "once"), losses(tmp_path / "twice")
  assert sorted(once) == sorted(twice) == [1, 2, 3, 4]
  assert [twice[s] for s in (1, 2, 3, 4)] == [once[s] for s in (1, 2, 3, 4)]
  restore = lambda w: ocp.StandardCheckpointer().restore(w / "checkpoints" / "4" / "state")
  a, b = restore(tmp_path / "once"), restore(tmp_path / "twice")
  jax.tree_util.tree_map(np.testing.assert_array_equal, a["params"], b["params"])


def test_a_checkpoint_holds_the_store_and_its_size_is_said_at_the_start(tmp_path):
  """The store is saved in every checkpoint: the run says how large one is
  (its parts counted by hand here) and that the memory is most of it; on
  disk, once the store is full of keys and values, the checkpoint is at
  least the store's bytes (the format does not shrink it away)."""
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 8, 8))
  workdir, s, steps = tmp_path / "wd", 128, 17  # 16 segments of T = 8 fill 128 entries
  knn = [f"--config.model.knn.memory_size={s}", *KNN[1:]]
  out = _ok(
      run_main(
          small_args(tmp_path, workdir, manual, *TINY_XL, *knn, f"--config.train.num_steps={steps}")
      )
  )
  (line,) = [l for l in out.splitlines() if l.startswith("Checkpoint: ")]
  mib = [float(x) * 2**20 for x in re.findall(r"([0-9.]+) MiB", line)]
  rows, layers, heads, d_head, d_model, n_params = 16, 2, 2, 8, 16, 5331
  store = 2 * rows * heads * s * d_head * 4 + rows * 4  # keys, values (float32), index
  memory = layers * rows * M * d_model * 4 + rows * 4 + store  # + XL's cache and lengths
  parts = {"params": n_params * 4, "opt_state": 2 * n_params * 4 + 4, "memory": memory}
  for got, want in zip(mib, [sum(parts.values()), *parts.values()]):
    assert got == pytest.approx(want, rel=1e-3, abs=60), line
  assert f"Model: {n_params:,} parameters" in out
  assert "The memory of the 16 training rows is most of it (model.memory='knn')" in line, line
  on_disk = sum(f.stat().st_size for f in (workdir / "checkpoints" / str(steps)).rglob("*"))
  assert on_disk > store, (on_disk, store)
