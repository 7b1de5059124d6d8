"""RECL (transformer_xl/analysis/recl/; Dai et al. 2019, Sec. 4.3, Appendix C).

* The definitions on a group whose per-token losses are written by hand, with
  every f, g and RECL value worked out by hand in the comments.
* f, g and the top-r set against a literal, loop-by-loop transcription of
  Appendix C on random losses.
* The context length c means the same for both evaluation methods: a
  one-layer relative-attention model gives the same l(c, t) with
  same_length and mem_len = c as with a sliding window of c.
* The command end to end on two tiny models (configs/ablation_wt2.py:xl and
  :vanilla) trained two steps on a WikiText-format sample; and its errors.
"""

import json
import math
import re

import numpy as np
import pytest

from transformer_xl.analysis import recl
from transformer_xl.analysis import relative_gain as rg

from data_samples import _wiki_zip
from helpers import ablation_config, run_module, tiny_config

# --------------------------------------------------------------------------- #
# A group written by hand: models X and Y, context lengths 10, 20, 30, five
# tokens.  Token 0 is hard; X improves only on it (from 10 to 20), Y only on
# the easy tokens; neither improves from 20 to 30.

LENGTHS = [10, 20, 30]
HAND = np.array(
    [
        # X: c = 10, 20, 30
        [[4, 1, 1, 1, 1], [2, 1, 1, 1, 1], [2, 1, 1, 1, 1]],
        # Y
        [[4, 1, 1, 1, 1], [4, 0.5, 0.5, 0.5, 0.5], [4, 0.5, 0.5, 0.5, 0.5]],
    ],
    np.float64,
)


def test_baseline_is_the_groups_minimum():
  # b(20, t) = min(X, Y) = [2, .5, .5, .5, .5]
  np.testing.assert_array_equal(rg.baseline(HAND)[1], [2, 0.5, 0.5, 0.5, 0.5])


def test_hand_computed_group_at_r_one_fifth():
  # r = 0.2 of 5 tokens: |T| = 1, T(10) = {0} (b(10, 0) = 4 is the largest).
  # f_X(10, 10) = min(4, 4) = 4;  f_X(10, 20) = min(4, 2) = 2
  #   -> g_X(10, 20) = (e^4 - e^2) / e^4 = 1 - e^-2 >= 0.01: go on to (20, 30):
  #   T(20) = {0} (b = 2); f_X(20, 20) = 2, f_X(20, 30) = min(2, 2) = 2 -> g = 0: RECL_X = 20.
  # f_Y(10, 20) = min(4, 4) = 4 -> g_Y(10, 20) = 0 < 0.01: RECL_Y = 10.
  np.testing.assert_array_equal(rg.top_r_positions(rg.baseline(HAND)[0], 0.2), [0])
  np.testing.assert_allclose(rg.relative_loss(HAND, 0, 0, 0.2), [4, 4])
  np.testing.assert_allclose(rg.relative_loss(HAND, 0, 1, 0.2), [2, 4])
  np.testing.assert_allclose(rg.relative_gain(HAND, 0, 1, 0.2), [1 - math.exp(-2), 0])
  res = rg.recl(HAND, LENGTHS, 0.2)
  assert res["recl"] == [20, 10] and res["lower_bound"] == [False, False]
  assert res["walk"] == LENGTHS and res["top_r_count"] == [1, 1]
  np.testing.assert_allclose(res["f_self"], [[4, 2], [4, 2]])
  np.testing.assert_allclose(res["f_next"], [[2, 2], [4, 2]])
  np.testing.assert_allclose(res["gain"], [[1 - math.exp(-2), 0], [0, 0]], atol=1e-15)
  np.testing.assert_allclose(
      res["unnormalized_gain"], [[math.exp(4) - math.exp(2), 0], [0, 0]], atol=1e-12
  )
  np.testing.assert_allclose(res["baseline_ppl"], [math.exp(4), math.exp(2)])


