"""Every registered memory variant through the package's paths: the conformance suite.

Parametrised over ``memory.VARIANTS`` (the package's, and the test-only ones
of ``tests/memory_variants/``, registered on import) plus one composition
(the memory tokens beside the compressive memory), each turned on in a small
model by its ``MemoryVariant.example()``: a new variant gets these tests by
registering.  Each checks a property against an independent computation:

* the model's segment-by-segment scores of token streams equal the
  ``Evaluator``'s (its jitted, donated, row-sharded steps over 2 devices);
* a row whose memory is reset (a new stream, a document start) scores its
  next segment as with an empty memory, and a kept row does not;
* generation: each row's tokens are those it gets alone with its seed
  (rows gathered and compacted with their memory, whatever the variant's
  state), and with a decoding cache equal those without one;
* training sharded over 8 simulated devices (data 4 x model 2) with
  gradient accumulation, resumed from a mid-run checkpoint, ends bit for bit
  where the straight run ends (parameters, optimizer state, memory with the
  variant's state), and the checkpoint holds the declared state by name;
* equality with the variant's naive reference where one exists
  (``NAIVE``; the memory tokens are held to their authors' code in
  test_memory_tokens.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from memory_cases import CASES, _tokens, model_config, model_scores, params_of, run_config

from transformer_xl import default_config, sharding
from transformer_xl.inference import evaluate, generate, sampling
from transformer_xl.model import memory, models
from transformer_xl.run import run_dir
from transformer_xl.training import train

import memory_variants  # noqa: F401  (registers the test-only variants)
from helpers import TOY_VOCAB, toy_corpus


@pytest.mark.parametrize("case", list(CASES))
def test_the_evaluator_scores_as_the_model_does(case):
  cfg = model_config(case)
  params = params_of(cfg)
  tokens = _tokens(4, 5)
  want, mem = model_scores(cfg, params, tokens)
  assert np.all(np.isfinite(want))
  assert set(mem.variant_state) == {
      n for v in memory.plan(cfg).variants for n in v.STATE
  }  # the declared state, and nothing else
  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  evaluator = evaluate.Evaluator(run_config(case), cfg, None, mesh)
  assert evaluator.cfg.memory_settings == cfg.memory_settings
  got = evaluator.score(params, tokens)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  assert evaluator.lengths["mem_len"] == 4 and all(
      k in evaluator.lengths for k in memory.describe_eval(cfg)
  )


@pytest.mark.parametrize("case", list(CASES))
def test_a_reset_row_scores_as_a_fresh_memory(case):
  cfg = model_config(case)
  params = params_of(cfg)
  tokens = _tokens(3, 4)
  reset = np.asarray([True, False, True])
  got, _ = model_scores(cfg, params, tokens, reset_at={2: reset})
  fresh, _ = model_scores(cfg, params, tokens[:, 8:])  # rows from segment 2, an empty memory
  kept, _ = model_scores(cfg, params, tokens)
  np.testing.assert_allclose(got[reset, 8:], fresh[reset], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[~reset], kept[~reset])
  # The memory mattered: the kept row would have scored otherwise from empty.
  assert np.abs(kept[~reset, 8:12] - fresh[~reset, :4]).max() > 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_generation_rows_are_independent_and_the_cache_changes_nothing(case):
  cfg = model_config(case)
  params = params_of(cfg)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  plan = memory.plan(cfg)
  rng = np.random.default_rng(3)
  lengths = [6, 6, 6] if plan.whole_segments else [3, 9, 6]
  prompts = [rng.integers(0, TOY_VOCAB, size=n).astype(np.int32) for n in lengths]
  settings = sampling.SamplingSettings(top_k=0, temperature=1.0)
  seeds = [5, 6, 7]
  gen = generate.Generator(cfg, mesh)
  assert gen.use_cache == plan.decode_cache
  batch = gen.generate(params, prompts, 10, settings, seed=seeds)
  assert batch.shape == (3, 10) and batch.min() >= 0 and batch.max() < TOY_VOCAB
  # The row of the shortest prompt (the most padding before it) gets alone what it
  # gets in the batch.
  r = int(np.argmin(lengths))
  alone = gen.generate(params, [prompts[r]], 10, settings, seed=[seeds[r]])
  np.testing.assert_array_equal(alone[0], batch[r])
  if plan.decode_cache:
    plain = generate.Generator(cfg, mesh, use_cache=False)
    np.testing.assert_array_equal(plain.generate(params, prompts, 10, settings, seed=seeds), batch)
  else:
    with pytest.raises(NotImplementedError, match="no decoding cache"):
      models.TransformerXL(cfg).apply(
          {"params": params},
          jnp.zeros((1, 1), jnp.int32),
          memory.init_memory(cfg, 1),
          method=models.TransformerXL.decode,
      )


def _fingerprints(workdir, step) -> dict:
  rec = json.loads(
      (Path(workdir) / "checkpoints" / str(step) / "integrity" / "metadata").read_text()
  )
  return {k: v["fingerprint"] for k, v in rec["leaves"].items()}


@pytest.mark.slow  # two trainings on 8 simulated devices: ~30 s each case
@pytest.mark.parametrize("case", list(CASES))
def test_it_trains_sharded_with_accumulation_and_resumes_exactly(case, tmp_path):
  mesh = sharding.make_mesh((4, 2), ("data", "model"))  # 8 simulated devices
  config = run_config(case, num_steps=6, batch_chunk=2, log_every=1, eval_every=0)
  config.checkpoint.update(every_steps=2, max_to_keep=10)
  straight = tmp_path / "straight"
  train.train_and_evaluate(config, str(straight), toy_corpus(), mesh)
  resumed = tmp_path / "resumed"  # the straight run's workdir as it was after step 4
  shutil.copytree(straight, resumed)
  for path in (resumed / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > 4:
      shutil.rmtree(path)
  train.train_and_evaluate(config, str(resumed), toy_corpus(), mesh)
  got, want = _fingerprints(resumed, 6), _fingerprints(straight, 6)
  assert got == want  # parameters, optimizer state, memory
  mcfg = default_config.model_config(config, TOY_VOCAB)
  state_names = {n for v in memory.plan(mcfg).variants for n in v.STATE}
  assert all(any(n in key for key in got) for n in state_names), sorted(got)
  rows = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
  assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)
  step, params = run_dir.restore_params(str(straight), mcfg, mesh)
  assert step == 6
  evaluator = evaluate.Evaluator(config, mcfg, toy_corpus(), mesh)
  result = evaluator.evaluate(params, "valid")
  assert np.isfinite(result["loss_nats"]) and result["loss_nats"] < 2 * np.log(TOY_VOCAB)


# ---------------------------------------------------------------------------
# The naive references: {case: (cfg, params, tokens_BxT1) -> NLL [B, T]}.


def _naive_xl(cfg, params, tokens):
  from naive_reference import NaiveTransformerXL, flat_params

  naive = NaiveTransformerXL(
      flat_params(jax.device_get(params)),
      n_layer=cfg.n_layer,
      n_head=cfg.n_head,
      d_head=cfg.d_head,
      d_model=cfg.d_model,
      mem_len=cfg.mem_len,
      attn_type=cfg.attn_type,
  )
  t, out = cfg.tgt_len, []
  for s in range((tokens.shape[1] - 1) // t):
    logp = naive.segment(tokens[:, s * t : (s + 1) * t])
    y = tokens[:, s * t + 1 : (s + 1) * t + 1]
    out.append(-np.take_along_axis(logp, y[..., None], -1)[..., 0])
  return np.concatenate(out, axis=1)


def _naive_compressive(cfg, params, tokens):
  from naive_compressive import naive_scores

  return naive_scores(cfg, params, tokens)


NAIVE = {"xl": _naive_xl, "compressive": _naive_compressive}


@pytest.mark.parametrize("case", list(CASES))
def test_it_equals_its_naive_reference(case):
  if case not in NAIVE:
    pytest.skip(f"no naive reference for {case!r}")
  cfg = model_config(case)
  params = params_of(cfg)
  tokens = _tokens(2, 5)
  got, _ = model_scores(cfg, params, tokens)
  np.testing.assert_allclose(got, NAIVE[case](cfg, params, tokens), rtol=1e-4, atol=1e-4)


# A state leaf's name ends in its shape (``knn_keys_NxBxHxSxDh``): these letters have one
# logical axis each, so the layout a variant declares can be checked against its own names.
_NAMED_AXES = {"B": "batch", "H": "heads", "L": "layers"}


@pytest.mark.parametrize("name", sorted(memory.VARIANTS))
def test_a_variants_state_layout_is_the_one_its_names_say(name):
  """Each declared state leaf has one axis per letter of its shape suffix, rows on
  ``batch``, heads on ``heads`` (split over the model mesh axis) and layers on
  ``layers``: a store declared without its heads axis would be held whole by
  every device of the model axis, with the same results (nothing else sees it)."""
  cls = memory.VARIANTS[name]
  for leaf_name, leaf in cls.STATE.items():
    dims = leaf_name.rsplit("_", 1)[1].split("x")
    assert len(dims) == len(leaf.axes), (leaf_name, leaf.axes)
    for dim, axis in zip(dims, leaf.axes):
      if dim in _NAMED_AXES:
        assert axis == _NAMED_AXES[dim], (leaf_name, dim, leaf.axes)
      else:
        assert axis not in _NAMED_AXES.values(), (leaf_name, dim, leaf.axes)
  mesh = sharding.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
  cfg = model_config(name) if name in CASES else None
  if cfg is None or not cls.STATE:
    return
  mem = jax.eval_shape(lambda: memory.init_memory(cfg, 4))
  for leaf_name, spec in mem.shardings(mesh).leaves().items():
    if leaf_name in cls.STATE and "H" in leaf_name.rsplit("_", 1)[1].split("x"):
      h = leaf_name.rsplit("_", 1)[1].split("x").index("H")
      assert spec.spec[h] == "model", (leaf_name, spec.spec)
