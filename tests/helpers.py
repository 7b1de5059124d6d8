"""What the test modules share: a plain module, never a test module.

A test module imports its helpers from here (``from helpers import ...``;
``tests/`` is on ``sys.path`` under pytest, and on ``PYTHONPATH`` for the
code some tests run in a subprocess), never from another test module
(``tests/test_layout.py`` checks it).  The data sample builders are in
``data_samples.py``, the HuggingFace reference model in
``hf_reference.py``, the naive Transformer-XL in ``naive_reference.py``.

Sections:

- the processes a test starts (``python -m transformer_xl.main`` and others):
  ``subprocess_env``, ``run_python``, ``run_module``, ``run_main``,
  ``start_main``;
- the tiny model: ``tiny_model_config`` (a ``ModelConfig``), ``tiny_config``
  (a run config) and ``tiny_flags`` (the command line's flags);
- command-line runs on a PTB-format sample (``write_ptb_sample``,
  ``small_args``, ``read_metrics``) and in-process runs on a toy corpus
  (``toy_corpus``, ``train_toy``) or on one's own text (``tiny_text_config``);
- the helpers of a pair of test modules (evaluation, documents, attention,
  config files, workdirs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl import convert, data, default_config, sharding
from transformer_xl.cli import modes
from transformer_xl.inference import evaluate
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.run import run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import train, train_state, train_step

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# --------------------------------------------------------------------------- #
# The processes a test starts.


def subprocess_env(devices: int | None = None, **variables: str) -> dict[str, str]:
  """The environment of a process that a test starts: this one's, with the
  repository (the code under test) as ``PYTHONPATH`` (``XLA_FLAGS`` as
  ``tests/conftest.py`` set them: 8 devices, backend optimisation off).

  Args:
    devices: None keeps the suite's 8 simulated CPU devices (``XLA_FLAGS``
      of ``tests/conftest.py``); a number n runs the process on n CPU devices
      (``JAX_PLATFORMS=cpu``; ``XLA_FLAGS`` without its device count, plus
      ``--xla_force_host_platform_device_count=n`` where n > 1).
    **variables: environment variables set over these (e.g.
      ``JAX_LOG_COMPILES="1"``).

  Returns:
    A new dict for ``subprocess``'s ``env``.
  """
  env = dict(os.environ, PYTHONPATH=str(REPO))
  flags = env.get("XLA_FLAGS", "").split()
  if devices is not None:
    flags = [f for f in flags if "device_count" not in f]
    if devices > 1:
      flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = " ".join(flags)
  env.update(variables)
  return env


def run_python(
    argv: Sequence[Any],
    *,
    devices: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
  """``python ARGV`` in the repository's root, its output captured as text.

  Args:
    argv: the interpreter's arguments (a script and its arguments, ``-m
      MODULE ...``, ``-c CODE ...``); each is passed as ``str``.
    devices: the CPU devices, as ``subprocess_env``'s.
    env: environment variables set over ``subprocess_env(devices)``'s.
    timeout: seconds before ``subprocess.TimeoutExpired``.

  Returns:
    The finished process (``args``: ``[sys.executable, *argv]``).
  """
  return subprocess.run(
      [sys.executable, *map(str, argv)],
      cwd=REPO,
      env=subprocess_env(devices, **(env or {})),
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def run_module(module: str, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
  """``python -m MODULE ARGS`` (``run_python``'s keywords: ``devices``, ``env``,
  ``timeout``)."""
  return run_python(["-m", module, *args], **kwargs)


def run_main(args: Sequence[Any], **kwargs: Any) -> subprocess.CompletedProcess:
  """``python -m transformer_xl.main ARGS``, the command line in a fresh process
  (``run_python``'s keywords: ``devices``, ``env``, ``timeout``; by default the
  suite's 8 simulated devices and 300 s)."""
  return run_module("transformer_xl.main", *args, **kwargs)


def start_main(
    args: Sequence[Any],
    *,
    devices: int | None = None,
    env: dict[str, str] | None = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
) -> subprocess.Popen:
  """``python -m transformer_xl.main ARGS`` started, not waited for (text
  output; ``devices`` and ``env`` as ``run_python``'s)."""
  return subprocess.Popen(
      [sys.executable, "-m", "transformer_xl.main", *map(str, args)],
      cwd=REPO,
      env=subprocess_env(devices, **(env or {})),
      stdout=stdout,
      stderr=stderr,
      text=True,
  )


# --------------------------------------------------------------------------- #
# The tiny model.

# The sizes of the tiny model of the in-process tests (``tiny_model_config``,
# ``tiny_config``): 2 layers, d_model 16, 2 heads of 8, d_inner 32, segments and
# memory of 6 tokens.
TINY_MODEL = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=6, mem_len=6)
TINY_N_TOKEN = 64


