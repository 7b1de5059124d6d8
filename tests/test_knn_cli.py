"""The kNN memory (Memorizing Transformers) through the real command line.

``python -m transformer_xl.main`` in subprocesses on a tiny PTB-format
corpus (``helpers.write_ptb_sample``): train a model with a store at its
last layer, then ``--mode=eval`` with a larger store than training's
(``eval.knn.memory_size``, as the paper evaluates; it also scores the model
without its store), ``--mode=score
--tokens`` and ``--mode=generate`` on its workdir, and a bad store size
refused before anything is compiled.

The scores are compared with an independent computation in this process:
the checkpoint's parameters restored with orbax and run through
``models.TransformerXL`` segment by segment (no ``Evaluator``, no workdir
config), with the evaluation's store; the same parameters with the gate
closed (Transformer-XL's scores, test_knn_memory.py) score the later
segments differently, so a command that dropped the store would fail here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer_xl.model import models

from helpers import (
    ptb_valid_rows,
    reference_nll,
    run_main,
    small_args,
    tiny_flags,
    write_ptb_sample,
)

pytestmark = pytest.mark.slow  # five commands, one of them trains: ~60 s on 2 shared cores

T, M = 8, 8  # eval segment, XL memory
S, S_EVAL, K = 32, 64, 4  # the store at training and at evaluation, neighbours
ROWS = 2
TINY_XL = tiny_flags(  # the model without a store (the fine-tuning's source)
    model__d_model=16,
    model__d_head=8,
    model__d_inner=32,
    model__tgt_len=T,
    model__mem_len=M,
    train__global_batch=None,
    train__warmup_steps=0,
    train__learning_rate=0.05,
    eval__tgt_len=T,
    eval__mem_len=M,
    eval__same_length=False,
    eval__clamp_len=0,
    eval__global_batch=ROWS,
)
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


def _reference_nll(workdir: Path, params: dict, tokens_BxT1: np.ndarray, **knn) -> np.ndarray:
  """``helpers.reference_nll`` of the trained model (model_config.json, the
  eval segments, no dropout, ``knn`` settings changed)."""
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  fields = {**saved, "tgt_len": T, "mem_len": M, "dropout": 0.0, "dropatt": 0.0}
  fields["knn"] = {**fields["knn"], **knn}
  return reference_nll(models.ModelConfig.from_dict(fields), params, tokens_BxT1)


def test_train_eval_with_a_larger_store_score_and_generate(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 40, 8))
  workdir = tmp_path / "wd"
  _ok(run_main(small_args(tmp_path, workdir, manual, *TINY, "--config.train.num_steps=3")))
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  assert saved["memory"] == "knn" and saved["knn"]["memory_size"] == S
  assert saved["knn"]["layers"] == [-1]

  # -- eval with a store of S_EVAL entries, recorded in the results ---------------------------
  _ok(run_main([f"--workdir={workdir}", "--mode=eval", f"--config.eval.knn.memory_size={S_EVAL}"]))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["eval"]["knn"] == {
      "memory_size": S_EVAL,
      "num_neighbors": K,
      "retrieval": "bucketed",
  }
  _, tokens, n = ptb_valid_rows(tmp_path, manual, ROWS)
  assert n // ROWS > (S_EVAL // T + 1) * T, n  # the store wraps around
  np.save(tmp_path / "tokens.npy", tokens)

  # -- score with the same eval store: equal to the model run here ----------------------------
  out = _ok(
      run_main(
          [
              f"--workdir={workdir}",
              "--mode=score",
              f"--tokens={tmp_path / 'tokens.npy'}",
              f"--out={tmp_path / 'nll.npy'}",
              f"--config.eval.knn.memory_size={S_EVAL}",
          ]
      )
  )
  assert f"scored {n} tokens" in out
  nll = np.load(tmp_path / "nll.npy")
  params = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / "3" / "state")["params"]
  ref = _reference_nll(workdir, params, tokens, memory_size=S_EVAL)
  np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
  # The store is read: with the gate closed the first segment scores the same, later ones not.
  closed = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.full_like(x, -40.0) if "knn_gate_bias" in jax.tree_util.keystr(p) else x,
      params,
  )
  xl = _reference_nll(workdir, closed, tokens, memory_size=S_EVAL)
  assert np.abs(xl[:, T:] - ref[:, T:]).max() > 1e-4
  # --mode=eval scored each split both ways, with the store and without it (its own line).
  without = results["valid"]["without_knn"]
  assert without["eval"] == {"memory_size": 0} and without["tokens"] == results["valid"]["tokens"]
  assert abs(without["loss_nats"] - results["valid"]["loss_nats"]) > 1e-5
  # Without the store (eval.knn.memory_size=0) is the local attention alone: the closed gate.
  _ok(
      run_main(
          [
              f"--workdir={workdir}",
              "--mode=score",
              f"--tokens={tmp_path / 'tokens.npy'}",
              f"--out={tmp_path / 'nll0.npy'}",
              "--config.eval.knn.memory_size=0",
          ]
      )
  )
  np.testing.assert_allclose(np.load(tmp_path / "nll0.npy"), xl, rtol=1e-5, atol=1e-5)
  assert set(results["test"]["without_knn"]) == {"loss_nats", "tokens", "ppl", "eval"}

  # -- generate: a continuation from a prompt ---------------------------------------------------
  out = _ok(
      run_main(
          [
              f"--workdir={workdir}",
              "--mode=generate",
              "--prompt=the",
              "--num_tokens=12",
              "--config.eval.knn.memory_size=16",
          ]
      )
  )
  assert out.strip()

  # -- a store that k does not divide: one line, nothing compiled -------------------------------
  r = run_main([f"--workdir={workdir}", "--mode=eval", "--config.eval.knn.memory_size=30"])
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1, r.stderr[-3000:]
  assert "eval.knn.memory_size=30 must be a multiple of model.knn.num_neighbors=4" in r.stderr


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
