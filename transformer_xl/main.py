"""Command line: train, evaluate or score Transformer-XL.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl --mode=score --tokens=x.npy --out=nll.npy

Any config value can be overridden with ``--config.<section>.<key>=value``.
Everything that can be checked before compiling is checked first
(``default_config.validate``: config keys and values, mesh against devices
and batch; the workdir and output paths; then the data files; then the
checkpoint's model against the config), so bad input fails in seconds with
a message that says what to change.  A restart with the same workdir
resumes from its newest usable checkpoint.

Every error a user can cause (config, data, workdir, disk, checkpoints,
non-finite training, score input) ends the run with one ``error: ...``
message on stderr and exit status 1; a Python traceback means a bug, or
that ``--debug`` was given (it shows the traceback of those errors too).
"""
from __future__ import annotations

import errno
import os
import re
import sys

import jax
import numpy as np
from absl import app, flags, logging
from etils import epath
from ml_collections import config_flags

from transformer_xl import (checkpointing, data, default_config, distributed, evaluate, metrics,
                            sharding, train, workdir)

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, TensorBoard "
                               "events and eval_results.json.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "score"],
                          "train: train (resuming if possible). "
                          "eval: score valid and test from the latest checkpoint. "
                          "score: per-token NLL of --tokens or --text, written to --out.")
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
_DEBUG = flags.DEFINE_bool(
    "debug", False, "Show the Python traceback of user errors (bad config, data, workdir, "
    "checkpoints, non-finite training, score input) as well as their one-line message.")

# What a user can cause; reported as one "error: ..." line (with --debug: a traceback).
USER_ERRORS = (default_config.ConfigError, data.DataError, FileNotFoundError,
               checkpointing.CheckpointError, metrics.NonFiniteError, evaluate.ScoreInputError,
               workdir.WorkdirError)
# OSErrors of the environment (disk, permissions), reported the same way.
_OS_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
              errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
              errno.EPERM: "operation not permitted", errno.ENOTDIR: "not a directory",
              errno.EISDIR: "is a directory", errno.EEXIST: "already exists"}


def _os_error_message(err: OSError) -> str:
  """One line for an OSError of the environment: the path, what happened, what to do."""
  path = f"{err.filename}: " if err.filename else ""
  what = _OS_ERRNOS.get(err.errno, err.strerror or str(err))
  advice = (" Free some space (or use another --workdir); the checkpoints already written are "
            "intact and the same command resumes from the newest." if err.errno in
            (errno.ENOSPC, errno.EDQUOT) else " Check the path and its permissions.")
  return f"{path}{what}.{advice}"


def _load_tokens(path: str) -> np.ndarray:
  """The --tokens array, checked (evaluate.check_tokens without the vocabulary).

  Raises:
    evaluate.ScoreInputError: not a readable .npy file, or not a token array.
  """
  try:
    tokens = np.load(path, allow_pickle=False)
  except FileNotFoundError:
    raise evaluate.ScoreInputError(f"--tokens={path} does not exist.") from None
  except (ValueError, OSError, EOFError) as err:
    raise evaluate.ScoreInputError(f"--tokens={path} is not a .npy array ({err}); write one "
                                   "with numpy.save.") from None
  try:
    return evaluate.check_tokens(tokens)
  except evaluate.ScoreInputError as err:
    raise evaluate.ScoreInputError(f"--tokens={path}: {err}") from None


def _read_text(path: str) -> str:
  """The --text file as UTF-8.

  Raises:
    evaluate.ScoreInputError: missing, or not UTF-8.
  """
  try:
    return epath.Path(path).read_text(encoding="utf-8")
  except FileNotFoundError:
    raise evaluate.ScoreInputError(f"--text={path} does not exist.") from None
  except UnicodeDecodeError as err:
    raise evaluate.ScoreInputError(
        f"--text={path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
        f"{err.start}); convert it to UTF-8.") from None


def main(argv):
  """Flags -> config -> train.train_and_evaluate / evaluate.run_eval / evaluate.run_score."""
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
  try:
    _run()
  except USER_ERRORS as err:
    if _DEBUG.value:
      raise
    sys.exit(f"error: {err}")
  except OSError as err:
    if _DEBUG.value or err.errno not in _OS_ERRNOS:
      raise
    sys.exit(f"error: {_os_error_message(err)}")


def _run():
  """main's work, in the order of its checks (paths, config, workdir, data,
  then the mode); raises the USER_ERRORS."""
  tokens = None
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if _MODE.value == "score":
    evaluate.check_output_path(_OUT.value)
  workdir.require_dir(_WORKDIR.value)
  config = _CONFIG.value if _CONFIG.value is not None else workdir.load_config(_WORKDIR.value)
  if _MODE.value == "score" and _TOKENS.value:
    tokens = _load_tokens(_TOKENS.value)
  default_config.validate(config, jax.device_count())
  if _MODE.value == "train":
    workdir.check_writable(_WORKDIR.value)
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  corpus = None
  if _MODE.value != "score" or _TEXT.value:
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
  else:
    if tokens is None:
      text = _read_text(_TEXT.value)
      tokens = evaluate.text_tokens(corpus, text)
      unknown = evaluate.unknown_words(corpus, text)
      metrics.log(f"--text={_TEXT.value}: {tokens.shape[1] - 1:,} tokens; {unknown:,} "
                  f"unknown word(s) ({100 * unknown / max(tokens.shape[1] - 1, 1):.2f}%) are "
                  "scored as the vocabulary's unknown-word symbol.")
    evaluate.run_score(config, _WORKDIR.value, mesh, tokens, _OUT.value)


def _config_file_problem(argv) -> str | None:
  """What is wrong with the --config file (missing, a syntax error), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg[len("--config="):]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    path = value.split(":", 1)[0]
    if not os.path.isfile(path):
      return (f"--config={value}: {path} is not a file; the configs are in configs/ "
              "(e.g. --config=configs/quickstart.py).")
    try:
      with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")
    except SyntaxError as err:
      return f"--config={value}: syntax error in {path}, line {err.lineno}: {err.msg}."
    except (OSError, UnicodeDecodeError, ValueError) as err:
      return f"--config={value}: {path} cannot be read ({err})."
  return None


def _parse_flags(argv):
  """absl flag parsing; a bad --config file, an unknown --config.key or a bad
  flag value becomes a one-line error (``--debug``: a traceback)."""
  debug = "--debug" in argv or "--debug=true" in argv
  problem = _config_file_problem(argv)
  if problem and not debug:
    sys.exit(f"error: {problem}")
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as err:  # raised by ml_collections for unknown keys
    if debug:
      raise
    msg = re.sub(r"[\\'\"]+", " ", str(err).replace("\\n", " ").replace("\n", " ")).split()
    if "get_config" in msg:
      sys.exit("error: the --config file has no get_config() function returning the config.")
    sys.exit(f"error: unknown config key in the --config.* overrides: {' '.join(msg)} "
             "(every key is listed in transformer_xl/default_config.py)")
  except flags.Error as err:
    if debug:
      raise
    sys.exit(f"error: {err}")
  except Exception as err:  # pylint: disable=broad-except
    # Raised by the code of the --config file itself (its get_config()).
    if debug:
      raise
    sys.exit(f"error: the --config file failed to build the config: {type(err).__name__}: "
             f"{err} (run with --debug for the traceback).")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
