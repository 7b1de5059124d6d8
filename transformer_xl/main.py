"""Command line: train or evaluate Transformer-XL.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl --mode=score --tokens=x.npy --out=nll.npy

Any config value can be overridden with ``--config.<section>.<key>=value``.
Everything that can be checked before compiling is checked first (config
keys and values, mesh against devices and batch, data files), so bad input
fails in seconds with a message that says what to change.  A restart with the
same workdir resumes from its latest checkpoint.
"""
from __future__ import annotations

import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, TensorBoard "
                               "events and eval_results.json.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "score"],
                          "train: train (resuming if possible). "
                          "eval: score valid and test from the latest checkpoint. "
                          "score: per-token NLL of --tokens, written to --out.")
_TOKENS = flags.DEFINE_string(
    "tokens", None, "--mode=score: .npy integer array [B, T+1]; each row one contiguous "
    "stream of token ids.")
_TEXT = flags.DEFINE_string(
    "text", None, "--mode=score: a text file, tokenised with the dataset's vocabulary and "
    "scored as one stream (its first token in the context of the boundary symbol).")
_OUT = flags.DEFINE_string(
    "out", None, "--mode=score: output .npy, float32 [B, T]: entry (b, t) is the NLL in nats "
    "of token t+1 given tokens up to t.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 for a multi-process run "
    "(jax.distributed). Leave unset on a Cloud TPU VM slice: it is detected there.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0-based.")


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


def check_config(config, num_devices: int) -> tuple[int, ...]:
  """Checks the config against itself and the devices; returns the mesh shape.

  Raises:
    ConfigError: sizes that do not fit together (n_head vs the ``model``
      axis, batch vs the ``data`` axis and batch_chunk, same_length without
      memory, ext_len >= tgt_len, unknown dataset, bad dtype, ...).
  """
  from transformer_xl import adaptive, attention, data, sharding
  m, t, e = config.model, config.train, config.eval
  try:
    mesh_shape = sharding.resolve_mesh_shape(config.mesh.shape, num_devices)
  except ValueError as err:
    raise ConfigError(str(err)) from None
  names = tuple(config.mesh.axis_names)
  if len(names) != len(mesh_shape) or "data" not in names or "model" not in names or not set(
      names) <= {"data", "fsdp", "model"}:
    raise ConfigError(f"mesh.axis_names={names} and mesh.shape={tuple(config.mesh.shape)}: "
                      "give one size per axis; axes are 'data', 'model' and optionally 'fsdp'.")
  sizes = dict(zip(names, mesh_shape))
  n_data, n_model = sizes["data"] * sizes.get("fsdp", 1), sizes["model"]
  problems = []
  if m.n_head % n_model:
    problems.append(f"model.n_head={m.n_head} is not divisible by the 'model' mesh axis "
                    f"({n_model}); set --config.mesh.shape so the model axis divides n_head.")
  if t.global_batch % n_data:
    problems.append(f"train.global_batch={t.global_batch} is not divisible by the data-parallel "
                    f"mesh axes (data x fsdp = {n_data}); use a multiple of {n_data} or "
                    "change --config.mesh.shape.")
  elif t.batch_chunk < 1 or t.global_batch % (t.batch_chunk * n_data):
    problems.append(f"train.global_batch={t.global_batch} must be divisible by "
                    f"train.batch_chunk * data axis = {t.batch_chunk} * {n_data}.")
  if e.global_batch < 1:
    problems.append(f"eval.global_batch={e.global_batch} must be >= 1.")
  for name, cfg_ in (("model", m), ("eval", e)):
    if cfg_.same_length and cfg_.mem_len < 1:
      problems.append(f"{name}.same_length=True needs {name}.mem_len >= 1 (with no memory every "
                      "key would be masked).")
    if cfg_.tgt_len < 1 or cfg_.mem_len < 0 or cfg_.clamp_len < 0:
      problems.append(f"{name}: tgt_len must be >= 1 and mem_len, clamp_len >= 0.")
  if m.ext_len:
    problems.append(f"model.ext_len={m.ext_len}: extended context is not supported by the "
                    "input pipeline; set --config.model.ext_len=0 (all reference scripts do).")
  if m.d_model % 2:
    problems.append(f"model.d_model={m.d_model} must be even (sinusoid encoding).")
  if m.dtype not in ("float32", "bfloat16"):
    problems.append(f"model.dtype={m.dtype!r}: use 'float32' or 'bfloat16'.")
  if m.remat not in ("none", "full", "dots"):
    problems.append(f"model.remat={m.remat!r}: use 'none', 'full' or 'dots'.")
  try:  # the vocabulary size is not known yet: check what does not depend on it
    cutoffs = tuple(m.cutoffs)
    adaptive.check_adaptive_config(max(cutoffs, default=0) + 1, m.d_embed or m.d_model,
                                   m.d_model, cutoffs, m.div_val, tuple(m.tie_projs))
  except ValueError as err:
    problems.append(str(err))
  if m.attn_type not in attention.ATTENTION_TYPES:
    problems.append(f"model.attn_type={m.attn_type}: implemented types are "
                    f"{sorted(attention.ATTENTION_TYPES)}.")
  if config.data.dataset not in data.CORPUS_NAMES:
    problems.append(f"data.dataset={config.data.dataset!r}: choose one of "
                    f"{sorted(data.CORPUS_NAMES)}.")
  if t.num_steps < 1 or t.log_every < 1 or config.checkpoint.every_steps < 1:
    problems.append("train.num_steps, train.log_every and checkpoint.every_steps must be >= 1.")
  if problems:
    raise ConfigError("Invalid config:\n  - " + "\n  - ".join(problems))
  return mesh_shape


