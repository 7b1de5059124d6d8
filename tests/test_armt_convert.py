"""The associative memory (ARMT): the authors' checkpoint through the real
command line (``python -m transformer_xl.convert --from=armt``, then
``python -m transformer_xl.main --mode=score`` on the workdir).  Training,
evaluation, scoring and generation of an ARMT workdir are in the command-line
ladder every memory runs (test_memory_cli.py).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from helpers import run_main

pytestmark = pytest.mark.slow  # a conversion and a score command, three refused conversions


def _ok(r: subprocess.CompletedProcess) -> str:
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout + r.stderr


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
