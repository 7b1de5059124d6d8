"""Backpropagation through segments with memory tokens (``train.mem_backprop_depth``;
Bulatov et al. 2022): the windows of segments, the gradient through the memory
tokens and not the XL memory, exact resume, sharding, the config's checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.data import example_corpus
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.training import train, train_state, train_step

from helpers import tiny_config, toy_corpus

VOCAB = 64
REPO = Path(__file__).resolve().parents[1]


def _tokens_config(depth, **train_kw):
  c = tiny_config(**{**dict(log_every=1, eval_every=0, warmup_steps=0), **train_kw})
  c.model.update(tgt_len=4, mem_len=4)
  c.model.tokens.update(num_mem_tokens=2, mem_at_end=True)
  c.train.update(mem_backprop_depth=depth)
  return c


# --------------------------------------------------------------------------- #
# The windows.


def test_windows_are_the_base_batches_side_by_side_and_resume_exactly():
  tokens = np.arange(2 * (5 * 3 + 1), dtype=np.int32)  # 2 rows, 5 steps of 3 per epoch
  base = lambda: data.TrainIterator(data.ArraySource(tokens), 2, 3)
  plain = [next(it) for it in [base()] for _ in range(12)]  # over two epochs
  windows = data.SegmentWindows(base(), depth=2)
  got = [next(windows) for _ in range(12)]
  for s, w in enumerate(got):
    assert w["inputs"].shape == (2, 9) and w["reset"].shape == (2, 3)
    for j in range(3):
      src = s - 2 + j
      seg = {k: v[:, 3 * j : 3 * j + 3] for k, v in w.items() if k != "reset"}
      if src < 0:  # padding before the stream: weight 0, no reset
        assert not seg["weights"].any() and not w["reset"][:, j].any()
        continue
      for k in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(seg[k], plain[src][k])
      np.testing.assert_array_equal(w["reset"][:, j], plain[src]["reset"])
  # Resumed at every position (the checkpoint holds the base's state): the same windows.
  it = data.SegmentWindows(base(), depth=2)
  for s in range(12):
    resumed = data.SegmentWindows(base(), depth=2)
    resumed.set_state(it.get_state())
    for w in (next(it), next(resumed)):
      for k in w:
        np.testing.assert_array_equal(w[k], got[s][k])


def test_the_shuffled_sentence_iterator_is_refused():
  with pytest.raises(ValueError, match="ordered training stream"):
    data.SegmentWindows(object(), depth=1)


# --------------------------------------------------------------------------- #
# The gradient.


def _model_and_params(cfg):
  model = models.TransformerXL(cfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(1)
  leaves, tree = jax.tree_util.tree_flatten(params)
  leaves = [x + jnp.asarray(0.2 * rng.normal(size=x.shape), x.dtype) for x in leaves]
  return model, jax.tree_util.tree_unflatten(tree, leaves)


def _naive_last_loss(model, cfg, params, x_BxST, y_BxST, n_seg, cut_tokens):
  """The newest segment's mean NLL after running the window's segments one
  by one with plain model.apply calls (no train-step code); ``cut_tokens``
  stops the gradient of the memory tokens between segments."""
  t = cfg.tgt_len
  memory = memory_lib.init_memory(cfg, x_BxST.shape[0])
  for j in range(n_seg):
    nll_BxT, memory = model.apply(
        {"params": params}, x_BxST[:, j * t : (j + 1) * t], memory, y_BxST[:, j * t : (j + 1) * t]
    )
    if cut_tokens:
      tokens = memory.variant_state["mem_tokens_BxNxD"]
      memory = memory.with_state(mem_tokens_BxNxD=jax.lax.stop_gradient(tokens))
  return jnp.mean(nll_BxT)


def _sgd_gradient(model, params, batch, memory=None, **step_kw):
  """One real train step (make_train_step) with plain SGD at learning rate 1
  from ``params`` (and ``memory``, else an empty one): (the gradient it
  applied, i.e. params - new params; its metrics; the next state)."""
  import optax

  b = batch["inputs"].shape[0]
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  tx = optax.sgd(1.0)
  _, shardings = train_state.abstract_train_state(model, tx, b, mesh)
  state = train_state.create_train_state(model, tx, b, mesh, jax.random.PRNGKey(0), shardings)
  state = state.replace(params=jax.tree_util.tree_map(jnp.copy, params))  # donated
  if memory is not None:
    state = state.replace(memory=memory)
  step = train_step.make_train_step(model, tx, mesh, shardings, 1, 7, **step_kw)
  new_state, metrics = step(state, jax.tree_util.tree_map(jnp.asarray, batch))
  got = jax.tree_util.tree_map(lambda new, old: old - new, new_state.params, params)
  return got, metrics, new_state


@pytest.mark.parametrize("depth", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_the_newest_loss_reaches_the_parameters_through_the_memory_tokens(depth):
  """The train step's gradient equals the naive one of the newest segment's
  loss through depth + 1 segments; the learned initial tokens, read by the
  window's first segment only, get a gradient from the newest segment's loss
  through the written tokens, and none when the tokens are cut between
  segments: the XL memory (mem_len 4) carries no gradient back."""
  config = _tokens_config(depth, global_batch=2, num_steps=1)
  config.model.update(dropout=0.0, dropatt=0.0)
  cfg = default_config.model_config(config, VOCAB)
  model, params = _model_and_params(cfg)
  n_seg, t, b = depth + 1, cfg.tgt_len, 2
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.integers(0, VOCAB, size=(b, n_seg * t)), jnp.int32)
  y = jnp.asarray(rng.integers(0, VOCAB, size=(b, n_seg * t)), jnp.int32)

  # The naive loop, jitted (tracing unrolls it; eager flax calls take far longer).
  loss_and_grad = lambda cut_tokens: jax.jit(
      jax.value_and_grad(lambda p: _naive_last_loss(model, cfg, p, x, y, n_seg, cut_tokens))
  )(params)
  want_loss, want = loss_and_grad(False)
  cut = loss_and_grad(True)[1]
  name = memory_lib.tokens.MEM_TOKENS_PARAM
  assert float(jnp.abs(want[name]).max()) > 1e-4
  np.testing.assert_array_equal(np.asarray(cut[name]), 0.0)

  batch = {
      "inputs": x,
      "targets": y,
      "weights": jnp.ones((b, n_seg * t), jnp.float32),
      "reset": jnp.zeros((b, n_seg), bool).at[:, 0].set(True),
  }
  got, metrics, new_state = _sgd_gradient(model, params, batch, mem_backprop_depth=depth)
  jax.tree_util.tree_map(
      lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6), got, want
  )
  np.testing.assert_allclose(float(metrics["loss"]), float(want_loss), rtol=1e-5)
  # The next window starts one segment later: the memory after the first segment.
  _, first = model.apply({"params": params}, x[:, :t], memory_lib.init_memory(cfg, b), y[:, :t])
  np.testing.assert_allclose(
      np.asarray(new_state.memory.variant_state["mem_tokens_BxNxD"]),
      np.asarray(first.variant_state["mem_tokens_BxNxD"]),
      atol=1e-6,
  )


def test_at_depth_2_the_step_counts_the_newest_segments_loss_only():
  """The fast tier's check of which losses count through 3 segments (the
  gradient at depth 2 is the slow case above): the step's loss is the naive
  mean NLL of the third segment, read after the first two, not of the
  window or of its last two segments."""
  config = _tokens_config(2, global_batch=2, num_steps=1)
  config.model.update(dropout=0.0, dropatt=0.0)
  cfg = default_config.model_config(config, VOCAB)
  model, params = _model_and_params(cfg)
  t, b = cfg.tgt_len, 2
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.integers(0, VOCAB, size=(b, 3 * t)), jnp.int32)
  y = jnp.asarray(rng.integers(0, VOCAB, size=(b, 3 * t)), jnp.int32)
  nll = jax.jit(lambda p: _naive_last_loss(model, cfg, p, x, y, 3, False))(params)
  batch = {
      "inputs": x,
      "targets": y,
      "weights": jnp.ones((b, 3 * t), jnp.float32),
      "reset": jnp.zeros((b, 3), bool).at[:, 0].set(True),
  }
  _, metrics, _ = _sgd_gradient(model, params, batch, mem_backprop_depth=2)
  np.testing.assert_allclose(float(metrics["loss"]), float(nll), rtol=1e-5)


# --------------------------------------------------------------------------- #
# Runs: resume and sharding.


def _fingerprints(workdir, step):
  rec = json.loads(
      (Path(workdir) / "checkpoints" / str(step) / "integrity" / "metadata").read_text()
  )
  return {k: v["fingerprint"] for k, v in rec["leaves"].items()}


@pytest.mark.slow
def test_it_resumes_exactly_and_shards_like_one_device(tmp_path):
  """depth 2 on 8 simulated devices (data 4 x model 2) with 2 micro-batches: a
  run resumed from its step-4 checkpoint ends bit for bit as the straight run
  (the windows read again from the base's saved position); one device gives
  the same losses."""
  config = _tokens_config(2, num_steps=6, batch_chunk=2)
  config.model.update(dropout=0.0, dropatt=0.0)
  config.checkpoint.update(every_steps=2, max_to_keep=10)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  straight = tmp_path / "straight"
  train.train_and_evaluate(config, str(straight), toy_corpus(), mesh)
  resumed = tmp_path / "resumed"
  shutil.copytree(straight, resumed)
  for path in (resumed / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > 4:
      shutil.rmtree(path)
  train.train_and_evaluate(config, str(resumed), toy_corpus(), mesh)
  assert _fingerprints(resumed, 6) == _fingerprints(straight, 6)
  # Resuming with another depth would read segments twice: refused, nothing changed.
  before = sorted(p.name for p in (resumed / "checkpoints").iterdir())
  config.train.update(mem_backprop_depth=1, num_steps=8)
  with pytest.raises(default_config.ConfigError) as err:
    train.train_and_evaluate(config, str(resumed), toy_corpus(), mesh)
  assert "trained with train.mem_backprop_depth=2; this run asks for 1" in str(err.value)
  assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == before
  config.train.update(mem_backprop_depth=2, num_steps=6)

  one = tmp_path / "one"
  single = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  train.train_and_evaluate(config, str(one), toy_corpus(), single)
  rows = lambda wd: [
      json.loads(x)["train/loss"]
      for x in (wd / "metrics.jsonl").read_text().splitlines()
      if "train/loss" in x
  ]
  assert len(rows(straight)) == 6
  np.testing.assert_allclose(rows(straight), rows(one), rtol=1e-4)


def test_the_config_is_checked():
  c = tiny_config()
  c.train.update(mem_backprop_depth=1)
  with pytest.raises(
      default_config.ConfigError,
      match=r"mem_backprop_depth=1 needs a memory that carries the gradient between segments "
      r"\(the associative memory: model\.memory='armt' or memory tokens: "
      r"model\.tokens\.num_mem_tokens > 0\)",
  ):
    default_config.validate(c, jax.device_count())
  c.train.update(mem_backprop_depth=0, bptt_bp=True)
  with pytest.raises(default_config.ConfigError, match=r"bptt_bp=True needs"):
    default_config.validate(c, jax.device_count())
  c.train.update(mem_backprop_depth=-1, bptt_bp=False)
  with pytest.raises(default_config.ConfigError, match=r"must be an integer >= 0"):
    default_config.validate(c, jax.device_count())
  c = _tokens_config(3)
  default_config.validate(c, jax.device_count())


@pytest.mark.parametrize(
    "name, variant, n_token",
    [
        ("rmt_enwik8", "rmt", 204),
        ("rmt_enwik8", "xl", 204),
        ("rmt_wt103", "rmt", 267_735),
        ("rmt_wt103", "xl", 267_735),
    ],
)
def test_the_authors_configs_build_their_models(name, variant, n_token):
  """configs/rmt_*.py: the authors' settings (their csv's rows), and with their
  vocabulary exactly their parameter count (n_all_param)."""
  import functools
  import importlib.util

  spec = importlib.util.spec_from_file_location(name, REPO / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(variant)
  default_config.validate(config, 1)
  mcfg = default_config.model_config(config, n_token)
  init = functools.partial(models.init_params, models.TransformerXL(mcfg))
  shapes = nn.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
  count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
  assert count == config.paper.n_params
  rmt = variant == "rmt"
  assert (config.model.tokens.num_mem_tokens > 0, config.train.mem_backprop_depth == 2) == (
      rmt,
      rmt,
  )
  assert (config.model.mem_len == 0) == rmt


def test_the_gradient_equals_the_authors_through_one_earlier_segment():
  """tests/fixtures/rmt_bptt_depth1.npz (scripts/make_rmt_fixtures.py, their
  MemTransformerLM with --mem_backprop_depth 1): after a first segment, the
  window of segments 1 and 2 from its cache and written tokens; the mean NLL
  of segment 2 and the gradient of every parameter equal theirs to 1e-5."""
  from transformer_xl.convert import rmt

  z = np.load(REPO / "tests" / "fixtures" / "rmt_bptt_depth1.npz")
  hp = rmt.load_rmt_hparams(json.loads(str(z["hparams"])))
  cfg = rmt.model_config_from_rmt_hparams(hp)
  state_dict = {k[3:]: z[k] for k in z.files if k.startswith("sd/")}
  params = jax.tree_util.tree_map(jnp.asarray, rmt.params_from_rmt_state_dict(state_dict, cfg))
  grads = {k: z[f"grad/{k}"] if f"grad/{k}" in z.files else 0 * v for k, v in state_dict.items()}
  # The tied output weight is the embedding's tensor: its gradient is the embedding's.
  grads["crit.out_layers.0.weight"] = grads["word_emb.emb_layers.0.weight"]
  want = rmt.params_from_rmt_state_dict(grads, cfg)  # their gradient in our layout

  model, t = models.TransformerXL(cfg), cfg.tgt_len
  stream = jnp.asarray(z["stream_BxL"])
  b = stream.shape[0]
  x, y = stream[:, :-1], stream[:, 1:]
  _, memory = model.apply({"params": params}, x[:, :t], memory_lib.init_memory(cfg, b), y[:, :t])

  batch = {
      "inputs": x[:, t : 3 * t],
      "targets": y[:, t : 3 * t],
      "weights": jnp.ones((b, 2 * t), jnp.float32),
      "reset": jnp.zeros((b, 2), bool),
  }
  got, metrics, _ = _sgd_gradient(model, params, batch, memory, mem_backprop_depth=1)
  np.testing.assert_allclose(float(metrics["loss"]), float(z["loss"]), rtol=1e-5)
  flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
  for path, w in jax.tree_util.tree_flatten_with_path(want)[0]:
    np.testing.assert_allclose(flat_got[path], w, atol=1e-5, err_msg=jax.tree_util.keystr(path))
  assert (
      float(np.abs(flat_got[(jax.tree_util.DictKey(memory_lib.tokens.MEM_TOKENS_PARAM),)]).max())
      == 0
  )


# --------------------------------------------------------------------------- #
# The synthetic tasks: one step per whole example (the authors' train_synthetic.py).


def _copy_config(depth, bptt_bp=True, memory="tokens"):
  c = tiny_config(num_steps=2, log_every=1, eval_every=0, warmup_steps=0, global_batch=4)
  c.data.update(
      dataset="synthetic:copy",
      synthetic_seq_len=3,
      synthetic_num_tokens=6,
      synthetic_train_size=40,
      synthetic_valid_size=8,
      synthetic_test_size=8,
  )
  c.model.update(mem_len=0 if memory == "tokens" else 3, tgt_len=3, dropout=0.0, dropatt=0.0)
  c.model.tokens.num_mem_tokens = 2 if memory == "tokens" else 0
  c.eval.update(tgt_len=3, mem_len=c.model.mem_len, global_batch=4, same_length=False)
  c.train.update(mem_backprop_depth=depth, bptt_bp=bptt_bp)
  return c


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["tokens", "xl"])
def test_a_synthetic_example_is_one_step_through_all_its_segments(tmp_path, memory):
  """With a synthetic task the window is a whole example (its segments side
  by side, example_corpus.ExampleWindows): the step's gradient is the one of the
  whole answer's loss with the memory tokens carried, with their gradient,
  through every segment (a naive loop of model.apply calls), or with the XL
  cache (stop-gradient) carried the same way: one step per example for every
  memory (the studies' equal optimizer steps); a depth other than
  segments - 1, or without bptt_bp, is refused in one line."""

  config = _copy_config(depth=0, memory=memory)
  corpus = data.load_configured(config.data.to_dict())
  base = example_corpus.ExampleIterator(corpus, "train", 4, 3)
  n_seg = base.segments
  assert n_seg > 2
  config.train.update(mem_backprop_depth=n_seg - 1)
  default_config.validate(config, 1)
  cfg = default_config.model_config(config, corpus.vocab_size)
  model, params = _model_and_params(cfg)
  segs = [next(base) for _ in range(n_seg)]

  def naive(params):
    memory, total, weight = memory_lib.init_memory(cfg, 4), 0.0, 0.0
    for seg in segs:
      nll, memory = model.apply(
          {"params": params}, seg["inputs"], memory, seg["targets"], reset_B=seg["reset"]
      )
      total, weight = total + jnp.sum(nll * seg["weights"]), weight + seg["weights"].sum()
    return total / weight

  want_loss, want = jax.jit(jax.value_and_grad(naive))(params)  # the loop, traced
  window = next(
      example_corpus.ExampleWindows(example_corpus.ExampleIterator(corpus, "train", 4, 3))
  )
  got, metrics, _ = _sgd_gradient(
      model, params, window, mem_backprop_depth=n_seg - 1, bptt_bp=True, window_advance=n_seg
  )
  jax.tree_util.tree_map(
      lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=1e-6), got, want
  )
  np.testing.assert_allclose(float(metrics["loss"]), float(want_loss), rtol=1e-5)

  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  for depth, bptt_bp in ((1, True), (n_seg - 1, False)):
    bad = _copy_config(depth, bptt_bp, memory)
    match = rf"set train.mem_backprop_depth={n_seg - 1}"
    if memory == "xl" and not bptt_bp:  # refused with the config: a stop-gradient memory
      with pytest.raises(default_config.ConfigError, match="one step per example"):
        default_config.validate(bad, 1)
      continue
    with pytest.raises(default_config.ConfigError, match=match):
      train.train_and_evaluate(bad, str(tmp_path / f"bad{depth}"), corpus, mesh)
  good = _copy_config(n_seg - 1, memory=memory)
  train.train_and_evaluate(good, str(tmp_path / "good"), corpus, mesh)
  rows = [json.loads(x) for x in (tmp_path / "good" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
