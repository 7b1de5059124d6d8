"""What a user can get wrong on the command line, as one ``error: ...`` line.

``main`` runs its work inside ``report``: every error a user can cause
(config, data, workdir, disk, checkpoints, non-finite training, score or
generation input) ends the run with one message on stderr and exit status 1,
before anything is compiled where it can be checked that early; a Python
traceback means a bug, or that ``--debug`` was given (it shows the traceback
of these errors too).  ``parse_flags`` does the same for the flags
themselves (a missing or broken ``--config`` file, an unknown
``--config.key``, a bad flag value), ``load_tokens`` / ``read_text`` read
the score inputs with messages that name the file, and
``check_output_path`` checks ``--out`` before anything is computed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Iterator

import jax
import numpy as np
from absl import flags
from etils import epath

from transformer_xl import default_config, errors
from transformer_xl.cli import saved_config
from transformer_xl.inference import evaluate
from transformer_xl.model import memory

# What a user can cause; reported as one "error: ..." line (with --debug: a traceback):
# every kind of errors.UserError (config, data, workdir, checkpoint, non-finite training,
# score input, ...) and a missing file.
USER_ERRORS = (errors.UserError, FileNotFoundError)
# OSErrors of the environment (disk, permissions), reported the same way.
OS_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
}


@contextlib.contextmanager
def report(debug: bool) -> Iterator[None]:
  """Runs the body; a USER_ERRORS exception, an OSError of the environment
  (OS_ERRNOS) or XLA's out of memory (``is_out_of_memory``) exits with
  ``error: <message>`` (status 1), Ctrl-C with one line (status 130), or
  re-raises with ``debug``.  Any other exception propagates (a bug: its
  traceback is shown).
  """
  try:
    yield
  except KeyboardInterrupt:  # Ctrl-C outside training's loop (StopSignals handles it there)
    if debug:
      raise
    sys.stderr.write("\ninterrupted (Ctrl-C); checkpoints already written are intact.\n")
    sys.exit(130)
  except USER_ERRORS as err:
    if debug:
      raise
    sys.exit(f"error: {err}")
  except OSError as err:
    if debug or err.errno not in OS_ERRNOS:
      raise
    sys.exit(f"error: {os_error_message(err)}")
  except jax.errors.JaxRuntimeError as err:
    if debug or not is_out_of_memory(err):
      raise
    sys.exit(f"error: {out_of_memory_message(err)}")


def output_error(err: OSError, path: str, flag: str = "--out") -> errors.UsageError:
  """The one line for an ``--out`` file that could not be written (a full
  disk, a read-only directory): the flag, the file, the cause, the fix."""
  what = OS_ERRNOS.get(err.errno, err.strerror or str(err))
  return errors.UsageError(
      f"{flag}={path}: cannot write it ({what}); free some space or give another {flag} "
      "(nothing was written there: an existing file is unchanged). The workdir was not "
      "touched."
  )


def is_out_of_memory(err: Exception) -> bool:
  """Whether XLA's error is an allocation that failed (``RESOURCE_EXHAUSTED``
  on accelerators; ``INTERNAL: ... Out of memory allocating N bytes`` when
  the CPU client dispatches)."""
  text = str(err)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def out_of_memory_message(err: Exception) -> str:
  """One line for an accelerator (or host) out of memory: XLA's
  ``RESOURCE_EXHAUSTED``, the size it asked for where it says, and the
  settings that reduce what a step holds."""
  text = str(err)
  asked = re.search(r"(\d+) bytes", text)
  size = f" (it asked for {int(asked.group(1)) / 2**30:,.2f} GiB)" if asked else ""
  device = jax.devices()[0]
  kind = f" ({device.device_kind})" if device.device_kind != device.platform else ""
  return (
      f"out of memory on the {device.platform} device{kind}{size}. "
      "Lower what one step holds: train.global_batch, or more micro-batches "
      "(train.batch_chunk); model.tgt_len and model.mem_len (eval.tgt_len, eval.mem_len, "
      "eval.global_batch for evaluation); the memory variant's slots (its "
      "model.<variant>.* settings); the model's size "
      "(n_layer, d_model, d_inner); or use model.remat=full or model.dtype=bfloat16. "
      "Checkpoints already written are intact."
  )


def os_error_message(err: OSError) -> str:
  """One line for an OSError of the environment: the path, what happened, what to do."""
  path = f"{err.filename}: " if err.filename else ""
  what = OS_ERRNOS.get(err.errno, err.strerror or str(err))
  advice = (
      " Free some space (or use another --workdir); the checkpoints already written are "
      "intact and the same command resumes from the newest."
      if err.errno in (errno.ENOSPC, errno.EDQUOT)
      else " Check the path and its permissions."
  )
  return f"{path}{what}.{advice}"


def load_tokens(path: str, flag: str = "--tokens") -> np.ndarray:
  """The --tokens array (or another ``flag``'s), checked
  (evaluate.check_tokens without the vocabulary).

  Returns:
    int32 [B, T+1] token ids.

  Raises:
    evaluate.ScoreInputError: not a readable .npy file, or not a token array.
  """
  try:
    tokens = np.load(path, allow_pickle=False)
  except FileNotFoundError:
    raise evaluate.ScoreInputError(f"{flag}={path} does not exist.") from None
  except (ValueError, OSError, EOFError) as err:
    raise evaluate.ScoreInputError(
        f"{flag}={path} is not a .npy array ({err}); write one with numpy.save."
    ) from None
  try:
    return evaluate.check_tokens(tokens)
  except evaluate.ScoreInputError as err:
    raise evaluate.ScoreInputError(f"{flag}={path}: {err}") from None


def read_text(path: str, flag: str = "--text") -> str:
  """The --text file (or another ``flag``'s) as UTF-8 (a byte order mark at its start dropped, as
  corpus files are read: ``text_reading._open_lines``).

  Raises:
    evaluate.ScoreInputError: missing, or not UTF-8.
  """
  try:
    text = epath.Path(path).read_text(encoding="utf-8")
    return text.removeprefix("\ufeff")  # a byte order mark (epath reads utf-8 only)
  except FileNotFoundError:
    raise evaluate.ScoreInputError(f"{flag}={path} does not exist.") from None
  except UnicodeDecodeError as err:
    raise evaluate.ScoreInputError(
        f"{flag}={path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
        f"{err.start}); convert it to UTF-8."
    ) from None


def check_output_path(
    out_path: str, example: str = "nll.npy", error: type[Exception] = evaluate.ScoreInputError
) -> None:
  """Checks, before any scoring or generation, that ``out_path`` can be written.

  Args:
    out_path: the --out path.
    example: a file name the message suggests.
    error: the kind raised (``evaluate.ScoreInputError`` for --mode=score).

  Raises:
    error: it is a directory, its directory does not exist, or it cannot
      be written there.
  """
  path = epath.Path(out_path)
  if path.is_dir():
    raise error(f"--out={out_path} is a directory; give a file name (e.g. {example}).")
  if not path.parent.is_dir():
    raise error(f"--out={out_path}: the directory {path.parent} does not exist; create it first.")
  probe = path.parent / f".{path.name}.probe.{jax.process_index()}"
  try:
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as err:
    raise error(
        f"--out={out_path} cannot be written "
        f"({err.strerror or err}); choose a writable location."
    ) from None


def config_file_problem(argv) -> str | None:
  """What is wrong with the --config file of ``argv`` (missing, a syntax
  error, unreadable), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg[len("--config=") :]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    path = value.split(":", 1)[0]
    if not os.path.isfile(path):
      return (
          f"--config={value}: {path} is not a file; the configs are in configs/ "
          "(e.g. --config=configs/quickstart.py)."
      )
    try:
      with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")
    except SyntaxError as err:
      return f"--config={value}: syntax error in {path}, line {err.lineno}: {err.msg}."
    except (OSError, UnicodeDecodeError, ValueError) as err:
      return f"--config={value}: {path} cannot be read ({err})."
  return None


def repeated_override(argv) -> str | None:
  """A tuple setting's ``--config.KEY`` given more than once in ``argv`` (absl
  joins the values, e.g. ``(-1,)`` and ``(1,)`` into ``(-1, 1)``; a scalar
  given twice takes the last, as absl does), or None."""
  seen: dict[str, str] = {}
  tuples = default_config.tuple_elements()
  for arg in argv:
    key = re.match(r"--config\.([\w.]+)(=|$)", arg)
    if key is None or key[1] not in tuples:
      continue
    if key[1] in seen:
      return (
          f"--config.{key[1]} is given twice ({seen[key[1]]} and {arg}): give it once"
          " (a tuple's values would be joined)."
      )
    seen[key[1]] = arg
  return None


def parse_flags(argv):
  """absl flag parsing for ``app.run(..., flags_parser=parse_flags)``: a bad
  --config file, an unknown --config.key or a bad flag value becomes a
  one-line error and exit status 1 (``--debug``: a traceback).

  ``--config.*`` overrides without ``--config`` (eval, score, generate)
  override the workdir's config.json: ``saved_config`` is named as the
  config file (``saved_config.argv_with_saved_config``; ml_collections reads
  the override names from ``sys.argv``, which holds that command line while
  the flags are parsed).
  """
  debug = "--debug" in argv or "--debug=true" in argv
  problem = config_file_problem(argv) or repeated_override(argv)
  if problem and not debug:
    sys.exit(f"error: {problem}")
  with report(debug):  # overrides with --mode=train, a missing or damaged config.json
    parsed_argv = saved_config.argv_with_saved_config(argv)
  original_argv = sys.argv
  if parsed_argv != list(argv):
    sys.argv = parsed_argv  # where ml_collections reads the override names
  try:
    return flags.FLAGS(parsed_argv)
  except (AttributeError, KeyError) as err:  # raised by ml_collections for unknown keys
    if debug:
      raise
    msg = re.sub(r"[\\'\"]+", " ", str(err).replace("\\n", " ").replace("\n", " ")).split()
    if "get_config" in msg:
      sys.exit("error: the --config file has no get_config() function returning the config.")
    for arg in parsed_argv:  # a memory variant's setting under its flat name of before
      key = re.match(r"--config\.([\w.]+)", arg)
      new = key and memory.renamed(key[1])
      if new:
        sys.exit(
            f"error: --config.{key[1]} is now --config.{new} (a memory variant's settings are "
            "a section of their own: model.<variant>.<setting>)."
        )
    sys.exit(
        f"error: unknown config key in the --config.* overrides: {' '.join(msg)} "
        "(every key is listed in transformer_xl/default_config.py)"
    )
  except flags.Error as err:
    if debug:
      raise
    sys.exit(f"error: {err}")
  except Exception as err:  # pylint: disable=broad-except
    # Raised by the code of the --config file itself (its get_config()).
    if debug:
      raise
    sys.exit(
        f"error: the --config file failed to build the config: {type(err).__name__}: "
        f"{err} (run with --debug for the traceback)."
    )
  finally:
    sys.argv = original_argv
