"""Memory tokens (Bulatov et al. 2022, the Recurrent Memory Transformer).

Parity with the authors' code (booydar/LM-RMT ``pytorch/mem_transformer.py``)
through fixtures made by running it (scripts/make_rmt_fixtures.py; committed
under tests/fixtures/lm_rmt_*.npz): per-token NLLs and the written tokens of
four consecutive segments, to 1e-5.  Then what their code has no run for:
document resets, the gradient of the learned initial tokens, the config's
refusals, and the command line.  Sharded training with exact resume is
the conformance suite's (test_memory_conformance.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config
from transformer_xl.cli import modes
from transformer_xl.convert import rmt
from transformer_xl.model import config as model_config
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

from helpers import (
    read_metrics,
    run_main,
    run_module,
    score_and_generate,
    small_args,
    tiny_text_config,
    write_corpus,
    write_ptb_sample,
)

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(p.stem for p in FIXTURES.glob("lm_rmt_*.npz"))


def _load(name: str):
  """(cfg, params, fixture) of a fixture, converted by transformer_xl.convert.rmt."""
  z = np.load(FIXTURES / f"{name}.npz")
  hp = rmt.load_rmt_hparams(json.loads(str(z["hparams"])))
  cfg = rmt.model_config_from_rmt_hparams(hp)
  state = {k[len("sd/") :]: z[k] for k in z.files if k.startswith("sd/")}
  return cfg, rmt.params_from_rmt_state_dict(state, cfg), z


def _n_tokens(cfg) -> int:
  return memory_lib.tokens.MemoryTokens.settings(cfg).num_mem_tokens


def _step(cfg):
  model = models.TransformerXL(cfg)
  return jax.jit(
      lambda params, tokens, memory, targets, reset: model.apply(
          {"params": params}, tokens, memory, targets, reset_B=reset
      )
  )


def _run(cfg, params, inputs_SxBxT, targets_SxBxT, resets=None):
  """Our NLLs [S, B, T] and written tokens [S, B, N, D] over the segments."""
  step, b = _step(cfg), inputs_SxBxT.shape[1]
  memory, nlls, written = memory_lib.init_memory(cfg, b), [], []
  for s in range(len(inputs_SxBxT)):
    reset = np.zeros(b, bool) if resets is None else resets[s]
    nll, memory = step(params, inputs_SxBxT[s], memory, targets_SxBxT[s], reset)
    nlls.append(np.asarray(nll))
    tokens = memory.variant_state.get("mem_tokens_BxNxD")
    written.append(np.zeros((b, 0, cfg.d_model)) if tokens is None else np.asarray(tokens))
  return np.stack(nlls), np.stack(written)


def test_the_fixtures_cover_the_authors_settings():
  hps = [json.loads(str(np.load(FIXTURES / f"{c}.npz")["hparams"])) for c in CASES]
  seen = {(h["num_mem_tokens"] > 0, h["mem_len"] > 0, h["mem_at_end"]) for h in hps}
  assert {(True, True, True), (True, False, True), (True, True, False), (False, True, True)} <= seen
  assert any(h["read_mem_from_cache"] for h in hps) and any(h["same_length"] for h in hps)
  assert any(h["cutoffs"] for h in hps)
  assert sum((FIXTURES / f"{c}.npz").stat().st_size for c in CASES) < 400_000


@pytest.mark.parametrize("name", CASES)
def test_nlls_and_written_tokens_equal_the_authors(name):
  """Four segments carrying the XL cache and the tokens as their train.py's
  evaluate(): the NLLs and the written tokens to 1e-5 (lm_rmt_zero: their code
  without tokens, Transformer-XL)."""
  cfg, params, z = _load(name)
  nll, written = _run(cfg, params, z["inputs_SxBxT"], z["targets_SxBxT"])
  np.testing.assert_allclose(nll, z["nll_SxBxT"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(written, z["written_SxBxNxD"], atol=1e-5, rtol=0)


def test_gradients_equal_the_authors():
  """The gradients of a segment's summed NLL for every parameter, to 1e-5 (the
  fixture's largest is 5.5): segment 0 reads the learned tokens (they get a
  gradient), segment 1 the written ones, detached as in their train.py (the
  learned tokens get none)."""
  from transformer_xl.convert.pytorch import state_dict_from_params

  cfg, params, z = _load("lm_rmt_not_at_end")
  model = models.TransformerXL(cfg)
  x, y = z["inputs_SxBxT"], z["targets_SxBxT"]
  memory = memory_lib.init_memory(cfg, 2)
  xl_cfg = cfg.with_memory("tokens", num_mem_tokens=0)
  grad_fn = jax.jit(
      jax.grad(lambda p, memory, x, y: model.apply({"params": p}, x, memory, y)[0].sum())
  )
  for s in range(2):
    grads = jax.tree.map(np.asarray, grad_fn(params, memory, x[s], y[s]))
    ours = state_dict_from_params({k: v for k, v in grads.items() if k != "mem_tokens"}, xl_cfg)
    ours["mem_tokens"] = grads["mem_tokens"][:, None, :]
    theirs = {k[len(f"grad{s}/") :]: z[k] for k in z.files if k.startswith(f"grad{s}/")}
    assert len(theirs) > 20 and set(theirs) <= set(ours)
    for name, want in theirs.items():
      np.testing.assert_allclose(ours[name], want, atol=1e-5, rtol=0, err_msg=f"{s} {name}")
    assert (np.abs(theirs["mem_tokens"]).max() > 1e-3) == (s == 0)
    _, memory = _step(cfg)(params, x[s], memory, y[s], np.zeros(2, bool))


def test_their_position_terms_of_later_keys_are_needed(monkeypatch):
  """Injected fault: without ``future_position_scores`` (the shift's leftovers of
  our static layout instead of theirs) the segments whose cache is not full
  (mlen < mem_len: 0 and 8 of 12) differ from the authors'.  (With N = 2 the
  one such key is next to its query, where both shifts leave 0: this fixture has
  N = 3.)"""
  cfg, params, z = _load("lm_rmt_not_at_end")
  monkeypatch.setattr(memory_lib.tokens, "future_position_scores", lambda raw, bd, *a: bd)
  nll, written = _run(cfg, params, z["inputs_SxBxT"], z["targets_SxBxT"])
  # The tokens written at the read positions: 7e-4 off (the parity tolerance: 1e-5).
  assert np.abs(written[:2] - z["written_SxBxNxD"][:2]).max(axis=(1, 2, 3)).min() > 1e-4


def test_no_memory_token_is_transformer_xl_with_its_pytree():
  """num_mem_tokens=0: no parameter, the memory's two fields (the checkpoints'
  pytree), and the authors' Transformer-XL numbers (lm_rmt_zero above)."""
  cfg, params, _ = _load("lm_rmt_zero")
  assert _n_tokens(cfg) == 0 and "mem_tokens" not in params
  assert memory_lib.plan(cfg).variants == (memory_lib.VARIANTS["xl"],)
  memory = memory_lib.init_memory(cfg, 2)
  assert [k.name for k in jax.tree_util.tree_flatten_with_path(memory)[0][0][0]] == ["mems_LxBxMxD"]
  assert len(jax.tree.leaves(memory)) == 2
  init = lambda key: models.init_params(models.TransformerXL(cfg), key)
  assert "mem_tokens" not in jax.eval_shape(init, jax.random.PRNGKey(0))