def on_tpu_vm() -> bool:
  """Whether this looks like a Cloud TPU VM (its metadata env or accel devices)."""
  return bool(os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("TPU_WORKER_HOSTNAMES")
              or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"))


def initialize_distributed(coordinator_address=None, num_processes=None, process_id=None):
  """Starts jax.distributed for a multi-process run; a no-op for one process.

  With ``coordinator_address`` all three values are required (explicit
  setup, e.g. CPU processes on 127.0.0.1 with gloo collectives, or GPU
  hosts).  Without it, on a Cloud TPU VM slice, ``jax.distributed.initialize()``
  discovers everything by itself.  Must run before any other JAX call.

  Raises:
    ConfigError: an incomplete set of flags.
  """
  import jax
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise ConfigError("--coordinator_address, --num_processes and --process_id go together: "
                      "give all three (or none on a Cloud TPU VM).")
  if coordinator_address:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif on_tpu_vm():
    jax.distributed.initialize()


def load_corpus_once(config):
  """data.load_corpus, prepared by process 0 before the others look.

  With several processes, process 0 prepares the dataset first (so a shared
  data_dir is written once), then the others load it (preparing their own
  copy if their data_dir is a local disk).  A failure on process 0 stops
  every process with an error instead of leaving them waiting.

  Raises:
    data.DataError: the corpus cannot be built (see its message).
  """
  import jax
  import numpy as np
  from transformer_xl import data

  def load():
    return data.load_corpus(
        config.data.dataset, data_dir=config.data.data_dir, manual_dir=config.data.manual_dir,
        download=config.data.download, verify_checksums=config.data.verify_checksums)

  if jax.process_count() == 1:
    return load()
  from jax.experimental import multihost_utils
  corpus, error = None, None
  if jax.process_index() == 0:
    try:
      corpus = load()
    except data.DataError as err:
      error = err
  ok = multihost_utils.process_allgather(np.asarray([error is None], np.int32))
  if error is not None:
    raise error
  if not bool(np.all(ok)):
    raise data.DataError("Process 0 could not prepare the dataset; see its error message.")
  return corpus if corpus is not None else load()


def load_workdir_config(workdir: str):
  """The config a training run saved in ``<workdir>/config.json``.

  Raises:
    FileNotFoundError: no config.json (pass --config instead).
  """
  import json
  from etils import epath
  from transformer_xl import default_config
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: pass --config=configs/<name>.py, or use the "
                            "--workdir of a training run (it saves its config there).")
  config = default_config.get_config()
  config.update(json.loads(path.read_text()))
  return config


def _model_config_path(workdir: str):
  from etils import epath
  return epath.Path(workdir) / "model_config.json"


def save_model_config(workdir: str, model_cfg, unit: str, dataset: str) -> None:
  """Writes the exact architecture (with n_token) and the corpus unit to
  ``<workdir>/model_config.json`` so checkpoints can be used without the data."""
  import dataclasses
  import json
  import jax
  if jax.process_index() == 0:
    _model_config_path(workdir).write_text(json.dumps(
        {"model": dataclasses.asdict(model_cfg), "unit": unit, "dataset": dataset}, indent=2))


def load_model_config(workdir: str):
  """(ModelConfig, unit) from ``<workdir>/model_config.json``.

  Raises:
    FileNotFoundError: the workdir has no model_config.json.
  """
  import json
  from transformer_xl import models
  path = _model_config_path(workdir)
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: train (or convert) into this --workdir first.")
  saved = json.loads(path.read_text())
  return models.ModelConfig(**saved["model"]), saved["unit"]


def restore_params(config, workdir: str, model_cfg, mesh):
  """(step, parameters) of the latest checkpoint in ``workdir``.

  Raises:
    FileNotFoundError: no checkpoint.
  """
  from transformer_xl import checkpointing, models, train
  tx = train.make_optimizer(config.train)
  abstract_state, _ = train.abstract_train_state(models.TransformerXL(model_cfg), tx,
                                                 config.train.global_batch, mesh)
  manager = checkpointing.make_manager(workdir, config.checkpoint.max_to_keep)
  restored = checkpointing.restore_latest(manager, abstract_state)
  manager.close()
  if restored is None:
    raise FileNotFoundError(f"No checkpoint in {manager.directory}: train first with the same "
                            "--workdir (--mode=train).")
  step, state, _ = restored
  return step, state.params


