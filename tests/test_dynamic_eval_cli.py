"""Dynamic evaluation from the command line, against a PyTorch reference loop.

A HuggingFace ``TransfoXLLMHeadModel`` (transformers 4.35, attn_type 0) is
converted into a workdir; ``python -m transformer_xl.main --mode=score
--dynamic_stats=S.npy --config.eval.dynamic.*`` on it (no ``--config``) must
give the per-token NLL of the authors' procedure run on the PyTorch model
itself: a statistics pass summing squared gradients of each segment's mean
NLL, then per segment score, gradient, and the update of
``dynamic_eval_opt.py`` (benkrause/dynamiceval-transformer), written here
in torch.  Then bad input: one line each, before anything is compiled.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from transformer_xl import convert

from helpers import TEXT, run_module, tiny_text_config, write_corpus, write_json
from hf_reference import BASE, hf_model, random_tokens, state_dict

RAW = {  # adaptive softmax, projections, clamp_len and same_length
    **BASE,
    "cutoffs": [10, 25],
    "d_embed": 24,
    "div_val": 2,
    "tie_projs": [False, True, True],
    "same_length": True,
    "clamp_len": 4,
}
LR, DECAY, EPS = 3e-4, 2.0, 1e-3


def torch_dynamic_eval(model, tokens, stats, seg, lr=LR, decay=DECAY, eps=EPS):
  """The authors' RMS dynamic evaluation on the PyTorch model: NLL [B, T]."""
  params = [p for p in model.parameters()]  # tied tensors are listed once

  def segments(x_BxT1):
    mems = [torch.zeros(0, x_BxT1.shape[0], RAW["d_model"]) for _ in range(RAW["n_layer"])]
    t = x_BxT1.shape[1] - 1
    for s in range(0, t, seg):
      x = torch.from_numpy(x_BxT1[:, s : min(s + seg, t)]).long()
      y = torch.from_numpy(x_BxT1[:, s + 1 : min(s + seg, t) + 1]).long()
      out = model(input_ids=x, mems=mems)
      mems = [m.detach() for m in out.mems]
      nll = -out.prediction_scores.gather(-1, y[..., None])[..., 0]
      grads = torch.autograd.grad(nll.mean(), params, allow_unused=True)
      yield nll.detach().numpy(), [
          torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)
      ]

  ss = [torch.zeros_like(p) for p in params]
  for _, grads in segments(stats):
    for s, g in zip(ss, grads):
      s += g * g
  m = [torch.zeros_like(p) for p in params]
  out = []
  for nll, grads in segments(tokens):
    out.append(nll)
    with torch.no_grad():
      for p, mi, s, g in zip(params, m, ss, grads):
        update = lr / (s.sqrt() + eps) * g + decay * s.sqrt() * mi
        mi -= update
        p -= update
  return np.concatenate(out, axis=1)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(root, workdir, HF model's state dict, hparams): a converted HF model."""
  root = tmp_path_factory.mktemp("dynamic_cli")
  hp = convert.load_hparams(RAW)
  model = hf_model(hp, seed=61)
  sd = state_dict(model)
  np.savez(root / "sd.npz", **sd)
  workdir = root / "wd"
  convert.convert_to_workdir(
      "pytorch",
      str(root / "sd.npz"),
      write_json(root / "hp.json", RAW),
      str(workdir),
      global_batch=8,
  )
  return root, workdir, hp


def _score(workdir, tokens, out, *extra):
  return run_module(
      "transformer_xl.main",
      f"--workdir={workdir}",
      "--mode=score",
      f"--tokens={tokens}",
      f"--out={out}",
      *extra,
  )


def test_score_with_dynamic_evaluation_equals_the_pytorch_reference(converted):
  root, workdir, hp = converted
  tokens = random_tokens(hp["n_token"], 23, seed=62, batch=2)  # 22 scored: the last segment padded
  stats = random_tokens(hp["n_token"], 16, seed=63, batch=1)
  np.save(root / "tokens.npy", tokens)
  np.save(root / "stats.npy", stats)
  r = _score(
      workdir,
      root / "tokens.npy",
      root / "nll.npy",
      f"--dynamic_stats={root / 'stats.npy'}",
      f"--config.eval.dynamic.lr={LR}",
      f"--config.eval.dynamic.decay={DECAY}",
      f"--config.eval.dynamic.eps={EPS}",
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert "dynamic evaluation" in r.stdout + r.stderr
  ours = np.load(root / "nll.npy")
  model = hf_model(hp, seed=61)
  ref = torch_dynamic_eval(model, tokens, stats, seg=RAW["tgt_len"])
  assert ours.shape == ref.shape == (2, 22)
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
  # Static scores differ after the first segment: the parameters really moved.
  static = torch_dynamic_eval(
      hf_model(hp, seed=61), tokens, stats, RAW["tgt_len"], lr=0.0, decay=0.0
  )
  assert np.max(np.abs(ours[:, 5:] - static[:, 5:])) > 1e-3
  np.testing.assert_allclose(ours[:, :5], static[:, :5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--config.eval.dynamic.lr=-1e-5"], "eval.dynamic.lr=-1e-05 must be finite and >= 0"),
        (["--config.eval.dynamic.lr=nan"], "eval.dynamic.lr=nan"),
        (
            ["--config.eval.dynamic.lr=1e-5", "--config.eval.dynamic.eps=inf"],
            "eval.dynamic.eps=inf",
        ),
        (
            ["--config.eval.dynamic.lr=1e-5", "--config.eval.dynamic.decay=-2"],
            "eval.dynamic.decay=-2",
        ),
        (["--dynamic_stats=STATS"], "dynamic evaluation, which is off"),
        (
            [
                "--dynamic_stats=STATS",
                "--config.eval.dynamic.lr=1e-5",
                "--config.eval.dynamic.rule=sgd",
                "--config.eval.dynamic.decay=0",
            ],
            "uses no statistics",
        ),
        (["--dynamic_stats=OOV", "--config.eval.dynamic.lr=1e-5"], "--dynamic_stats"),
        (["--dynamic_stats=MISSING", "--config.eval.dynamic.lr=1e-5"], "does not exist"),
    ],
)
def test_bad_dynamic_input_is_one_line_before_compiling(converted, extra, words):
  root, workdir, hp = converted
  np.save(root / "t.npy", random_tokens(hp["n_token"], 9, seed=64, batch=1))
  np.save(root / "stats_ok.npy", random_tokens(hp["n_token"], 9, seed=65, batch=1))
  np.save(root / "oov.npy", np.full((1, 9), hp["n_token"] + 3))
  names = {
      "STATS": root / "stats_ok.npy",
      "OOV": root / "oov.npy",
      "MISSING": root / "missing.npy",
  }
  args = [a.split("=")[0] + "=" + str(names.get(a.split("=")[1], a.split("=")[1])) for a in extra]
  r = _score(workdir, root / "t.npy", root / "never.npy", *args)
  assert r.returncode == 1, r.stderr[-3000:]
  lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and words in r.stderr, r.stderr[-3000:]  # (a config's list: one per line)
  assert "Traceback" not in r.stderr
  assert not (root / "never.npy").exists()
  assert "Statistics" not in r.stdout and "scored" not in r.stdout  # stopped before the model ran


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny workdir trained here on a toy corpus of one's own text (2 steps)."""
  from transformer_xl.cli import modes

  root = tmp_path_factory.mktemp("dynamic_eval_trained")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  return workdir


@pytest.mark.slow
def test_eval_with_dynamic_evaluation_writes_its_own_results(trained):
  """--mode=eval --config.eval.dynamic.lr=... on a trained workdir (no --config):
  eval_results_dynamic.json with the settings and the statistics read from the
  training split; the static eval_results.json is left as it was."""
  r = run_module("transformer_xl.main", f"--workdir={trained}", "--mode=eval")
  assert r.returncode == 0, r.stderr[-3000:]
  static_path = trained / "eval_results.json"
  static_text = static_path.read_text()
  r = run_module(
      "transformer_xl.main",
      f"--workdir={trained}",
      "--mode=eval",
      "--config.eval.dynamic.lr=3e-3",
      "--config.eval.dynamic.stats_tokens=64",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert static_path.read_text() == static_text
  dynamic = json.loads((trained / "eval_results_dynamic.json").read_text())
  static = json.loads(static_text)
  assert dynamic["eval"]["dynamic"]["lr"] == 3e-3
  assert dynamic["eval"]["dynamic"]["stats_tokens_read"] == 64  # 8 segments of 8 tokens, 1 row
  for split in ("valid", "test"):
    assert dynamic[split]["tokens"] == static[split]["tokens"]
    assert dynamic[split]["loss_nats"] != static[split]["loss_nats"]
  assert "Statistics pass: 64 training tokens" in r.stdout + r.stderr
  # Statistics asked of more tokens than the training split has: said, all of it read
  # (in segments of 128 on one device: 24 gradients).
  r = run_module(
      "transformer_xl.main",
      f"--workdir={trained}",
      "--mode=eval",
      "--config.eval.dynamic.lr=3e-3",
      f"--config.eval.dynamic.stats_tokens={10**9}",
      "--config.eval.tgt_len=128",
      devices=1,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert (
      f"eval.dynamic.stats_tokens={10**9:,} is more than the training split's 3,073 tokens"
      in r.stdout + r.stderr
  )
  read = json.loads((trained / "eval_results_dynamic.json").read_text())
  assert 3_073 - 128 < read["eval"]["dynamic"]["stats_tokens_read"] <= 3_073
  # A diverging one (a huge rate) fails in one line and keeps the good results.
  good = (trained / "eval_results_dynamic.json").read_text()
  r = run_module(
      "transformer_xl.main",
      f"--workdir={trained}",
      "--mode=eval",
      "--config.eval.dynamic.lr=1e30",
      "--config.eval.dynamic.stats_tokens=64",
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert "the adapted parameters diverged" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
  assert "(a loss is not finite; the file there is kept)" in r.stdout + r.stderr
  assert (trained / "eval_results_dynamic.json").read_text() == good
  assert static_path.read_text() == static_text


@pytest.mark.slow
def test_score_with_statistics_from_a_text_file(trained, tmp_path):
  """--text with --dynamic_stats=<a text file>, tokenised with the workdir's saved
  tokenizer; an empty statistics file is one line."""
  (tmp_path / "some.txt").write_text(TEXT)
  (tmp_path / "stats.txt").write_text(TEXT * 3)
  (tmp_path / "empty.txt").write_text("")
  args = [
      f"--workdir={trained}",
      "--mode=score",
      f"--text={tmp_path / 'some.txt'}",
      "--config.eval.dynamic.lr=1e-3",
  ]
  r = run_module(
      "transformer_xl.main",
      *args,
      f"--out={tmp_path / 'nll.npy'}",
      f"--dynamic_stats={tmp_path / 'stats.txt'}",
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert np.load(tmp_path / "nll.npy").shape[0] == 1
  r = run_module(
      "transformer_xl.main",
      *args,
      f"--out={tmp_path / 'never.npy'}",
      f"--dynamic_stats={tmp_path / 'empty.txt'}",
  )
  assert r.returncode == 1 and "has no token" in r.stderr and "Traceback" not in r.stderr
  assert not (tmp_path / "never.npy").exists()
