"""The associative memory (ARMT) through the real command line.

``python -m transformer_xl.main`` in subprocesses on a tiny PTB-format
corpus (``helpers.write_ptb_sample``): train with ``model.memory="armt"``
and backpropagation through the previous segment (the memory's writes
learn only across segments), then ``--mode=eval``, ``--mode=score
--tokens`` and ``--mode=generate`` on the workdir, and a resumed run equal
to an uninterrupted one.  The
scores are compared with the model run in this process on the
checkpoint's parameters (``helpers.reference_nll``); the same parameters
with the value projection zeroed (nothing read) score the later segments
differently, so a command that dropped the memory would fail here.
"""

from __future__ import annotations

import json
import subprocess

import jax
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

pytestmark = pytest.mark.slow  # five commands, two of them train: ~60 s on 2 shared cores

T, M, N, D_MEM, ROWS = 8, 0, 2, 4, 2  # segment, XL cache (the authors': none), tokens, d_mem
TINY = [
    *tiny_flags(
        model__d_model=16,
        model__d_head=8,
        model__d_inner=32,
        model__tgt_len=T,
        model__mem_len=M,
        train__global_batch=None,
        train__warmup_steps=0,
        train__learning_rate=0.05,
        train__min_lr=0.05,
        train__mem_backprop_depth=1,
        eval__tgt_len=T,
        eval__mem_len=M,
        eval__same_length=False,
        eval__clamp_len=0,
        eval__global_batch=ROWS,
    ),
    "--config.model.memory=armt",
    f"--config.model.armt.num_mem_tokens={N}",
    f"--config.model.armt.d_mem={D_MEM}",
]