def test_the_memory_carries_the_tokens_with_its_shardings():
  cfg, _, _ = _load("lm_rmt_mem")
  memory = memory_lib.init_memory(cfg, 8)
  tokens, fresh = (
      memory.variant_state["mem_tokens_BxNxD"],
      memory.variant_state["mem_tokens_fresh_B"],
  )
  assert tokens.shape == (8, 2, 16) and bool(fresh.all())
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(4, 1), ("data", "model"))
  shardings = memory_lib.shardings(cfg, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(memory)
  placed = jax.device_put(memory, shardings)
  shards = placed.variant_state["mem_tokens_BxNxD"].addressable_shards
  assert {s.data.shape for s in shards} == {(2, 2, 16)}
  halves = memory.map_rows(lambda x, axis: jnp.take(x, jnp.arange(4), axis=axis)).variant_state
  assert halves["mem_tokens_BxNxD"].shape == (4, 2, 16)
  assert halves["mem_tokens_fresh_B"].shape == (4,)


def test_a_reset_row_reads_the_initial_tokens_again():
  """Row 1 reset at segment 2 goes on as the same inputs read alone from a new
  stream (the cache emptied, the learned initial tokens read); row 0 is left
  as it was."""
  cfg, params, z = _load("lm_rmt_mem")
  x, y = z["inputs_SxBxT"], z["targets_SxBxT"]
  resets = np.zeros((4, 2), bool)
  resets[2, 1] = True
  nll, written = _run(cfg, params, x, y, resets)
  alone_nll, alone_written = _run(cfg, params, x[2:, 1:], y[2:, 1:])
  np.testing.assert_allclose(nll[2:, 1:], alone_nll, atol=1e-6, rtol=0)
  np.testing.assert_allclose(written[2:, 1:], alone_written, atol=1e-6, rtol=0)
  np.testing.assert_allclose(nll[:, 0], z["nll_SxBxT"][:, 0], atol=1e-5, rtol=0)
  assert np.abs(nll[2:, 1] - z["nll_SxBxT"][2:, 1]).max() > 1e-3  # the reset mattered


def test_the_initial_tokens_learn_from_fresh_rows_only():
  """A segment that reads carried tokens (data, as between training steps)
  gives the parameter ``mem_tokens`` no gradient, unless its row was reset
  there."""
  cfg, params, z = _load("lm_rmt_mem")
  model = models.TransformerXL(cfg)
  x, y = z["inputs_SxBxT"], z["targets_SxBxT"]
  _, memory = _step(cfg)(params, x[0], memory_lib.init_memory(cfg, 2), y[0], np.zeros(2, bool))

  @jax.jit
  def grad_of_tokens(memory, tokens, targets, reset):
    loss = lambda p: model.apply({"params": p}, tokens, memory, targets, reset_B=reset)[0].sum()
    return jax.grad(loss)(params)["mem_tokens"]

  no_reset = np.zeros(2, bool)
  fresh = memory_lib.init_memory(cfg, 2)
  assert np.abs(grad_of_tokens(fresh, x[0], y[0], no_reset)).max() > 1e-4
  assert not np.asarray(grad_of_tokens(memory, x[1], y[1], no_reset)).any()
  assert np.abs(grad_of_tokens(memory, x[1], y[1], np.array([False, True]))).max() > 1e-4


def test_the_config_refuses_what_memory_tokens_do_not_support():
  def problems(tokens=None, **kw):
    section = {"num_mem_tokens": 2, **(tokens or {})}
    return model_config.config_problems({"n_token": 10, "tokens": section, **kw})

  assert problems() == [] and problems({"mem_at_end": False}, mem_len=0) == []
  assert problems({"num_mem_tokens": -1})[0].startswith("model.tokens.num_mem_tokens=-1 must be")
  assert "model.attn_type=0" in problems(attn_type=1)[0]
  assert "attention_impl='xla'" in problems(attention_impl="pallas")[0]
  assert "model.attn_block=0" in problems(attn_block=16)[0]
  # Beside the compressive memory (the layers' segment is then tgt_len + 2 N long).
  assert problems(memory="compressive", compressive={"cmem_len": 2, "cmem_ratio": 2}) == []
  assert problems({"read_mem_from_cache": "yes"})[0].startswith("model.tokens.read_mem_from_cache=")
  assert all("\n" not in p for p in problems(attn_type=1, attn_block=16))
  c = default_config.get_config()
  c.model.tokens.num_mem_tokens = 2
  c.eval.update(method="sliding")
  c.data.update(documents="reset")
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(c, jax.device_count(), training=False)
  assert "eval.method='sliding'" in str(err.value) and "data.documents='reset'" in str(err.value)
  c.eval.update(method="segments", documents="whole")
  c.data.update(documents="stream")
  with pytest.raises(default_config.ConfigError, match=r"eval\.documents='whole'"):
    default_config.validate(c, jax.device_count(), training=False)


def test_the_converter_checks_the_fork_tensors():
  cfg, _, z = _load("lm_rmt_mem")
  state = {k[len("sd/") :]: z[k] for k in z.files if k.startswith("sd/")}
  with pytest.raises(rmt.ConvertError, match="lacks 'mem_tokens'"):
    rmt.params_from_rmt_state_dict({k: v for k, v in state.items() if k != "mem_tokens"}, cfg)
  with pytest.raises(rmt.ConvertError, match="num_mem_tokens=0 in the hparams"):
    rmt.params_from_rmt_state_dict(state, cfg.with_memory("tokens", num_mem_tokens=0))
  with pytest.raises(rmt.ConvertError, match="num_mem_tokens"):
    rmt.load_rmt_hparams({**json.loads(str(z["hparams"])), "num_mem_tokens": -2})
  from transformer_xl.convert import hparams

  with pytest.raises(rmt.ConvertError, match="no memory add-on"):  # not to the reference
    hparams.hparams_from_model_config(cfg)


@pytest.mark.parametrize("name", ["lm_rmt_mem", "lm_rmt_adaptive"])
def test_the_command_line_converts_the_authors_checkpoint_and_scores_as_they_do(name, tmp_path):
  """``python -m transformer_xl.convert --from=pytorch`` with the fork's
  hparams (num_mem_tokens, mem_at_end, read_mem_from_cache) and state dict
  (an .npz of their names): a workdir whose ``--mode=score`` of the
  fixture's streams gives their NLLs (four segments carrying the cache and
  the tokens), as the Python path does (``rmt.*``, the test above)."""
  z = np.load(FIXTURES / f"{name}.npz")
  np.savez(tmp_path / "sd.npz", **{k[len("sd/") :]: z[k] for k in z.files if k.startswith("sd/")})
  (tmp_path / "hparams.json").write_text(str(z["hparams"]))
  inputs, targets = z["inputs_SxBxT"], z["targets_SxBxT"]
  stream = np.concatenate([*inputs, targets[-1][:, -1:]], axis=1)  # [B, S T + 1]
  np.testing.assert_array_equal(stream[:, 1:], np.concatenate(list(targets), axis=1))
  np.save(tmp_path / "tokens.npy", stream.astype(np.int32))
  workdir = tmp_path / "wd"
  r = run_module(
      "transformer_xl.convert",
      "--from=pytorch",
      f"--checkpoint={tmp_path / 'sd.npz'}",
      f"--hparams={tmp_path / 'hparams.json'}",
      f"--workdir={workdir}",
      devices=1,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_module(
      "transformer_xl.main",
      f"--workdir={workdir}",
      "--mode=score",
      f"--tokens={tmp_path / 'tokens.npy'}",
      f"--out={tmp_path / 'nll.npy'}",
      devices=1,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  want = np.concatenate(list(z["nll_SxBxT"]), axis=1)
  np.testing.assert_allclose(np.load(tmp_path / "nll.npy"), want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------
# The command line: train, eval, score and generate with --config.model.tokens.num_mem_tokens.


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(root, workdir, config): a model with 2 memory tokens and an XL cache,
  trained for 4 steps through ``modes.run`` on one's own text."""
  root = tmp_path_factory.mktemp("rmt")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  config.model.tokens.num_mem_tokens = 2
  config.eval.update(same_length=False)
  config.train.update(num_steps=4)
  config.checkpoint.update(every_steps=4)
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  return root, workdir, config


@pytest.mark.slow
def test_train_saves_the_tokens_and_eval_dynamic_eval_score_generate_run(trained, tmp_path):
  _, workdir, config = trained
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  assert (saved["tokens"]["num_mem_tokens"], saved["tokens"]["mem_at_end"]) == (2, True)
  modes.run(modes.Request(mode="eval", workdir=str(workdir), config=config))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert all(np.isfinite(results[s]["loss_nats"]) for s in ("valid", "test"))
  dynamic = config.copy_and_resolve_references()  # dynamic evaluation carries the tokens too
  dynamic.eval.dynamic.update(lr=3e-3, stats_tokens=64)
  modes.run(modes.Request(mode="eval", workdir=str(workdir), config=dynamic))
  adapted = json.loads((workdir / "eval_results_dynamic.json").read_text())
  for s in ("valid", "test"):
    assert np.isfinite(adapted[s]["loss_nats"]) and adapted[s]["tokens"] == results[s]["tokens"]
  score_and_generate(workdir, config, tmp_path, num_tokens=12)


def test_generation_draws_each_token_from_the_scored_sequence():
  """Without a decoding cache (refused: it would write the tokens at every
  pass), each token's distribution is the one that scoring prompt + the
  tokens before it in segments of tgt_len from the start gives (the open
  segment run again per token, committed when full: 7 + 9 tokens cross two
  segment ends of 5)."""
  from transformer_xl import sharding
  from transformer_xl.inference import generate, sampling

  cfg, params, z = _load("lm_rmt_mem")
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  gen = generate.Generator(cfg, mesh, use_cache=True)
  assert not gen.use_cache
  prompt = z["inputs_SxBxT"][:2, 0].reshape(-1)[:7]
  steps = list(gen.stream(params, [prompt], 9, sampling.SamplingSettings(top_k=0), log_probs=True))
  seq = np.concatenate([prompt, [int(tok[0]) for tok, _ in steps]])
  model, memory, t = models.TransformerXL(cfg), memory_lib.init_memory(cfg, 1), cfg.tgt_len
  logps = []
  for s in range(0, len(seq) - 1, t):
    hidden, memory = model.apply(
        {"params": params}, seq[None, s : s + t], memory, method=model.hidden
    )
    logps.append(model.apply({"params": params}, hidden, method=model.log_probs)[0])
  want = np.concatenate(logps)[len(prompt) - 1 : len(seq) - 1]
  np.testing.assert_allclose(np.stack([lp[0] for _, lp in steps]), want, atol=2e-5)
  with pytest.raises(ValueError, match="one length"):
    list(gen.stream(params, [prompt, prompt[:3]], 2))


@pytest.mark.slow
def test_the_command_line_trains_with_memory_tokens(tmp_path):
  """One process: ``--config.model.tokens.num_mem_tokens=2`` with the quickstart config."""
  manual = write_ptb_sample(tmp_path / "ptb")
  tiny = [
      "--config.model.n_layer=2",
      "--config.model.d_model=32",
      "--config.model.n_head=2",
      "--config.model.d_head=16",
      "--config.model.d_inner=64",
      "--config.model.tgt_len=8",
      "--config.model.mem_len=8",
      "--config.model.tokens.num_mem_tokens=2",
      "--config.model.tokens.mem_at_end=False",
      "--config.train.global_batch=8",
      "--config.train.log_every=1",
      "--config.train.eval_every=0",
      "--config.train.num_steps=2",
      "--config.train.warmup_steps=1",
      "--config.checkpoint.every_steps=2",
  ]
  workdir = tmp_path / "wd"
  r = run_main(small_args(tmp_path, workdir, manual, *tiny))
  assert r.returncode == 0, r.stderr[-3000:]
  assert sorted(read_metrics(workdir)) == [1, 2]
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  assert (saved["tokens"]["num_mem_tokens"], saved["tokens"]["mem_at_end"]) == (2, False)


def test_an_unsupported_setting_is_refused_in_one_line(tmp_path):
  """Before anything is compiled (or read): the config's ``error:`` with one
  problem line naming the setting and the fix."""
  other = tiny_text_config(tmp_path / "nowhere", tmp_path / "tfds")
  other.model.tokens.num_mem_tokens = 2
  other.eval.update(method="sliding")
  workdir = tmp_path / "wd"
  with pytest.raises(SystemExit) as err:
    modes.run(modes.Request(mode="eval", workdir=str(workdir), config=other))
  message = str(err.value.code)
  head, *problems = message.splitlines()
  assert head == "error: Invalid config:" and len(problems) == 1, message
  assert "eval.method='sliding'" in problems[0] and "set eval.method='segments'" in problems[0]
