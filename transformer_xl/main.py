"""Command line: train, evaluate, score or sample from Transformer-XL.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl --mode=score --tokens=x.npy --out=nll.npy
    python -m transformer_xl.main --workdir=/tmp/txl --mode=generate --prompt="the" --num_tokens=50

Any config value can be overridden with ``--config.<section>.<key>=value``.
Everything that can be checked before compiling is checked first
(``default_config.validate``: config keys and values, mesh against devices
and batch; the workdir and output paths; then the data files; then the
checkpoint's model against the config), so bad input fails in seconds with
a message that says what to change.  A restart with the same workdir
resumes from its newest usable checkpoint.  Errors a user can cause are one
``error: ...`` line and exit status 1 (``user_errors.py``; ``--debug``
shows their traceback).
"""
from __future__ import annotations

if __name__ == "__main__":  # first, before the imports below: restart once with
  from transformer_xl import host_memory  # glibc's huge pages for XLA:CPU's buffers
  host_memory.reexec_with_hugepages()

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from transformer_xl import (checkpointing, data, default_config, distributed, evaluate,
                            host_memory, language_model, metrics, sharding, train, user_errors,
                            workdir)

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, TensorBoard "
                               "events and eval_results.json.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "score", "generate"],
                          "train: train (resuming if possible). "
                          "eval: score valid and test from the latest checkpoint. "
                          "score: per-token NLL of --tokens or --text, written to --out. "
                          "generate: continue --prompt or --prompt_file (language_model.py).")
_TOKENS = flags.DEFINE_string(
    "tokens", None, "--mode=score: .npy integer array [B, T+1]; each row one contiguous "
    "stream of token ids.")
_TEXT = flags.DEFINE_string(
    "text", None, "--mode=score: a text file, tokenised with the dataset's vocabulary and "
    "scored as one stream (its first token in the context of the boundary symbol).")
_OUT = flags.DEFINE_string(
    "out", None, "--mode=score: output .npy, float32 [B, T]: entry (b, t) is the NLL in nats "
    "of token t+1 given tokens up to t. --mode=generate (optional): a .json of the prompt, "
    "the tokens and text of every sample, and the settings.")
_PROMPT = flags.DEFINE_string("prompt", None, "--mode=generate: the text to continue.")
_PROMPT_FILE = flags.DEFINE_string("prompt_file", None, "--mode=generate: a file to continue.")
_NUM_TOKENS = flags.DEFINE_integer("num_tokens", 100, "--mode=generate: tokens per sample.")
_TOP_K = flags.DEFINE_integer("top_k", 40, "--mode=generate: sample from the k most probable "
                              "tokens (0 = all, 1 = greedy; Appendix E: 40).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "--mode=generate: nucleus mass in (0, 1].")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "--mode=generate: softmax temperature.")
_SEED = flags.DEFINE_integer("seed", 0, "--mode=generate: PRNG seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "--mode=generate: samples, one batch.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 for a multi-process run "
    "(jax.distributed). Leave unset on a Cloud TPU VM slice: it is detected there.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0-based.")
_DEBUG = flags.DEFINE_bool(
    "debug", False, "Show the Python traceback of user errors (bad config, data, workdir, "
    "checkpoints, non-finite training, score or generation input) as well as their one-line "
    "message.")


def main(argv):
  """Flags -> config -> train.train_and_evaluate / evaluate.run_eval / evaluate.run_score /
  language_model.run_generate."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required.")
  if _CONFIG.value is None and _MODE.value == "train":
    raise app.UsageError("--config is required to train.")
  if _MODE.value == "score" and (bool(_TOKENS.value) == bool(_TEXT.value) or not _OUT.value):
    raise app.UsageError("--mode=score needs --out=NLL.npy and one of --tokens=FILE.npy or "
                         "--text=FILE.")
  if not flags.FLAGS["verbosity"].present:  # orbax and tfds log every file at INFO
    logging.set_verbosity(logging.WARNING)
  checkpointing.LOG_ORBAX_ERRORS = _DEBUG.value
  host_memory.release_after_compiles()  # compilers' freed memory back to the kernel
  with user_errors.report(_DEBUG.value):
    _run()


def _run():
  """main's work, in the order of its checks (paths, config, workdir, data, then the mode)."""
  tokens = None
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if _MODE.value == "score":
    evaluate.check_output_path(_OUT.value)
  workdir.require_dir(_WORKDIR.value)
  config = _CONFIG.value if _CONFIG.value is not None else workdir.load_config(_WORKDIR.value)
  if _MODE.value == "score" and _TOKENS.value:
    tokens = user_errors.load_tokens(_TOKENS.value)
  default_config.validate(config, jax.device_count())
  if _MODE.value == "train":
    workdir.check_writable(_WORKDIR.value)
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  corpus = None
  if _MODE.value in ("train", "eval") or (_MODE.value == "score" and _TEXT.value):
    data_cfg = config.data.to_dict()
    corpus = distributed.process_0_first(
        lambda: data.load_corpus(data_cfg.pop("dataset"), **data_cfg), (data.DataError,))
    metrics.log(f"Corpus {corpus.name}: vocab {corpus.vocab_size:,}, " + ", ".join(
        f"{k} {v.num_tokens:,} tokens" for k, v in corpus.splits.items())
        + f"; mesh {dict(mesh.shape)}; {jax.process_count()} process(es).")
  if _MODE.value == "train":
    train.train_and_evaluate(config, _WORKDIR.value, corpus, mesh)
  elif _MODE.value == "eval":
    evaluate.run_eval(config, _WORKDIR.value, corpus, mesh)
  elif _MODE.value == "generate":
    language_model.run_generate(
        config, _WORKDIR.value, mesh, prompt=_PROMPT.value, prompt_file=_PROMPT_FILE.value,
        num_tokens=_NUM_TOKENS.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
        temperature=_TEMPERATURE.value, seed=_SEED.value, num_samples=_NUM_SAMPLES.value,
        out=_OUT.value)
  else:
    if tokens is None:
      text = user_errors.read_text(_TEXT.value)
      tokens = evaluate.text_tokens(corpus, text)
      unknown = evaluate.unknown_words(corpus, text)
      metrics.log(f"--text={_TEXT.value}: {tokens.shape[1] - 1:,} tokens; {unknown:,} "
                  f"unknown word(s) ({100 * unknown / max(tokens.shape[1] - 1, 1):.2f}%) are "
                  "scored as the vocabulary's unknown-word symbol.")
    evaluate.run_score(config, _WORKDIR.value, mesh, tokens, _OUT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=user_errors.parse_flags)