def tiny_model_config(**fields: Any) -> models.ModelConfig:
  """A small ``ModelConfig``: a vocabulary of ``TINY_N_TOKEN``, the sizes of
  ``TINY_MODEL``, ``fields`` over both, ModelConfig's defaults for the rest.

  Built by ``ModelConfig.from_dict`` (fields by their flat names, as a
  workdir's ``model_config.json`` holds them).

  Raises:
    ValueError: the fields' problems (``config_problems``).
    TypeError: a field that ModelConfig does not have.
  """
  return models.ModelConfig.from_dict({"n_token": TINY_N_TOKEN, **TINY_MODEL, **fields})


def tiny_config(**train_kw: Any):
  """The run config (``default_config.get_config()``) of the tiny model
  (``TINY_MODEL``, dropout and dropatt 0.1): global batch 8, 100 steps, 2
  warm-up steps, learning rate 1e-3; ``train_kw`` over ``config.train``."""
  c = default_config.get_config()
  c.model.update(**TINY_MODEL, dropout=0.1, dropatt=0.1)
  c.train.update(global_batch=8, num_steps=100, warmup_steps=2, learning_rate=1e-3)
  c.train.update(**train_kw)
  return c


def run_steps(config, mesh, tokens, n_steps):
  """(losses, final state on the host) of ``n_steps`` jitted train steps of
  ``config``'s model (a vocabulary of 64) over ``tokens`` on ``mesh``, from
  PRNGKey(0) (dropout seed 7); checks that the step compiled once."""
  mcfg = default_config.model_config(config, 64)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, config.train.global_batch, mesh)
  state = train_state.create_train_state(
      model, tx, config.train.global_batch, mesh, jax.random.PRNGKey(0), shardings
  )
  step_fn = train_step.make_train_step(model, tx, mesh, shardings, config.train.batch_chunk, 7)
  it = data.TrainIterator(data.ArraySource(tokens), config.train.global_batch, mcfg.tgt_len)
  losses = []
  for _ in range(n_steps):
    batch = data.to_global_batch(next(it), sharding.batch_sharding(mesh), config.train.global_batch)
    state, metrics = step_fn(state, batch)
    losses.append(float(metrics["loss"]))
  # Static shapes: one compilation while the memory fills up.
  assert step_fn._cache_size() == 1
  return losses, jax.device_get(state)


# The tiny run of the command-line tests (``tiny_flags``), over a config such as
# configs/quickstart.py: 2 layers, d_model 32, 2 heads of 16, d_inner 64, segments
# and memory of 8 tokens; 8 rows a step, a line every step, no evaluation during
# training, 2 warm-up steps.
TINY_FLAGS: dict[str, Any] = {
    "model.n_layer": 2,
    "model.d_model": 32,
    "model.n_head": 2,
    "model.d_head": 16,
    "model.d_inner": 64,
    "model.tgt_len": 8,
    "model.mem_len": 8,
    "train.global_batch": 8,
    "train.log_every": 1,
    "train.eval_every": 0,
    "train.warmup_steps": 2,
}


def tiny_flags(*, train: bool = True, **overrides: Any) -> list[str]:
  """The ``--config.SECTION.KEY=VALUE`` flags of the tiny command-line run.

  Args:
    train: False leaves out the ``train.*`` flags of ``TINY_FLAGS`` (the
      model's only).
    **overrides: ``SECTION__KEY=value`` (e.g. ``train__num_steps=2``,
      ``eval__mem_len=16``), a nested section's key as
      ``SECTION__SUB__KEY`` (``model__compressive__cmem_len=4``: the flag
      ``--config.model.compressive.cmem_len=4``): the value of a
      ``TINY_FLAGS`` key, in its place, or a flag added after them (in the
      order given); None leaves the key out (the config's own value is
      used).  A value is written as ``str`` gives it (``(8, 16)``,
      ``False``).

  Returns:
    The flags, ``TINY_FLAGS``' order first.

  Raises:
    ValueError: an override not named ``SECTION__KEY`` (or
      ``SECTION__SUB__KEY``).
  """
  values = {k: v for k, v in TINY_FLAGS.items() if train or not k.startswith("train.")}
  for name, value in overrides.items():
    parts = name.split("__")
    if len(parts) < 2 or not all(parts):
      raise ValueError(f"{name}: name an override SECTION__KEY (e.g. train__num_steps)")
    values[".".join(parts)] = value
  return [f"--config.{k}={v}" for k, v in values.items() if v is not None]


