"""Attention maps (analysis/attention.py): distance alignment, normalisation,
a forced uniform attention's known profile, and the command end to end."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.analysis import attention as attention_maps
from transformer_xl.inference import eval_steps
from transformer_xl.model import models

from helpers import run_main, run_module, small_args, tiny_config, tiny_flags, write_ptb_sample

VOCAB = 30


def test_align_by_distance_equals_loops():
  rng = np.random.default_rng(0)
  t, m = 4, 3
  prob = rng.random((2, t, m + t)).astype(np.float32)
  got = np.asarray(attention_maps.align_by_distance(jnp.asarray(prob), m))
  want = np.zeros_like(prob)
  for b in range(2):
    for i in range(t):
      for j in range(m + t):
        d = i + m - j
        if d >= 0:
          want[b, i, d] = prob[b, i, j]
  np.testing.assert_array_equal(got, want)


def _setup(uniform=False, attn_type=0):
  config = tiny_config()
  config.model.update(attn_type=attn_type, tgt_len=5, mem_len=7, dropout=0.0, dropatt=0.0)
  config.eval.update(tgt_len=5, mem_len=7, same_length=False, clamp_len=0, global_batch=2)
  mcfg = eval_steps.eval_model_config(config, default_config.model_config(config, VOCAB))
  params = nn.unbox(models.init_params(models.TransformerXL(mcfg), jax.random.PRNGKey(1)))
  params = jax.tree_util.tree_map(  # sharper attention than at initialisation
      lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
  )
  if uniform:  # q = 0 and u = v = 0: every allowed key gets the same score
    qkv = params["layers"]["attn"]["qkv_net"]["kernel"]
    params["layers"]["attn"]["qkv_net"]["kernel"] = qkv.at[:, :, 0].set(0.0)
    params["r_w_bias"] = jnp.zeros_like(params["r_w_bias"])
    params["r_r_bias"] = jnp.zeros_like(params["r_r_bias"])
  stream = np.random.default_rng(2).integers(1, VOCAB, size=53).astype(np.int32)
  corpus = data.Corpus(
      name="toy",
      unit="word",
      vocab=[str(i) for i in range(VOCAB)],
      boundary_id=0,
      splits={"valid": data.ArraySource(stream)},
  )
  return mcfg, params, corpus


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 2])
def test_averages_and_the_decomposition_sum_to_one_per_head(attn_type):
  mcfg, params, corpus = _setup(attn_type=attn_type)
  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  maps = attention_maps.attention_maps(params, mcfg, corpus, "valid", mesh, 2)
  assert maps["tokens"] == 53
  names = {"prob", "prob_a", "prob_b", "prob_d"} if attn_type == 0 else {"prob"}
  assert set(maps["average"]) == names
  for name, avg in maps["average"].items():
    assert avg.shape == (2, 2, 12)
    np.testing.assert_allclose(avg.sum(-1), 1.0, rtol=1e-5, err_msg=name)
  assert maps["context"].shape == (2, 2, 12)
  np.testing.assert_allclose(maps["context"].sum(-1), 1.0, rtol=1e-5)
  # The decomposition's terms are different distributions from the full one.
  if attn_type == 0:
    assert not np.allclose(maps["average"]["prob_a"], maps["average"]["prob"], atol=1e-3)


@pytest.mark.slow
def test_forced_uniform_attention_has_the_expected_distance_profile():
  """Every allowed key scored alike: query i of a segment whose memory holds
  mlen states attends 1 / (mlen + i + 1) to each distance 0 .. mlen + i."""
  mcfg, params, corpus = _setup(uniform=True)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  maps = attention_maps.attention_maps(params, mcfg, corpus, "valid", mesh, 2)
  t, m, k = 5, 7, 12
  want, n = np.zeros(k), 0
  it = data.EvalIterator(corpus.splits["valid"], 2, t, 0)
  for s, batch in enumerate(it):
    mlen = min(m, s * t)
    for b in range(2):
      for i in range(t):
        if batch["weights"][b, i]:
          want[: mlen + i + 1] += 1.0 / (mlen + i + 1)
          n += 1
  want /= n
  for name in ("prob", "prob_b", "prob_d"):  # term (a) is q.k: also 0 here
    np.testing.assert_allclose(
        maps["average"][name], np.broadcast_to(want, (2, 2, k)), rtol=1e-5, atol=1e-7, err_msg=name
    )


@pytest.mark.slow
def test_attention_command_end_to_end(tmp_path):
  manual = write_ptb_sample(tmp_path / "ptb")
  workdir = tmp_path / "wd"
  tiny = tiny_flags(
      model__tgt_len=None,
      model__mem_len=None,
      train__global_batch=None,
      train__num_steps=2,
      train__warmup_steps=1,
      eval__tgt_len=8,
      eval__mem_len=16,
  )
  r = run_main(small_args(tmp_path, workdir, manual, *tiny))
  assert r.returncode == 0, r.stderr[-3000:]
  out = tmp_path / "maps"
  summary = attention_maps.run(str(workdir), "valid", str(out), max_tokens=200, heads="1:1")
  assert summary["tokens"] >= 200 and summary["mem_len"] == 16
  avg = np.load(out / "average_attention.npy")
  assert avg.shape == (2, 2, 24)
  np.testing.assert_allclose(avg.sum(-1), 1.0, rtol=1e-5)
  assert np.load(out / "decomposition.npy").shape == (3, 2, 2, 24)
  for png in ("average_attention.png", "context_attention.png", "decomposition.png"):
    assert (out / png).stat().st_size > 1000
  listing = json.loads((out / "context_attention.json").read_text())["top_20_percent"]["1:1"]
  assert listing and all(e["token"] is None or isinstance(e["token"], str) for e in listing)
  weights = [e["weight"] for e in listing]
  assert weights == sorted(weights, reverse=True)
  # Bad input: one line, non-zero exit.
  r = run_module(
      "transformer_xl.analysis.attention", f"--workdir={workdir}", f"--out={out}", "--heads=9:0"
  )
  assert r.returncode != 0 and "--heads" in r.stderr and "Traceback" not in r.stderr