def score(config, workdir: str, tokens_path: str, out_path: str, text_path: str = None) -> dict:
  """``--mode=score``: per-token NLL of an array of token streams, or of a text.

  ``tokens_path``: .npy integer [B, T+1].  ``text_path`` instead: a text
  file tokenised with the corpus's vocabulary (loads the dataset) and
  scored as one row [boundary] + tokens, so every token of the text is
  scored.  Writes float32 [B, T] nats to ``out_path`` and returns (and
  prints) the mean loss in nats, bpc and ppl over all B*T tokens.

  Raises:
    ValueError: bad token array (see Evaluator.score); FileNotFoundError:
      missing file, model_config.json or checkpoint.
  """
  import jax
  import numpy as np
  from transformer_xl import evaluate, sharding, train
  if bool(tokens_path) == bool(text_path) or not out_path:
    raise ConfigError("--mode=score needs --out=NLL.npy and one of --tokens=FILE.npy or "
                      "--text=FILE.")
  model_cfg, unit = load_model_config(workdir)
  if text_path:
    from etils import epath
    corpus = load_corpus_once(config)
    ids = corpus.encode(epath.Path(text_path).read_text())
    tokens = np.concatenate([[corpus.boundary_id], ids])[None, :]
  else:
    tokens = np.load(tokens_path)
  check_config(config, jax.device_count())
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  step, params = restore_params(config, workdir, model_cfg, mesh)
  nll_BxT = evaluate.Evaluator(config, model_cfg, None, mesh).score(params, tokens)
  if jax.process_index() == 0:
    np.save(out_path, nll_BxT)
  loss = float(np.mean(nll_BxT, dtype=np.float64))
  result = {"loss_nats": loss, "bpc": loss / float(np.log(2.0)), "ppl": float(np.exp(loss)),
            "tokens": int(nll_BxT.size), "step": int(step)}
  train.log(f"step {step}: scored {nll_BxT.size:,} tokens ({unit} level): loss {loss:.4f} nats, "
            f"bpc {result['bpc']:.4f}, ppl {result['ppl']:.3f}; wrote {out_path}")
  return result


def run(config, workdir: str, mode: str) -> dict:
  """Validates, loads the data, then trains or evaluates.  Returns the results."""
  import jax
  from etils import epath
  from transformer_xl import evaluate, sharding, train

  check_config(config, jax.device_count())
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  corpus = load_corpus_once(config)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)  # local path or gs://
  metric = train.metric_name(corpus.unit)
  train.log(f"Corpus {corpus.name}: vocab {corpus.vocab_size:,}, "
        + ", ".join(f"{k} {v.num_tokens:,} tokens" for k, v in corpus.splits.items())
        + f"; mesh {dict(mesh.shape)}; {jax.process_count()} process(es).")

  try:
    mcfg = train.model_config(config, corpus.vocab_size)
  except ValueError as err:  # e.g. cutoffs beyond this corpus's vocabulary
    raise ConfigError(f"Invalid config for {corpus.name} (vocabulary {corpus.vocab_size:,}): "
                      f"{err}") from None
  if mode == "train":
    if jax.process_index() == 0:
      (epath.Path(workdir) / "config.json").write_text(config.to_json_best_effort(indent=2))
    save_model_config(workdir, mcfg, corpus.unit, corpus.name)
    return train.train_and_evaluate(config, workdir, corpus, mesh)

  step, params = restore_params(config, workdir, mcfg, mesh)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh)
  results = {}
  for split in ("valid", "test"):
    results[split] = evaluator.evaluate(params, split)
    r = results[split]
    train.log(f"step {step} {split}: loss {r['loss_nats']:.4f} nats, {metric} {r[metric]:.4f} "
        f"over {r['tokens']:,} tokens")
  results["step"] = int(step)
  path = evaluate.write_results(workdir, results)
  train.log(f"Wrote {path}")
  return results


def main(argv):
  """absl entry point: checks the flags, then :func:`run`; errors exit with a message."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required.")
  if _CONFIG.value is None and _MODE.value == "train":
    raise app.UsageError("--config is required to train.")
  if not flags.FLAGS["verbosity"].present:  # orbax and tfds log every file at INFO
    logging.set_verbosity(logging.WARNING)
  from transformer_xl import data
  try:
    initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    config = _CONFIG.value if _CONFIG.value is not None else load_workdir_config(_WORKDIR.value)
    if _MODE.value == "score":
      score(config, _WORKDIR.value, _TOKENS.value, _OUT.value, _TEXT.value)
    else:
      run(config, _WORKDIR.value, _MODE.value)
  except (ConfigError, data.DataError, FileNotFoundError) as err:
    sys.exit(f"error: {err}")


def _parse_flags(argv):
  """absl flag parsing; an unknown --config.key becomes a one-line error."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as err:  # raised by ml_collections for unknown keys
    msg = re.sub(r"[\\'\"]+", " ", str(err).replace("\\n", " ").replace("\n", " ")).split()
    sys.exit(f"error: unknown config key in the --config.* overrides: {' '.join(msg)} "
             "(every key is listed in transformer_xl/default_config.py)")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
