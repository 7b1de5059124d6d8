"""The registry of memory variants, and a test-only variant's own properties.

``PooledMemory`` (tests/memory_variants/pooled.py, test only) keeps,
besides the XL memory of mem_len slots, one extra slot per layer holding a
learned summary of the inputs that the XL memory last dropped, with an
auxiliary loss; it is written against ``transformer_xl.model.memory``
alone, and nothing else of the package knows of it.  What every variant
must do (train sharded, resume, evaluate, generate, reset) is the
conformance suite's (test_memory_conformance.py); here: the registry's
refusals, its sown loss in training, and that its extra slot stays hidden
until the XL memory drops an input.
"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config, sharding
from transformer_xl.model import memory, models
from transformer_xl.training import train

import memory_variants  # noqa: F401  (registers the test-only variants)
from helpers import run_python, tiny_config, tiny_model_config, toy_corpus
from memory_variants.pooled import PooledMemory

VOCAB = 64
SIZES = dict(n_token=VOCAB, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32)


def pooled_config(**train_kw):
  c = tiny_config(**train_kw)
  c.model.update(memory=PooledMemory.name, dropout=0.0, dropatt=0.0)
  return c


def test_the_variant_is_chosen_by_the_config_and_unknown_names_are_refused():
  cfg = tiny_model_config(**SIZES, tgt_len=6, mem_len=6, memory=PooledMemory.name)
  assert memory.plan(cfg).variants == (PooledMemory,)
  assert memory.init_memory(cfg, 3).mems_LxBxMxD.shape == (2, 3, 7, 16)
  assert cfg.pos_table_len == 6 + 7  # the learned position tables cover the extra slot
  choices = tuple(sorted(n for n, v in memory.VARIANTS.items() if not v.ADDON))
  assert "tokens" not in choices and "pooled_test" in choices  # an add-on is not model.memory
  for name in ("nope", "tokens"):
    problems = default_config.config_problems({"memory": name})
    assert problems == [f"model.memory={name!r}: use one of {choices}."]


def test_register_refuses_what_would_break_the_memory():
  def variant(name, **attrs):
    return type(f"V_{name}", (memory.MemoryVariant,), {"name": name, **attrs})

  with pytest.raises(ValueError, match="exists"):
    memory.register(variant(PooledMemory.name))
  with pytest.raises(ValueError, match="has no name"):
    memory.register(variant(""))
  with pytest.raises(ValueError, match="already has an array named 'mem_tokens_BxNxD'"):
    memory.register(variant("other", STATE={"mem_tokens_BxNxD": memory.Leaf(("batch",))}))
  with pytest.raises(ValueError, match="already has an array named 'mlen_B'"):
    memory.register(variant("other", STATE={"mlen_B": memory.Leaf(("batch",))}))

  class Mutable:  # settings must be frozen: ModelConfig is hashed
    x: int = 0

  with pytest.raises(ValueError, match="Settings must be a frozen dataclass"):
    memory.register(variant("other", Settings=Mutable))
  assert "other" not in memory.VARIANTS


def test_the_extra_slot_is_hidden_until_the_xl_memory_drops_an_input():
  """Segments 1-3 score as the XL model with the same parameters (4, 8, 8
  valid XL slots, the summary slot masked); segment 3 is the first whose XL
  update drops inputs, so from segment 4 on the summary slot is read."""
  kw = dict(**SIZES, tgt_len=4, mem_len=8, dropout=0.0)
  pooled = models.TransformerXL(tiny_model_config(**kw, memory=PooledMemory.name))
  xl = models.TransformerXL(tiny_model_config(**kw))
  params = nn.unbox(models.init_params(pooled, jax.random.PRNGKey(0)))
  # A summary far from the states (bias 3), so that reading it shows in the scores.
  params["layers"]["pool_proj"]["bias"] = jnp.full_like(params["layers"]["pool_proj"]["bias"], 3.0)
  xl_params = jax.tree_util.tree_map(lambda x: x, params)
  del xl_params["layers"]["pool_proj"]
  assert jax.tree_util.tree_structure(xl_params) == jax.tree_util.tree_structure(
      nn.unbox(models.init_params(xl, jax.random.PRNGKey(0)))
  )
  tokens = np.random.default_rng(1).integers(0, VOCAB, size=(3, 5 * 4 + 1)).astype(np.int32)
  mem_p, mem_x = memory.init_memory(pooled.config, 3), memory.init_memory(xl.config, 3)
  for s in range(5):
    x, y = tokens[:, 4 * s : 4 * s + 4], tokens[:, 4 * s + 1 : 4 * s + 5]
    (nll_p, mem_p), sown = pooled.apply({"params": params}, x, mem_p, y, mutable=["losses"])
    nll_x, mem_x = xl.apply({"params": xl_params}, x, mem_x, y)
    assert sown["losses"]["layers"]["pool_mse"][0].shape == (2,)  # one per layer
    if s < 3:  # 0, 4, 8 valid slots before the segment: the summary slot (0 of 9) is masked
      np.testing.assert_allclose(nll_p, nll_x, rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(mem_p.mems_LxBxMxD[:, :, 1:], mem_x.mems_LxBxMxD, atol=1e-6)
    else:
      assert np.abs(np.asarray(nll_p) - np.asarray(nll_x)).max() > 1e-3
  with pytest.raises(NotImplementedError, match="no decoding cache"):
    pooled.apply({"params": params}, tokens[:, :1], mem_p, None, method=pooled.decode)


def test_its_sown_loss_joins_the_objective_and_the_log(tmp_path):
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  config = pooled_config(num_steps=3, log_every=1, eval_every=0, aux_loss_weight=0.5)
  workdir = tmp_path / "wd"
  train.train_and_evaluate(config, str(workdir), toy_corpus(), mesh)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  logged = [r for r in rows if "train/aux_loss/pool_mse" in r]
  assert len(logged) == 3 and all(np.isfinite(r["train/aux_loss/pool_mse"]) for r in logged)
  for r in logged:  # the objective: the loss plus the weighted auxiliary loss (summed over layers)
    assert r["train/total_loss"] == pytest.approx(
        r["train/loss"] + 0.5 * r["train/aux_loss/pool_mse"], rel=1e-5
    )
  # Step 1 drops only empty (zero) slots, which the zero-bias projection maps to 0 exactly.
  assert logged[0]["train/aux_loss/pool_mse"] == 0
  assert all(r["train/aux_loss/pool_mse"] > 0 for r in logged[1:])


def test_files_name_only_the_settings_that_matter(tmp_path):
  """A workdir written where test-only variants are registered (their
  sections at their defaults) reads in a process where they are not: files
  hold only the memory sections that are not defaults, and two equal models
  are equal whatever is registered."""
  from transformer_xl.run import workdir as wd

  config = tiny_config()
  config.model.memory = "compressive"
  config.model.compressive.update(cmem_len=2, cmem_ratio=2)
  assert "gated_test" in config.model  # registered here, at its defaults
  cfg = default_config.model_config(config, 32)
  assert [name for name, _ in cfg.memory_settings] == ["compressive"]
  wd.save_config(str(tmp_path), config)
  wd.save_model_config(str(tmp_path), cfg, "word", "toy")
  saved = json.loads((tmp_path / "config.json").read_text())
  assert "gated_test" not in saved["model"] and "compressive" not in saved["eval"]
  assert saved["model"]["compressive"]["cmem_len"] == 2
  code = (
      "import sys; from transformer_xl.model import memory; "
      "from transformer_xl.run import workdir as wd; "
      "assert 'gated_test' not in memory.VARIANTS; "
      "c = wd.load_config(sys.argv[1]); m, _ = wd.load_model_config(sys.argv[1]); "
      "assert c.model.compressive.cmem_len == 2 and c.eval.compressive.cmem_len is None; "
      "print(m.memory_settings)"
  )
  r = run_python(["-c", code, str(tmp_path)])
  assert r.returncode == 0, r.stderr[-2000:]
  assert "cmem_len=2" in r.stdout