def test_hand_computed_group_at_r_one():
  # r = 1: T = all 5 tokens.  f(10, 10) = mean b(10) = 8/5 = 1.6.
  # f_X(10, 20) = mean [2, 1, 1, 1, 1] = 1.2; f_Y(10, 20) = mean [4, .5, .5, .5, .5] = 1.2
  #   -> both g = 1 - e^-0.4 = 0.3297 >= 0.01: on to (20, 30):
  # f(20, 20) = mean b(20) = 4/5 = 0.8; f_X(20, 30) = mean min(b(20), X(30)) = 0.8, and Y
  #   the same -> g = 0: RECL_X = RECL_Y = 20.
  np.testing.assert_allclose(rg.relative_loss(HAND, 0, 0, 1.0), [1.6, 1.6])
  np.testing.assert_allclose(rg.relative_loss(HAND, 0, 1, 1.0), [1.2, 1.2])
  np.testing.assert_allclose(rg.relative_gain(HAND, 0, 1, 1.0), [1 - math.exp(-0.4)] * 2)
  np.testing.assert_allclose(rg.relative_loss(HAND, 1, 2, 1.0), [0.8, 0.8])
  res = rg.recl(HAND, LENGTHS, 1.0)
  assert res["recl"] == [20, 20] and res["top_r_count"] == [5, 5]
  table = recl.format_table(["X", "Y"], [0.2, 1.0], {0.2: rg.recl(HAND, LENGTHS, 0.2), 1.0: res})
  assert table.splitlines() == [
      "| model | r=0.2 | r=1.0 |",
      "|---|---:|---:|",
      "| X | 20 | 20 |",
      "| Y | 10 | 20 |",
  ]


def test_threshold_is_strict_and_configurable():
  # One model: l(c0) = 1, l(c1) = 1 + ln(0.995): g = 1 - 0.995 = 0.005 < 0.01 -> RECL = c0;
  # with a threshold of 0.004 it goes on, and the walk ends at c1: a lower bound.
  losses = np.array([[[1.0, 1.0], [1 + math.log(0.995)] * 2]])
  np.testing.assert_allclose(rg.relative_gain(losses, 0, 1, 1.0), [0.005])
  assert rg.recl(losses, [4, 8], 1.0)["recl"] == [4]
  res = rg.recl(losses, [4, 8], 1.0, threshold=0.004)
  assert res["recl"] == [8] and res["lower_bound"] == [True]
  assert "| m | >=8 |" in recl.format_table(["m"], [1.0], {1.0: res})


def test_delta_walks_over_evaluated_lengths_only():
  # Length 15 is evaluated but off the walk 10, 20, 30 of delta = 10: X's losses at 15 would
  # stop its walk at 10 (no gain 10 -> 15), but delta = 10 never visits 15.
  x15 = np.concatenate([HAND[:, :1], HAND[:, :1], HAND[:, 1:]], axis=1)  # c = 10, 15, 20, 30
  assert rg.recl(x15, [10, 15, 20, 30], 0.2)["recl"] == [10, 10]
  res = rg.recl(x15, [10, 15, 20, 30], 0.2, delta=10)
  assert res["walk"] == [10, 20, 30] and res["recl"] == [20, 10]
  assert rg.walk_indices([10, 15, 20, 30], 10) == [0, 2, 3]
  with pytest.raises(ValueError, match="not in --context_lengths"):
    rg.walk_indices([10, 25, 30], 10)  # the walk 10, 20, 30 needs 20
  for bad in ([10], [10, 10], [20, 10], [0, 5]):
    with pytest.raises(ValueError):
      rg.walk_indices(bad)


def test_top_r_count_and_ties():
  assert [rg.top_r_count(10, r) for r in (0.1, 0.3, 0.25, 1.0)] == [1, 3, 3, 10]
  assert rg.top_r_count(3, 0.01) == 1
  # ties in b: the earlier position first
  np.testing.assert_array_equal(rg.top_r_positions([1, 5, 2, 5, 5], 0.4), [1, 3])
  for r in (0.0, -0.1, 1.01):
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
      rg.top_r_count(10, r)


