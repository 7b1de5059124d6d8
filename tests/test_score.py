"""--mode=score: per-token NLL of token streams, checked against evaluation."""

import jax
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.inference import evaluate
from transformer_xl.model import models
from transformer_xl.training import train_state

from helpers import run_main, small_args, tiny_config, tiny_flags, write_ptb_sample


@pytest.fixture(scope="module")
def setup():
  config = tiny_config()
  config.eval.update(tgt_len=5, mem_len=7, clamp_len=0, same_length=True, global_batch=8)
  mcfg = default_config.model_config(config, 64)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
  return config, mcfg, mesh, state.params


def test_score_equals_evaluation_of_a_split(setup):
  config, mcfg, mesh, params = setup
  rng = np.random.default_rng(0)
  stream = rng.integers(0, 64, size=203).astype(np.int32)
  corpus = data.Corpus(
      name="toy",
      unit="word",
      vocab=[str(i) for i in range(64)],
      boundary_id=0,
      splits={"valid": data.ArraySource(stream)},
  )
  config.eval.global_batch = 8
  ev = evaluate.Evaluator(config, mcfg, corpus, mesh)
  # The evaluator cuts the stream into 8 rows of ceil(203/8) = 26 targets;
  # scoring those rows as arrays must give the same total.
  res = ev.evaluate(params, "valid")
  assert res["tokens"] == 203
  full = np.concatenate([[0], stream])  # boundary symbol as context of token 0
  row_len = -(-203 // 8)
  nll_total, count = 0.0, 0
  for r in range(8):
    seg = full[r * row_len : (r + 1) * row_len + 1]
    n = len(seg) - 1
    if n <= 0:
      continue
    nll = ev.score(params, seg[None, :])
    assert nll.shape == (1, n) and nll.dtype == np.float32
    nll_total += float(nll.sum())
    count += n
  assert count == 203
  assert nll_total / count == pytest.approx(res["loss_nats"], rel=1e-5)


def test_score_rows_are_independent_and_padding_is_harmless(setup):
  config, mcfg, mesh, params = setup
  ev = evaluate.Evaluator(config, mcfg, None, mesh)
  tokens = np.random.default_rng(1).integers(0, 64, size=(3, 18))  # T = 17: not a multiple of 5
  nll = ev.score(params, tokens)
  assert nll.shape == (3, 17)
  for b in range(3):
    np.testing.assert_allclose(
        ev.score(params, tokens[b : b + 1]), nll[b : b + 1], rtol=1e-5, atol=1e-6
    )
  # A prefix is scored the same way (causality; nothing leaks from later tokens).
  np.testing.assert_allclose(ev.score(params, tokens[:, :9]), nll[:, :8], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"\[0, 64\)"):
    ev.score(params, tokens + 64)
  with pytest.raises(ValueError, match="integer array"):
    ev.score(params, tokens[0])


@pytest.mark.slow
def test_score_from_the_command_line(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  tiny = tiny_flags(
      model__tgt_len=None,
      model__mem_len=None,
      train__global_batch=None,
      train__num_steps=2,
      train__warmup_steps=0,
  )
  r = run_main(small_args(tmp_path, workdir, manual, *tiny))
  assert r.returncode == 0, r.stderr[-3000:]
  tokens = np.random.default_rng(2).integers(0, 20, size=(2, 41))
  np.save(tmp_path / "tok.npy", tokens)
  r = run_main(
      [
          f"--workdir={workdir}",
          "--mode=score",
          f"--tokens={tmp_path / 'tok.npy'}",
          f"--out={tmp_path / 'nll.npy'}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  nll = np.load(tmp_path / "nll.npy")
  assert nll.shape == (2, 40) and nll.dtype == np.float32 and np.all(nll > 0)
  assert f"loss {nll.astype(np.float64).mean():.4f} nats" in r.stdout
  r = run_main(
      [f"--workdir={tmp_path / 'nothing'}", "--mode=score", "--tokens=x.npy", "--out=y.npy"]
  )
  assert r.returncode != 0 and "config.json" in r.stderr and "Traceback" not in r.stderr


def test_eval_batch_that_does_not_divide_the_devices_is_padded(setup):
  """eval.global_batch 3 on 4 data shards: same result as on one device."""
  config, mcfg, mesh, params = setup
  stream = np.random.default_rng(5).integers(0, 64, size=97).astype(np.int32)
  corpus = data.Corpus(
      name="toy",
      unit="char",
      vocab=[str(i) for i in range(64)],
      boundary_id=0,
      splits={"valid": data.ArraySource(stream)},
  )
  config.eval.global_batch = 3
  res = evaluate.Evaluator(config, mcfg, corpus, mesh).evaluate(params, "valid")
  mesh1 = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  params1 = jax.device_put(params, sharding.replicated(mesh1))
  res1 = evaluate.Evaluator(config, mcfg, corpus, mesh1).evaluate(params1, "valid")
  assert res["tokens"] == res1["tokens"] == 97
  assert res["loss_nats"] == pytest.approx(res1["loss_nats"], rel=1e-5)
  assert res["bpc"] == pytest.approx(res["loss_nats"] / np.log(2))


@pytest.mark.parametrize("name", ["ptb", "ptb_char", "wikitext2", "text8"])
def test_corpus_encode_reproduces_the_builders_streams(tmp_path, name):
  from data_samples import _PTB, _WIKI, _ptb_tgz, _text8_text, _wiki_zip, _zip

  manual = tmp_path / "manual"
  manual.mkdir()
  if name.startswith("ptb"):
    _ptb_tgz(manual)
    texts = {s: _PTB[s] for s in ("valid", "test")}
  elif name == "wikitext2":
    _wiki_zip(manual, "wikitext-2", _WIKI)
    texts = {s: _WIKI[s] for s in ("valid", "test")}
  else:
    text = _text8_text()
    _zip(manual / "text8.zip", {"text8": text.encode()})
    texts = {"all": text}
  corpus = data.load_corpus(
      name, data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False
  )
  for split, text in texts.items():
    ids = corpus.encode(text)
    if split == "all":
      want = np.concatenate(
          [
              corpus.splits[s].read(0, corpus.splits[s].num_tokens)
              for s in ("train", "valid", "test")
          ]
      )
    else:
      want = corpus.splits[split].read(0, corpus.splits[split].num_tokens)
    np.testing.assert_array_equal(ids, want)


@pytest.mark.slow
def test_score_text_from_the_command_line(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  tiny = tiny_flags(
      model__n_layer=1,
      model__tgt_len=None,
      model__mem_len=None,
      train__global_batch=None,
      train__num_steps=1,
      train__warmup_steps=0,
  )
  r = run_main(small_args(tmp_path, workdir, manual, *tiny))
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_main(
      [
          f"--workdir={workdir}",
          "--mode=score",
          f"--text={manual / 'ptb.test.txt'}",
          f"--out={tmp_path / 'nll.npy'}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  corpus = data.load_corpus(
      "ptb", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False
  )
  assert np.load(tmp_path / "nll.npy").shape == (1, corpus.splits["test"].num_tokens)