# --------------------------------------------------------------------------- #
# Command-line runs on a PTB-format sample.

PTB_WORDS = (
    "the a cat dog sat ran on under mat rug and then N <unk> big small red blue "
    "quickly slowly house tree saw ate fish bird"
).split()


def write_ptb_sample(directory: Path, n_lines=(1200, 80, 90), seed=0):
  """PTB-format files (leading/trailing space, one sentence per line) of a
  low-entropy toy language, so that a model can learn it in a few steps."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for split, n in zip(("train", "valid", "test"), n_lines):
    lines = []
    for _ in range(n):
      start = rng.integers(0, len(PTB_WORDS))
      length = rng.integers(4, 12)
      words = [PTB_WORDS[(start + 3 * k) % len(PTB_WORDS)] for k in range(length)]
      lines.append(" " + " ".join(words) + " \n")
    (directory / f"ptb.{split}.txt").write_text("".join(lines))
  return directory


def memory_run_flags(tgt_len: int, mem_len: int, rows: int, **overrides: Any) -> list[str]:
  """``tiny_flags`` of the memories' command-line tests: d_model 16, d_head 8,
  d_inner 32, segments of ``tgt_len`` with ``mem_len`` cached states in
  training and evaluation (no same_length, no clamp), ``rows`` evaluation
  rows, the whole batch of the config, no warmup and learning rate 0.05
  (``overrides`` over them, as ``tiny_flags`` takes them)."""
  return tiny_flags(
      **{
          "model__d_model": 16,
          "model__d_head": 8,
          "model__d_inner": 32,
          "model__tgt_len": tgt_len,
          "model__mem_len": mem_len,
          "train__global_batch": None,
          "train__warmup_steps": 0,
          "train__learning_rate": 0.05,
          "eval__tgt_len": tgt_len,
          "eval__mem_len": mem_len,
          "eval__same_length": False,
          "eval__clamp_len": 0,
          "eval__global_batch": rows,
          **overrides,
      }
  )


def small_args(tmp_path, workdir, manual, *extra):
  """The command line of configs/quickstart.py on the PTB sample in ``manual``
  (``write_ptb_sample``), prepared under ``tmp_path / "tfds"``, then ``extra``."""
  return [
      f"--config={CONFIGS / 'quickstart.py'}",
      f"--workdir={workdir}",
      f"--config.data.manual_dir={manual}",
      f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.data.verify_checksums=False",
      *extra,
  ]


def read_metrics(workdir):
  """{step: row} of the training rows of a workdir's metrics.jsonl."""
  rows = [json.loads(l) for l in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r for r in rows if "train/loss" in r}


# --------------------------------------------------------------------------- #
# In-process training on a toy corpus.

TOY_VOCAB = 32
TOY_STEPS = 12


def toy_corpus():
  """A corpus of random words ``w0`` .. ``w31`` (boundary id 0): 1928 training
  tokens (40 steps of the tiny model's 8 x 6), 300 valid and test tokens."""
  rng = np.random.default_rng(0)
  stream = lambda n: data.ArraySource(rng.integers(0, TOY_VOCAB, size=n).astype(np.int32))
  return data.Corpus(
      name="toy",
      unit="word",
      vocab=[f"w{i}" for i in range(TOY_VOCAB)],
      boundary_id=0,
      splits={"train": stream(8 * 6 * 40 + 8), "valid": stream(300), "test": stream(300)},
  )


def toy_config(**train_kw):
  """``tiny_config`` for ``toy_corpus``: TOY_STEPS steps, a line every step, no
  evaluation, a checkpoint every 2 steps (10 kept); ``train_kw`` over
  ``config.train``."""
  c = tiny_config(
      **{**dict(num_steps=TOY_STEPS, warmup_steps=2, log_every=1, eval_every=0), **train_kw}
  )
  c.checkpoint.update(every_steps=2, max_to_keep=10)
  return c