def _ok(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout + r.stderr


def test_train_eval_score_generate_and_resume(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 30, 8))
  workdir = tmp_path / "wd"
  train = lambda steps: run_main(
      small_args(tmp_path, workdir, manual, *TINY, f"--config.train.num_steps={steps}")
  )
  _ok(train(3))
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  assert saved["memory"] == "armt"
  assert saved["armt"] == {"num_mem_tokens": N, "d_mem": D_MEM, "correction": True}
  params = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / "3" / "state")["params"]
  # Trained through two segments, the value projection (zeros at first) has learned.
  assert np.abs(params["layers"]["armt_w_v"]).max() > 0

  # -- eval, then score the same rows: equal to the model run here ------------------------------
  _ok(run_main([f"--workdir={workdir}", "--mode=eval"]))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert np.isfinite(results["valid"]["loss_nats"]) and results["step"] == 3
  _, tokens, n = ptb_valid_rows(tmp_path, manual, ROWS)
  assert n // ROWS > 3 * T, n
  np.save(tmp_path / "tokens.npy", tokens)
  out = _ok(
      run_main(
          [
              f"--workdir={workdir}",
              "--mode=score",
              f"--tokens={tmp_path / 'tokens.npy'}",
              f"--out={tmp_path / 'nll.npy'}",
          ]
      )
  )
  assert f"scored {n} tokens" in out
  nll = np.load(tmp_path / "nll.npy")
  fields = json.loads((workdir / "model_config.json").read_text())["model"]
  cfg = models.ModelConfig.from_dict({**fields, "dropout": 0.0, "dropatt": 0.0})
  ref = reference_nll(cfg, params, tokens)
  np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
  # The matrices are read: with nothing written (W_v = 0) the first segment scores the same,
  # later ones not.
  blind = jax.tree_util.tree_map(lambda x: x, params)
  blind["layers"]["armt_w_v"] = np.zeros_like(params["layers"]["armt_w_v"])
  unread = reference_nll(cfg, blind, tokens)
  np.testing.assert_allclose(unread[:, :T], ref[:, :T], rtol=1e-5, atol=1e-5)
  assert np.abs(unread[:, T:] - ref[:, T:]).max() > 1e-4

  # -- generate (it needs an XL cache: eval.mem_len >= 1) ---------------------------------------
  generate = [f"--workdir={workdir}", "--mode=generate", "--prompt=the", "--num_tokens=6"]
  out = _ok(run_main([*generate, f"--config.eval.mem_len={T}"]))
  assert out.strip()

  # -- resume to step 5: as a run straight to step 5 (the matrices come back from the checkpoint;
  # a constant learning rate, so that the schedule does not depend on num_steps) --------------
  out = _ok(train(5))
  assert "Resumed from" in out and "at step 3" in out
  straight = tmp_path / "straight"
  _ok(run_main(small_args(tmp_path, straight, manual, *TINY, "--config.train.num_steps=5")))

  def losses(w):
    rows = [json.loads(l) for l in (w / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]

  assert len(losses(workdir)) == 5 and losses(workdir) == losses(straight)
  restore = lambda w: ocp.StandardCheckpointer().restore(w / "checkpoints" / "5" / "state")
  a, b = restore(workdir), restore(straight)
  jax.tree_util.tree_map(np.testing.assert_array_equal, a["params"], b["params"])


def test_bad_armt_settings_are_one_line_before_anything_is_compiled(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(20, 4, 4))
  r = run_main(
      small_args(
          tmp_path,
          tmp_path / "wd",
          manual,
          *TINY,
          "--config.model.armt.d_mem=0",
          "--config.eval.method=sliding",
      )
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert "model.armt.d_mem=0 must be an integer >= 1" in r.stderr, r.stderr[-3000:]
  assert not (tmp_path / "wd" / "checkpoints").exists()


def test_their_checkpoint_converts_and_scores_as_their_wrapper(tmp_path):
  """``python -m transformer_xl.convert --from=armt``: the state dict of
  their wrapper around HuggingFace's TransfoXL (tests/fixtures/armt_model.npz,
  made by running their code: scripts/make_armt_fixtures.py) and its three
  hparams sections; ``--mode=score`` on the workdir gives their per-token
  NLLs (the last position of a segment predicting the next segment's first
  token).  A missing tensor and a TransfoXL cache their wrapper would fill
  with zeros are one error line each."""
  from helpers import REPO, armt_fixture_inputs, run_module

  f = dict(np.load(REPO / "tests" / "fixtures" / "armt_model.npz"))
  state, h_json = armt_fixture_inputs(tmp_path)  # h.json beside it
  hparams = json.loads(h_json.read_text())
  hf = hparams["transfo_xl_config"]
  np.savez(tmp_path / "armt.npz", **state)
  convert = lambda *extra, w="wd", h="h.json", c="armt.npz": run_module(
      "transformer_xl.convert",
      "--from=armt",
      f"--checkpoint={tmp_path / c}",
      f"--hparams={tmp_path / h}",
      f"--workdir={tmp_path / w}",
      *extra,
  )
  _ok(convert())
  np.save(tmp_path / "tokens.npy", f["tokens"])
  _ok(
      run_main(
          [
              f"--workdir={tmp_path / 'wd'}",
              "--mode=score",
              f"--tokens={tmp_path / 'tokens.npy'}",
              f"--out={tmp_path / 'nll.npy'}",
          ]
      )
  )
  np.testing.assert_allclose(np.load(tmp_path / "nll.npy"), f["corr/nll"], rtol=1e-5, atol=1e-5)

  del state["memory_cell.model.transformer.layers.1.W_mk.weight"]  # the copy alone will do
  np.savez(tmp_path / "copy.npz", **state)
  _ok(convert(w="wd1", c="copy.npz"))
  del state["memory_cell.layers.1.W_mk.weight"]
  np.savez(tmp_path / "broken.npz", **state)
  r = convert(w="wd2", c="broken.npz")
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "missing tensor 'memory_cell.model.transformer.layers.1.W_mk.weight'" in r.stderr
  (tmp_path / "h2.json").write_text(
      json.dumps({**hparams, "transfo_xl_config": {**hf, "mem_len": 16}})
  )
  r = convert(w="wd3", h="h2.json")
  assert r.returncode == 1 and "transfo_xl_config.mem_len=16" in r.stderr, r.stderr[-2000:]
