"""Every paper config starts, prints its parameter count beside the paper's,
and trains two steps on a tiny canonical-format sample (shapes overridden down)."""

import re

import pytest

from transformer_xl.data import load_corpus

from data_samples import _WIKI, _wiki_zip
from helpers import CONFIGS, ablation_config, load_config, run_main, tiny_flags

pytestmark = pytest.mark.slow  # end to end: every config trains


def tiny_overrides(n_token, n_clusters):
  """Small shapes; cutoffs spread over this sample's vocabulary."""
  step = n_token // (n_clusters + 2)
  cutoffs = tuple(step * (i + 1) for i in range(n_clusters))
  return tiny_flags(
      model__d_model=64,
      model__d_head=32,
      model__cutoffs=cutoffs,
      train__num_steps=2,
      train__warmup_steps=0,
      eval__global_batch=8,
      eval__tgt_len=8,
      eval__mem_len=16,
      eval__clamp_len=4,
  )


# A compressive config's lengths shrunk with the shapes: multiples of every
# cmem_ratio of the paper configs (2, 3, 4).
COMPRESSIVE_TINY = [
    "--config.model.tgt_len=12",
    "--config.model.compressive.cmem_len=6",
    "--config.eval.tgt_len=12",
    "--config.eval.mem_len=12",
    "--config.eval.compressive.cmem_len=12",
]