def train_toy(workdir, mesh, config=None):
  """``train.train_and_evaluate`` of ``config`` (default ``toy_config()``) on
  ``toy_corpus()`` into ``workdir``."""
  return train.train_and_evaluate(config or toy_config(), str(workdir), toy_corpus(), mesh)


def _checkpoint_data_files(step_dir):
  return sorted(
      (p for p in (step_dir / "state" / "d").iterdir() if p.is_file()),
      key=lambda p: -p.stat().st_size,
  )


def damage_checkpoint(step_dir, kind, previous_dir):
  """Damages the checkpoint ``step_dir`` (``checkpoints/N``) one way.

  Args:
    step_dir: the checkpoint's directory (Path).
    kind: "xor_400_bytes", "two_bit_flips", "truncated" or
      "data_file_deleted" (its largest array file), "metadata_deleted",
      "other_arrays" (``previous_dir``'s arrays copied over its own),
      "record_damaged" or "record_deleted" (its integrity record).
    previous_dir: another checkpoint's directory ("other_arrays" only).

  Raises:
    ValueError: an unknown ``kind``.
  """
  if kind == "xor_400_bytes":
    f = _checkpoint_data_files(step_dir)[0]
    b = bytearray(f.read_bytes())
    for i in range(100, 500):
      b[i] ^= 0x5A
    f.write_bytes(bytes(b))
  elif kind == "two_bit_flips":
    f = _checkpoint_data_files(step_dir)[0]
    b = bytearray(f.read_bytes())
    b[len(b) // 3] ^= 0x04
    b[2 * len(b) // 3] ^= 0x04
    f.write_bytes(bytes(b))
  elif kind == "truncated":
    f = _checkpoint_data_files(step_dir)[0]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
  elif kind == "data_file_deleted":
    _checkpoint_data_files(step_dir)[0].unlink()
  elif kind == "metadata_deleted":
    (step_dir / "state" / "_METADATA").unlink()
  elif kind == "other_arrays":  # readable files that are not the recorded ones
    shutil.rmtree(step_dir / "state")
    shutil.copytree(previous_dir / "state", step_dir / "state")
  elif kind == "record_damaged":
    (step_dir / "integrity" / "metadata").write_text('{"format": 1, "leaves": {')
  elif kind == "record_deleted":  # this version always writes one: not verifiable, not used
    shutil.rmtree(step_dir / "integrity")
  else:
    raise ValueError(kind)


# --------------------------------------------------------------------------- #
# In-process runs on one's own text (a word-level toy language).

TEXT_WORDS = "the a cat dog sat ran on under mat log big small red blue".split()
TEXT = "the big cat sat on the mat\nthe small dog ran under a red log\n"


def write_corpus(directory, seed=0):
  """train/valid/test files (400, 40, 40 lines) of a low-entropy toy language
  of TEXT_WORDS; returns ``directory``."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for split, n in (("train", 400), ("valid", 40), ("test", 40)):
    lines = []
    for _ in range(n):
      start, length = rng.integers(0, len(TEXT_WORDS)), rng.integers(4, 10)
      lines.append(" ".join(TEXT_WORDS[(start + 3 * k) % len(TEXT_WORDS)] for k in range(length)))
    (directory / f"{split}.txt").write_text("\n".join(lines) + "\n")
  return directory


def tiny_text_config(corpus_dir, data_dir):
  """The run config of a tiny model (2 layers, d_model 32, no dropout, segments
  and memory of 8) on the word-level text of ``corpus_dir`` (``write_corpus``),
  prepared under ``data_dir``: 2 steps of 8 rows, a checkpoint at step 2,
  evaluation with segments and memory of 8, same_length."""
  c = default_config.get_config()
  c.data.update(
      dataset="text",
      tokenizer="word",
      train_files=str(corpus_dir / "train.txt"),
      valid_files=str(corpus_dir / "valid.txt"),
      test_files=str(corpus_dir / "test.txt"),
      data_dir=str(data_dir),
  )
  c.model.update(
      n_layer=2,
      d_model=32,
      n_head=2,
      d_head=16,
      d_inner=64,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=8,
      mem_len=8,
  )
  c.train.update(global_batch=8, num_steps=2, warmup_steps=1, eval_every=0, log_every=1)
  c.eval.update(tgt_len=8, mem_len=8, same_length=True, global_batch=8)
  c.checkpoint.update(every_steps=2)
  return c


def score_and_generate(workdir, config, tmp_path, num_tokens):
  """--mode=score of a text (finite NLLs, one per token) and --mode=generate
  of a prompt, in-process, on a trained workdir of the tiny text corpus."""
  text = tmp_path / "t.txt"
  text.write_text("the big cat sat on the mat\n" * 6)  # 48 tokens (with <eos>)
  out = tmp_path / "nll.npy"
  modes.run(
      modes.Request(mode="score", workdir=str(workdir), config=config, text=str(text), out=str(out))
  )
  assert np.isfinite(np.load(out)).all() and np.load(out).size == 48
  samples = tmp_path / "samples.json"
  modes.run(
      modes.Request(
          mode="generate",
          workdir=str(workdir),
          config=config,
          prompt="the cat",
          num_tokens=num_tokens,
          out=str(samples),
      )
  )
  assert json.loads(samples.read_text())["prompt"] == "the cat"


# --------------------------------------------------------------------------- #
# Evaluation of the tiny model (test_evaluate.py, test_dynamic_eval.py).

EVAL_VOCAB = 64


def eval_setup(attn_type, mem_len=0, tgt_len=6, **eval_kw):
  """(config, ModelConfig, params) of the tiny model (no dropout, vocabulary
  EVAL_VOCAB) with training and evaluation segments of ``tgt_len`` and memory
  ``mem_len``, 4 evaluation rows, ``eval_kw`` over ``config.eval``; parameters
  of PRNGKey(attn_type) plus N(0, 0.2) noise (larger position terms)."""
  config = tiny_config()
  config.model.update(
      attn_type=attn_type,
      tgt_len=tgt_len,
      mem_len=mem_len,
      dropout=0.0,
      dropatt=0.0,
      same_length=False,
  )
  config.eval.update(
      tgt_len=tgt_len, mem_len=mem_len, same_length=False, clamp_len=0, global_batch=4
  )
  config.eval.update(**eval_kw)
  mcfg = default_config.model_config(config, EVAL_VOCAB)
  model = models.TransformerXL(mcfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(attn_type)))
  params = jax.tree_util.tree_map(  # larger position terms, so that positions matter
      lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
  )
  return config, mcfg, params


# --------------------------------------------------------------------------- #
# A split of documents (test_eval_documents.py, test_eval_whole.py).

DOC_SEP = 0  # the boundary symbol: ends every document and is the split's first context
DOC_N_TOKEN = 20
# 161 tokens: rows of ceil(161 / B) = 161, 81 and 54 tokens for B = 1, 2, 3, so the
# 83-token document is longer than a row for B = 2 and 3 (and the 29-token one than
# the memory of 6 plus a segment of 4).
DOC_LENGTHS = [5, 83, 3, 17, 2, 29, 9, 1, 12]


def documents_eval_config(global_batch, mesh_shape, same_length=True, attn_type=0):
  """The run config of a tiny model (segments of 5, memory 4, init_std 0.3)
  evaluated with segments of 4, memory 6, ``global_batch`` rows on a mesh of
  ``mesh_shape``, ``data.documents="reset"``."""
  config = default_config.get_config()
  config.model.update(
      n_layer=2,
      d_model=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=5,
      mem_len=4,
      init_std=0.3,  # larger than the reference's 0.02, so that the context matters
      attn_type=attn_type,
  )
  config.eval.update(
      tgt_len=4, mem_len=6, clamp_len=0, same_length=same_length, global_batch=global_batch
  )
  config.data.documents = "reset"
  config.mesh.shape = mesh_shape
  return config


def documents_corpus(lengths, seed=0):
  """(corpus with a "valid" split of the documents, the documents as token lists):
  each document's tokens are random non-boundary ids, then DOC_SEP."""
  rng = np.random.default_rng(seed)
  docs = [list(rng.integers(1, DOC_N_TOKEN, n - 1)) + [DOC_SEP] for n in lengths]
  stream = np.asarray([t for d in docs for t in d], np.int32)
  corpus = data.Corpus(
      name="text",
      unit="word",
      vocab=[str(i) for i in range(DOC_N_TOKEN)],
      boundary_id=DOC_SEP,
      splits={"valid": data.ArraySource(stream)},
      documents={"valid": data.ArraySentenceIndex(data.sentence_offsets(np.asarray(lengths)))},
  )
  return corpus, docs


def evaluator_and_params(config, corpus):
  """(``evaluate.Evaluator`` of ``config`` on ``corpus``, parameters of
  PRNGKey(0)) for a vocabulary of DOC_N_TOKEN."""
  mcfg = default_config.model_config(config, DOC_N_TOKEN)
  model = models.TransformerXL(mcfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  return evaluate.Evaluator(config, mcfg, corpus, mesh), params


def scores_alone(evaluator, params, docs):
  """float64 per document: its NLL scored alone (``Evaluator.score`` of DOC_SEP
  and the document, from an empty memory; the documents as independent rows
  of one call, each padded after its end)."""
  tokens = np.full((len(docs), 1 + max(map(len, docs))), DOC_SEP, np.int32)
  for k, doc in enumerate(docs):
    tokens[k, 1 : 1 + len(doc)] = doc
  nll = evaluator.score(params, tokens).astype(np.float64)
  return [nll[k, : len(doc)] for k, doc in enumerate(docs)]


# --------------------------------------------------------------------------- #
# Two ways of computing the attention (test_attention.py, test_pallas_attention.py).


def tiny_model_inputs(cfg: models.ModelConfig, memory: str):
  """(params far from their init, tokens [2, 8], a memory of 5 slots that is
  "empty", "partial" ([5, 2] valid) or "full") for a 2-layer, d_model 16
  model: the inputs of the tests that compare two ways of computing it."""
  params = nn.unbox(models.init_params(models.TransformerXL(cfg), jax.random.PRNGKey(0)))
  params = jax.tree_util.tree_map(
      lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params
  )
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, 37)
  mlen = {"empty": [0, 0], "partial": [5, 2], "full": [5, 5]}[memory]
  mem = memory_lib.init_memory(cfg, 2).replace(
      mlen_B=jnp.asarray(mlen, jnp.int32),
      mems_LxBxMxD=jax.random.normal(jax.random.PRNGKey(3), (2, 2, 5, 16)).astype(
          cfg.compute_dtype
      ),
  )
  return params, tokens, mem


# --------------------------------------------------------------------------- #
# Config files and scripts of the repository.


def load_module(path: Path, name: str):
  """The Python file ``path`` run as a module named ``name`` (not put in
  ``sys.modules``)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name, *args):
  """``get_config(*args)`` of configs/NAME.py."""
  return load_module(CONFIGS / f"{name}.py", name).get_config(*args)


def mock_tfds_module():
  """scripts/mock_tfds.py as a module (``mock_tfds_but_ours``: tfds's mock data
  for every dataset but this package's own)."""
  return load_module(REPO / "scripts" / "mock_tfds.py", "mock_tfds")


def ablation_config(variant, vocab):
  """configs/ablation_wt2.py's ``variant`` shrunk to a tiny model (2 layers,
  d_model 32, segments of 8, memory of at most 8; cutoffs at a third and two
  thirds of ``vocab``), 2 training steps of 8 rows, evaluation with memory of
  twice the training one and a window of 8."""
  c = load_config("ablation_wt2", variant)
  cut = vocab // 3
  c.model.update(
      n_layer=2,
      d_model=32,
      n_head=2,
      d_head=16,
      d_inner=32,
      tgt_len=8,
      mem_len=min(c.model.mem_len, 8),
      cutoffs=(cut, 2 * cut),
  )
  c.train.update(global_batch=8, num_steps=2, log_every=1, eval_every=0, warmup_steps=0)
  c.eval.update(tgt_len=8, mem_len=2 * c.model.mem_len, window=8, global_batch=8)
  return c


# --------------------------------------------------------------------------- #
# Workdirs.


def restored(workdir):
  """(config, ModelConfig, unit, step, numpy params) of a workdir, as main loads it."""
  config = wd.load_config(str(workdir))
  cfg, unit = wd.load_model_config(str(workdir))
  step, params = run_dir.restore_params(str(workdir), cfg, convert.one_device_mesh())
  return config, cfg, unit, step, jax.tree_util.tree_map(np.asarray, jax.device_get(params))


def write_json(path, obj):
  """Writes ``obj`` as JSON to ``path``; returns the path as ``str``."""
  Path(path).write_text(json.dumps(obj))
  return str(path)


def ptb_valid_rows(tmp_path: Path, manual: Path, rows: int) -> tuple[Any, np.ndarray, int]:
  """The valid split of the PTB sample prepared under ``tmp_path / "tfds"``
  (``small_args``) in the evaluation's layout (docs/guide/evaluation.md,
  test_score.py): the boundary symbol as the context of token 0, row r the
  targets r n / rows .. (r + 1) n / rows - 1 (n: the split's tokens cut to a
  multiple of ``rows``), for ``--mode=score --tokens``.

  Returns:
    (the corpus, int32 [rows, n / rows + 1] token rows, n).
  """
  corpus = data.load_corpus(
      "ptb", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False
  )
  valid = corpus.splits["valid"]
  n = valid.num_tokens - valid.num_tokens % rows
  per_row = n // rows
  full = np.concatenate([[corpus.boundary_id], valid.read(0, n)]).astype(np.int32)
  return corpus, np.stack([full[r * per_row : (r + 1) * per_row + 1] for r in range(rows)]), n


def reference_nll(cfg: models.ModelConfig, params: Any, tokens_BxT1: np.ndarray) -> np.ndarray:
  """float32 [B, T]: the model ``cfg`` run segment by segment (its tgt_len)
  from an empty memory, the last segment padded after the real tokens (as
  ``--mode=score``): the command-line tests' independent computation."""
  seg = cfg.tgt_len
  model = models.TransformerXL(cfg)
  step = jax.jit(lambda p, m, x, y: model.apply({"params": p}, x, m, y, deterministic=True))
  b, t = tokens_BxT1.shape[0], tokens_BxT1.shape[1] - 1
  n_seg = -(-t // seg)
  padded = np.zeros((b, n_seg * seg + 1), np.int32)
  padded[:, : t + 1] = tokens_BxT1
  memory, out = memory_lib.init_memory(cfg, b), []
  for s in range(n_seg):
    nll, memory = step(
        params,
        memory,
        padded[:, s * seg : (s + 1) * seg],
        padded[:, s * seg + 1 : (s + 1) * seg + 1],
    )
    out.append(np.asarray(nll))
  return np.concatenate(out, axis=1)[:, :t]


def babilong_data_cfg(tmp_path, **extra):
  """The data config of BABILong qa1 on stand-in bAbI files (30 train and 8 test
  stories) and the fixture's noise documents as text files, ``extra`` over it."""
  from transformer_xl.data import babi_like

  fix = REPO / "tests" / "fixtures" / "babilong"
  docs = json.loads((fix / "noise_train.json").read_text())
  noise = []
  for i, d in enumerate(docs + json.loads((fix / "noise_test.json").read_text())):
    p = tmp_path / f"noise{i}.txt"
    p.write_text(d)
    noise.append(str(p))
  babi_like.write_task(tmp_path / "babi", "qa1", train_stories=30, test_stories=8, seed=3)
  cfg = {
      "dataset": "babilong:qa1",
      "manual_dir": str(tmp_path / "babi"),
      "download": False,
      "tokenizer": f"pretrained:{fix / 'tokenizer.json'}",
      "babilong_noise": "text",
      "train_files": ",".join(noise[:6]),
      "valid_files": ",".join(noise[6:8]),
      "test_files": ",".join(noise[8:]),
      "babilong_sample_size": 160,
      "babilong_max_n_facts": 8,
      "babilong_valid_size": 10,
  }
  cfg.update(extra)
  return cfg


def armt_fixture_inputs(tmp_path: Path) -> tuple[dict, Path]:
  """Their ARMT wrapper's state dict (tests/fixtures/armt_model.npz, made by
  scripts/make_armt_fixtures.py) and its three-section hparams, written to
  ``tmp_path``/h.json."""
  f = dict(np.load(REPO / "tests" / "fixtures" / "armt_model.npz"))
  state = {k[len("corr/state/") :]: v for k, v in f.items() if k.startswith("corr/state/")}
  hf = dict(
      vocab_size=24,
      cutoffs=[],
      d_model=16,
      d_embed=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      div_val=1,
      n_layer=2,
      mem_len=0,
      clamp_len=-1,
      same_length=False,
      untie_r=True,
      tie_word_embeddings=True,
      architectures=["TransfoXLLMHeadModel"],
  )
  hparams = {
      "transfo_xl_config": hf,
      "memory_cell": {"num_mem_tokens": 3, "d_mem": 4, "correction": True},
      "recurrent_wrapper": {"segment_size": 4, "max_n_segments": 4, "k2": -1},
  }
  path = tmp_path / "h.json"
  path.write_text(json.dumps(hparams))
  return state, path