def _literal_f(l, c, cp, r):
  """Appendix C (C.2)-(C.4), loop by loop: l[i][c][t] nested lists."""
  n_models, n = len(l), len(l[0][0])
  b = [min(l[i][c][t] for i in range(n_models)) for t in range(n)]
  k = max(1, math.ceil(round(r * n, 9)))
  hard = sorted(range(n), key=lambda t: (-b[t], t))[:k]
  return [sum(min(b[t], l[i][cp][t]) for t in hard) / len(hard) for i in range(n_models)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_f_g_and_top_r_follow_appendix_c_literally(seed):
  rng = np.random.default_rng(seed)
  x = rng.gamma(2.0, 1.5, size=(3, 4, 57))
  x[:, :, ::7] = np.round(x[:, :, ::7])  # some ties
  lst = x.tolist()
  for r in (0.05, 0.1, 0.5, 1.0):
    for c in range(4):
      b = [min(lst[i][c][t] for i in range(3)) for t in range(57)]
      k = max(1, math.ceil(round(r * 57, 9)))
      want_t = sorted(sorted(range(57), key=lambda t: (-b[t], t))[:k])
      np.testing.assert_array_equal(rg.top_r_positions(rg.baseline(x)[c], r), want_t)
      for cp in range(c, 4):
        f = _literal_f(lst, c, cp, r)
        np.testing.assert_allclose(rg.relative_loss(x, c, cp, r), f, rtol=1e-12)
        f0 = _literal_f(lst, c, c, r)
        g = [(math.exp(a) - math.exp(z)) / math.exp(a) for a, z in zip(f0, f)]
        np.testing.assert_allclose(rg.relative_gain(x, c, cp, r), g, rtol=1e-9, atol=1e-12)


def test_bad_losses_are_rejected():
  with pytest.raises(ValueError, match="N models"):
    rg.baseline(np.zeros((2, 3)))
  with pytest.raises(ValueError, match="finite"):
    rg.baseline(np.full((1, 1, 2), np.nan))
  with pytest.raises(ValueError, match="context lengths"):
    rg.recl(HAND, [10, 20], 0.5)


def test_make_request_takes_numbers_or_their_strings():
  req = recl.make_request(["runs/a/", "runs/b"], ["16", 32], "out", r=["0.5", 1.0], delta=16)
  assert req.names == ["a", "b"] and req.lengths == [16, 32] and req.rs == [0.5, 1.0]
  assert req.walk == [0, 1] and req.split == "valid" and req.threshold == rg.DEFAULT_THRESHOLD
  for kwargs, message in (
      ({"context_lengths": ["8", "x"]}, "comma list of ints"),
      ({"r": [0.5, 2]}, "must be in (0, 1]"),
      ({"split": "dev"}, "use train, valid or test"),
      ({"segment_rows": 0}, "must be >= 1"),
      ({"max_tokens": -1}, "must be >= 0"),
  ):
    args = {"workdirs": ["w"], "context_lengths": [2, 4], "out": "o", **kwargs}
    with pytest.raises(recl.UsageError, match=re.escape(message)):
      recl.make_request(**args)


# --------------------------------------------------------------------------- #
# What c means for each evaluation method.


@pytest.mark.slow
def test_context_length_means_the_same_for_segments_and_sliding_windows():
  """One layer, relative attention: with same_length and mem_len = c every
  query sees its own input and the c - 1 before it, the same inputs as a
  sliding window of c (layer 0's memory holds the embeddings, which do not
  depend on context).  With c + 1 or c - 1 on one side they differ."""
  import flax.linen as nn
  import jax

  from transformer_xl import data, default_config, sharding
  from transformer_xl.inference import evaluate
  from transformer_xl.model import models

  vocab = 40
  config = tiny_config()
  config.model.update(n_layer=1, attn_type=0, tgt_len=6, mem_len=6, dropout=0.0, dropatt=0.0)
  config.eval.update(tgt_len=5, clamp_len=0, global_batch=3)
  mcfg = default_config.model_config(config, vocab)
  params = nn.unbox(models.init_params(models.TransformerXL(mcfg), jax.random.PRNGKey(0)))
  params = jax.tree_util.tree_map(
      lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
  )
  stream = np.random.default_rng(0).integers(1, vocab, size=47).astype(np.int32)
  corpus = data.Corpus(
      name="toy",
      unit="word",
      vocab=[str(i) for i in range(vocab)],
      boundary_id=0,
      splits={"valid": data.ArraySource(stream)},
  )
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])

  def nll(method, c):
    cfg = recl.context_config(config, method, c)
    return evaluate.Evaluator(cfg, mcfg, corpus, mesh).token_nll(params, "valid")

  c = 7  # longer than the eval tgt_len (5): the memory carries context over segments
  seg = nll("segments", c)
  np.testing.assert_allclose(seg, nll("sliding", c), rtol=2e-5, atol=2e-5)
  assert not np.allclose(seg[c + 1 :], nll("sliding", c + 1)[c + 1 :], rtol=1e-3)
  assert not np.allclose(seg[c + 1 :], nll("sliding", c - 1)[c + 1 :], rtol=1e-3)
  assert config.eval.method == "segments" and config.eval.mem_len != c  # not modified


# --------------------------------------------------------------------------- #
# The command.


def _run(args, timeout=240):
  """``python -m transformer_xl.analysis.recl ARGS`` on one CPU device (faster),
  logging every compilation (JAX_LOG_COMPILES)."""
  return run_module(
      "transformer_xl.analysis.recl",
      *args,
      devices=1,
      env={"JAX_LOG_COMPILES": "1"},
      timeout=timeout,
  )