def check_start(tmp_path, name, manual, dataset, extra=()):
  config = load_config(name)
  data = [
      f"--config.data.manual_dir={manual}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.data.verify_checksums=False",
  ]
  corpus = load_corpus(
      dataset, data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False
  )
  overrides = tiny_overrides(corpus.vocab_size, len(config.model.cutoffs))
  workdir = tmp_path / name
  args = [f"--config={CONFIGS / (name + '.py')}", f"--workdir={workdir}", *data, *overrides]
  r = run_main([*args, *extra])
  assert r.returncode == 0, r.stderr[-3000:]
  if config.paper.n_params:
    paper = f"paper: {config.paper.n_params / 1e6:.0f}M"
  else:
    paper = "paper: no parameter count reported"
  line = next(l for l in r.stdout.splitlines() if l.startswith("Model:"))
  assert paper in line and config.paper.result in line, line
  assert re.search(r"Model: [\d,]+ parameters", line)
  metrics = [l for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert len(metrics) == 2  # two training steps logged
  assert (workdir / "checkpoints" / "2").is_dir()
  return workdir, r


def test_compressive_paper_configs_hold_the_papers_numbers():
  """The settings of Rae et al. 2020 (Sec. 5, 5.1-5.3, Appendix B) as the
  configs' docstrings state them; the parameter counts that the docstrings
  state are those of the models the configs build."""
  import functools

  import flax
  import jax
  import numpy as np

  from transformer_xl import default_config
  from transformer_xl.model import models

  want = {  # name: (model fields, eval fields, train fields, n_token, parameters)
      "compressive_enwik8": (
          dict(
              n_layer=24,
              d_model=1024,
              n_head=8,
              d_inner=3072,
              tgt_len=768,
              mem_len=768,
              compressive=dict(cmem_len=1152, cmem_ratio=3, cmem_fn="conv"),
          ),
          dict(mem_len=768, compressive=dict(cmem_len=3072)),
          dict(warmup_steps=4000, num_steps=104_000, learning_rate=3e-4, min_lr=1e-6, clip=0.1),
          256,
          352_807_168,
      ),
      "compressive_wt103": (
          dict(
              n_layer=18,
              d_model=1024,
              n_head=16,
              d_inner=4096,
              tgt_len=512,
              mem_len=512,
              compressive=dict(cmem_len=512, cmem_ratio=4, cmem_fn="conv"),
          ),
          dict(mem_len=500, compressive=dict(cmem_len=1500)),
          dict(
              warmup_steps=16_000,
              num_steps=516_000,
              learning_rate=3e-4,
              min_lr=1e-6,
              clip=0.1,
              global_batch=128,
          ),
          267_735,
          360_686_410,
      ),
      "compressive_pg19": (
          dict(
              n_layer=36,
              tgt_len=512,
              mem_len=512,
              compressive=dict(cmem_len=512, cmem_ratio=2, cmem_fn="conv"),
          ),
          dict(mem_len=512, compressive=dict(cmem_len=None)),
          dict(
              warmup_steps=16_000,
              num_steps=516_000,
              learning_rate=3e-4,
              min_lr=1e-6,
              clip=0.1,
              global_batch=512,
          ),
          32_000,
          599_401_728,
      ),
  }
  for name, (model, evals, train, n_token, n_params) in want.items():
    config = load_config(name)
    assert config.model.memory == "compressive"
    for section, fields in (("model", model), ("eval", evals), ("train", train)):
      got = {k: config[section].to_dict()[k] for k in fields}  # sections as dicts
      assert got == fields, (name, section)
    default_config.validate(config, 1)
    mc = default_config.model_config(config, n_token)
    init = functools.partial(models.init_params, models.TransformerXL(mc))
    shapes = flax.linen.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    assert count == n_params, name
    assert f"{n_params:,}" in (CONFIGS / f"{name}.py").read_text(), name


@pytest.mark.parametrize("name", ["wt103_base", "wt103_large", "compressive_wt103"])
def test_wt103_configs_start_and_train_two_steps(tmp_path, name):
  manual = tmp_path / "manual"
  _wiki_zip(manual, "wikitext-103", _WIKI)
  extra = COMPRESSIVE_TINY if name.startswith("compressive") else ()
  check_start(tmp_path, name, manual, "wikitext103", extra)


def test_compressive_enwik8_config_starts_trains_and_evaluates(tmp_path):
  """The paper config end to end at tiny shapes: training logs the
  attention-reconstruction loss, and evaluation runs with its larger
  compressed memory (eval.compressive.cmem_len) on the trained checkpoint."""
  import json

  from data_samples import _enwik8_bytes, _zip

  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "enwik8.zip", {"enwik8": _enwik8_bytes(12_000)})
  workdir, _ = check_start(tmp_path, "compressive_enwik8", manual, "enwik8", COMPRESSIVE_TINY)
  logged = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert all("train/aux_loss/attn_recon" in m for m in logged)
  r = run_main([f"--workdir={workdir}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  assert results["eval"]["compressive"] == {"cmem_len": 12} and results["test"]["bpc"] > 0


@pytest.mark.parametrize("name", ["lm1b_base", "lm1b_large"])
def test_lm1b_configs_start_and_train_two_steps(tmp_path, name):
  from data_samples import (
      _HELDOUT,
      _TRAIN,
      ARCHIVE,
      HELDOUT_DIR,
      TRAIN_DIR,
      _heldout_name,
      _tarball,
      _train_name,
  )

  manual = tmp_path / "manual"
  manual.mkdir()
  members = {f"{TRAIN_DIR}/{_train_name(i)}": (t * 4).encode() for i, t in _TRAIN.items()}
  members.update(
      {f"{HELDOUT_DIR}/{_heldout_name(i)}": (t * 4).encode() for i, t in _HELDOUT.items()}
  )
  _tarball(manual / ARCHIVE, members)
  check_start(tmp_path, name, manual, "lm1b")


# --------------------------------------------------------------------------- #
# The ablation variants (configs/ablation_wt2.py): start, train two steps and
# evaluate with both evaluators (in-process, on a small WikiText-format sample).


@pytest.fixture(scope="module")
def wiki_sample(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("wiki")
  _wiki_zip(tmp / "manual", "wikitext-2", _WIKI)
  corpus = load_corpus(
      "wikitext2",
      data_dir=str(tmp / "tfds"),
      manual_dir=str(tmp / "manual"),
      verify_checksums=False,
  )
  return tmp, corpus


# Three of the seven: relative (xl), absolute sinusoid (vaswani_half) and learned
# per-layer positions without memory (vanilla); scripts/reproduce_wt2.py --quick trains
# and evaluates every one end to end (tests/e2e/test_reproduce_wt2.py).
@pytest.mark.parametrize("variant", ["xl", "vaswani_half", "vanilla"])
def test_ablation_variants_train_and_evaluate_with_both_methods(variant, wiki_sample, tmp_path):
  import json

  import jax

  from transformer_xl import default_config, sharding
  from transformer_xl.cli import eval_modes
  from transformer_xl.training import train

  _, corpus = wiki_sample
  config = ablation_config(variant, corpus.vocab_size)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  default_config.validate(config, 1)
  last = train.train_and_evaluate(config, str(tmp_path), corpus, mesh)
  assert last["loss"] > 0
  for method in ("segments", "sliding"):
    config.eval.method = method
    res = eval_modes.run_eval(config, str(tmp_path), corpus, mesh)
    saved = json.loads((tmp_path / "eval_results.json").read_text())
    assert saved["eval"]["method"] == method
    for split in ("valid", "test"):
      assert res[split]["tokens"] == corpus.splits[split].num_tokens
      assert 1.0 < res[split]["ppl"] < 2 * corpus.vocab_size


def test_ablation_variant_from_the_command_line(wiki_sample, tmp_path):
  import json

  tmp, _ = wiki_sample
  data = [
      f"--config.data.manual_dir={tmp / 'manual'}",
      f"--config.data.data_dir={tmp / 'tfds'}",
      "--config.data.verify_checksums=False",
  ]
  tiny = tiny_flags(
      model__d_inner=32,
      model__mem_len=None,
      model__cutoffs=(8, 16),
      train__num_steps=2,
      train__warmup_steps=1,
      eval__window=8,
      eval__global_batch=8,
  )
  args = [f"--config={CONFIGS / 'ablation_wt2.py'}:vanilla", f"--workdir={tmp_path}", *data, *tiny]
  r = run_main(args)
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_main(args + ["--mode=eval"])
  assert r.returncode == 0, r.stderr[-3000:]
  saved = json.loads((tmp_path / "eval_results.json").read_text())
  assert saved["eval"] == {"method": "sliding", "window": 8, "stride": 1, "clamp_len": 0}
  r = run_main([f"--config={CONFIGS / 'ablation_wt2.py'}:nope", f"--workdir={tmp_path}"])
  assert r.returncode != 0 and "Unknown ablation variant" in r.stderr
