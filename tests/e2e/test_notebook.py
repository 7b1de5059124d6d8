"""Runs notebooks/reproduce_transformer_xl.ipynb top to bottom on CPU.

papermill injects the parameters (the papermill convention: the cell tagged
"parameters"): the quickstart config shrunk to a tiny model, a few steps, and
a small PTB-format sample written here as the manual dir.  The notebook must
finish, write the learning-curve PNG and eval_results.json, and run the
analyses (a sample, the attention maps, the RECL curve).
"""

import json

import nbformat
import numpy as np
import papermill
import pytest

from helpers import REPO, tiny_flags, write_ptb_sample

pytestmark = pytest.mark.slow  # end to end: the notebook

NOTEBOOK = REPO / "notebooks" / "reproduce_transformer_xl.ipynb"
TINY = tiny_flags(
    train__log_every=2,
    train__eval_every=3,
    checkpoint__every_steps=3,
    eval__tgt_len=8,
    eval__mem_len=16,
    eval__global_batch=8,
)


def test_notebook_has_one_parameters_cell():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(tagged) == 1 and tagged[0].cell_type == "code"
  for name in (
      "REPO_URL",
      "CONFIG",
      "WORKDIR",
      "MANUAL_DIR",
      "NUM_STEPS",
      "FULL_SCHEDULE",
      "OVERRIDES",
  ):
    assert f"\n{name} = " in "\n" + tagged[0].source, name
  assert 'CONFIG = "configs/quickstart.py"' in tagged[0].source
  assert "transformer_xl.convert" in nb.cells[-1].source  # the closing note on the converter


def test_notebook_runs_end_to_end_on_cpu(tmp_path, monkeypatch):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "workdir"
  # One CPU device is enough here and compiles faster than conftest's eight.
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # A "released" checkpoint: a small HuggingFace-layout model over this
  # sample's vocabulary, converted and evaluated by the notebook's last cell.
  from transformer_xl import convert, data

  from hf_reference import BASE, hf_model, state_dict  # torch: only this test needs it

  corpus = data.load_corpus(
      "ptb",
      data_dir=str(tmp_path / "tfds"),
      manual_dir=str(manual),
      download=False,
      verify_checksums=False,
  )
  hp = convert.load_hparams({**BASE, "n_token": corpus.vocab_size, "tgt_len": 8, "mem_len": 8})
  np.savez(tmp_path / "released.npz", **state_dict(hf_model(hp, seed=3)))
  (tmp_path / "released_hparams.json").write_text(json.dumps(hp))
  (tmp_path / "released_vocab.txt").write_text("\n".join(corpus.vocab) + "\n")
  parameters = dict(
      CONFIG="configs/quickstart.py",
      WORKDIR=str(workdir),
      MANUAL_DIR=str(manual),
      NUM_STEPS=6,
      FULL_SCHEDULE=False,
      SAMPLE_TOKENS=12,
      RECL_LENGTHS="4,8,16",
      ANALYSIS_TOKENS=400,
      OVERRIDES=[
          *TINY,
          "--config.data.verify_checksums=False",
          f"--config.data.data_dir={tmp_path / 'tfds'}",
      ],
      RELEASED_CHECKPOINT=str(tmp_path / "released.npz"),
      RELEASED_FROM="pytorch",
      RELEASED_HPARAMS=str(tmp_path / "released_hparams.json"),
      RELEASED_VOCAB=str(tmp_path / "released_vocab.txt"),
  )
  out = tmp_path / "executed.ipynb"
  papermill.execute_notebook(
      str(NOTEBOOK),
      str(out),
      parameters=parameters,
      cwd=str(NOTEBOOK.parent),
      kernel_name="python3",
      progress_bar=False,
      execution_timeout=240,
  )

  plot = workdir / "learning_curves.png"
  assert plot.is_file() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["step"] == 6
  for split in ("valid", "test"):
    assert results[split]["tokens"] > 0 and results[split]["ppl"] > 1
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == [2, 4, 6]
  assert [r["step"] for r in rows if "valid/loss_nats" in r] == [3, 6]

  executed = nbformat.read(out, as_version=4)
  text = "\n".join(
      o.get("text", "")
      for c in executed.cells
      if c.cell_type == "code"
      for o in c.get("outputs", [])
      if o.get("output_type") == "stream"
  )
  assert "Using the checkout" in text  # run from the repository: no clone, no pip install
  assert "backend: cpu" in text
  assert "checkpoint at step 6" in text
  sample = json.loads((workdir / "sample.json").read_text())  # Appendix E
  assert len(sample["tokens"]) == 12 and sample["text"]
  assert (workdir / "attention" / "average_attention.png").read_bytes()[:4] == b"\x89PNG"
  recl = json.loads((workdir / "recl" / "recl.json").read_text())  # Appendix C
  assert recl["context_lengths"] == [4, 8, 16] and set(recl["results"]) == {"0.1", "0.5", "1.0"}
  released = json.loads((tmp_path / "workdir_released" / "eval_results.json").read_text())
  assert released["valid"]["tokens"] == corpus.splits["valid"].num_tokens
  images = [
      o for c in executed.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
  ]
  assert len(images) >= 4, "the learning curves, attention maps and RECL plots are shown inline"