@pytest.fixture(scope="module")
def group(tmp_path_factory):
  """Two tiny models of configs/ablation_wt2.py, xl and vanilla, trained two
  steps on a WikiText-format sample; their workdirs."""
  import jax

  from transformer_xl import sharding
  from transformer_xl.data import load_corpus
  from transformer_xl.training import train

  tmp = tmp_path_factory.mktemp("recl")
  _wiki_zip(tmp / "manual", "wikitext-2")
  corpus = load_corpus(
      "wikitext2",
      data_dir=str(tmp / "tfds"),
      manual_dir=str(tmp / "manual"),
      verify_checksums=False,
  )
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  workdirs = []
  for variant in ("xl", "vanilla"):
    config = ablation_config(variant, corpus.vocab_size)
    config.data.update(
        data_dir=str(tmp / "tfds"), manual_dir=str(tmp / "manual"), verify_checksums=False
    )
    workdir = tmp / variant
    workdir.mkdir()
    train.train_and_evaluate(config, str(workdir), corpus, mesh)
    workdirs.append(workdir)
  return tmp, workdirs, corpus


@pytest.mark.slow
def test_recl_command_end_to_end(group, tmp_path):
  _, (xl, vanilla), corpus = group
  out = tmp_path / "out"
  r = _run(
      [
          f"--workdirs={xl},{vanilla}",
          "--split=valid",
          "--context_lengths=2,4,8",
          "--r=0.1,0.5,1.0",
          f"--out={out}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  n = corpus.splits["valid"].num_tokens
  res = json.loads((out / "recl.json").read_text())
  assert res["tokens"] == n and res["context_lengths"] == [2, 4, 8]
  assert [m["name"] for m in res["models"]] == ["xl", "vanilla"]
  assert [m["method"] for m in res["models"]] == ["segments", "sliding"]
  assert set(res["results"]) == {"0.1", "0.5", "1.0"}
  losses = np.load(out / "losses.npz")["losses_NxCxT"]
  assert losses.shape == (2, 3, n) and np.all(np.isfinite(losses))
  for i, m in enumerate(res["models"]):  # Figure 4's curve is exp of the mean loss
    np.testing.assert_allclose(m["ppl"], np.exp(losses[i].astype(np.float64).mean(1)), rtol=1e-5)
  for key, rr in (("0.1", 0.1), ("0.5", 0.5), ("1.0", 1.0)):  # RECL recomputed from the losses
    want = rg.recl(losses, [2, 4, 8], rr)
    got = res["results"][key]
    assert got["recl"] == want["recl"] and got["lower_bound"] == want["lower_bound"]
    assert all(c in (2, 4, 8) for c in got["recl"])
    np.testing.assert_allclose(got["gain"], want["gain"], rtol=1e-9, atol=1e-12)
  for png in (recl.plots.FIGURE_3, recl.plots.FIGURE_4):
    assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  lines = r.stdout.splitlines()
  head = lines.index("| model | r=0.1 | r=0.5 | r=1.0 |")
  rows = lines[head + 2 : head + 4]
  assert [row.split("|")[1].strip() for row in rows] == ["xl", "vanilla"]
  for i, row in enumerate(rows):
    cells = [c.strip() for c in row.strip("|").split("|")[1:]]
    assert cells == [
        (">=" if res["results"][k]["lower_bound"][i] else "") + str(res["results"][k]["recl"][i])
        for k in ("0.1", "0.5", "1.0")
    ], row
  assert res["table"] in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workdirs="], "--workdirs is empty"),
        (["--workdirs=/nonexistent/w1"], "does not exist"),
        (["--workdirs={xl}", "--r=0.1,1.5"], "must be in (0, 1]"),
        (["--workdirs={xl}", "--r=0"], "must be in (0, 1]"),
        (["--workdirs={xl}", "--context_lengths=8,4"], "strictly increasing"),
        (["--workdirs={xl}", "--context_lengths=4,4"], "strictly increasing"),
        (["--workdirs={xl}", "--context_lengths=8"], "at least 2"),
        (["--workdirs={xl}", "--delta=3"], "not in --context_lengths"),
        (["--workdirs={xl},{xl}"], "names must differ"),
        (["--workdirs={tmp}"], "config.json does not exist"),
        (["--workdirs={xl}", "--delta=x"], "--delta"),  # absl's own flag errors
        (["--workdirs={xl}", "--split=dev"], "--split"),
        (["--context_lengths=2,4"], "--workdirs"),
    ],
)
@pytest.mark.slow
def test_recl_command_bad_input(group, args, message):
  tmp, (xl, _), _ = group
  base = {"--context_lengths": "2,4", "--out": str(tmp / "never")}
  args = [a.format(xl=xl, tmp=tmp) for a in args]
  args += [f"{k}={v}" for k, v in base.items() if not any(a.startswith(k) for a in args)]
  r = _run(args, timeout=60)
  assert r.returncode == 2, r.stdout + r.stderr
  err = r.stderr.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], r.stderr
  assert "ompil" not in r.stderr and not (tmp / "never").exists()
