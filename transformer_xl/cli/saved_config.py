"""The ``--config`` of an eval, score or generate command without one: the workdir's config.json.

ml_collections creates the ``--config.<section>.<key>=value`` override flags
only for a ``--config=FILE`` given on the command line (it reads their names
from ``sys.argv``: ``config_flags._ConfigFlag._GetOverrides``).  When the
command line has overrides but no ``--config`` and the mode is not train,
``user_errors.parse_flags`` therefore names this file, with the workdir as
its argument, as the config (``argv_with_saved_config``):

    python -m transformer_xl.main --workdir=W --mode=score --tokens=X.npy \
        --out=nll.npy --config.eval.mem_len=1600
    # is parsed as
    python -m transformer_xl.main --config=<this file>:W --workdir=W ...

so the overrides apply to ``W/config.json`` (``run.workdir.load_config``)
and are validated as those of any config file.  ``source`` names such a
config in the messages that refuse an architecture change.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import ml_collections
from absl import flags
from etils import epath

from transformer_xl import errors
from transformer_xl.run import workdir as wd

PATH = os.path.abspath(__file__)
# A flag argument: -name or --name, with =value or not (absl's forms).
_FLAG = re.compile(r"--?(?P<name>[^=\s]+)(?:=(?P<value>.*))?", re.DOTALL)


def get_config(workdir: str) -> ml_collections.ConfigDict:
  """The config saved in ``<workdir>/config.json`` (``wd.load_config``)."""
  return wd.load_config(workdir)


def argv_with_saved_config(
    argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS
) -> list[str]:
  """``argv`` with ``--config=<PATH>:<workdir>`` after the program name when it
  has ``--config.*`` overrides but no ``--config`` (else ``argv`` as it is).

  ``--mode`` and ``--workdir`` are read as absl reads them (``--x=v``,
  ``--x v``, one dash or two, the last one given; ``--flagfile`` expanded;
  nothing after ``--``); ``flag_values`` (``main``'s flags) says which
  flags take the next argument as their value.  The saved config is read
  here once, so that a missing or damaged one is its own one-line error,
  not ml_collections' "failed to load".

  Args:
    argv: the command line, ``sys.argv``-like (program name first).
    flag_values: the defined flags (without ``mode`` and ``workdir``, not
      ``main``'s: ``argv`` is returned as it is).

  Returns:
    The command line to parse.

  Raises:
    errors.ConfigError: overrides with ``--mode=train`` (the default) or with
      no ``--workdir``.
    FileNotFoundError, errors.WorkdirError: no usable ``<workdir>/config.json``
      (``wd.load_config``'s messages).
  """
  if "mode" not in flag_values or "workdir" not in flag_values:  # not main's flags
    return list(argv)
  try:
    args = flag_values.read_flags_from_files(list(argv), force_gnu=False)
  except flags.Error:  # e.g. a missing --flagfile: the parse proper reports it
    args = list(argv)
  found: dict[str, str] = {"mode": flag_values["mode"].default}
  has_config = has_overrides = False
  rest = iter(args[1:])
  for arg in rest:
    if arg == "--":
      break
    match = _FLAG.fullmatch(arg)
    if match is None:
      continue
    name, value = match["name"], match["value"]
    if name == "config":
      has_config = True
    elif re.match(r"(no)?config\.", name):
      has_overrides = True
    elif value is None and name in flag_values and not flag_values[name].boolean:
      value = next(rest, None)  # --name VALUE
    if name in ("mode", "workdir") and value is not None:
      found[name] = value
  if has_config or not has_overrides:
    return list(argv)
  if found["mode"] == "train":
    raise errors.ConfigError(
        "--config.* overrides need --config=FILE to train (e.g. --config=configs/quickstart.py): "
        "without it they apply to the workdir's config.json in --mode=eval, score and generate "
        "only."
    )
  if "workdir" not in found:
    raise errors.ConfigError(
        "--config.* overrides without --config need --workdir=DIR: they apply to its config.json."
    )
  get_config(found["workdir"])  # a missing or damaged config.json: its own message, now
  return [argv[0], f"--config={PATH}:{found['workdir']}", *argv[1:]]


def source(config_filename: str) -> str | None:
  """What a config named ``config_filename`` (ml_collections' ``--config``
  value, ``FILE[:ARG]``) came from, for messages, when it is this file's:
  "W/config.json with the --config.* overrides"; None for another file."""
  path, _, workdir = config_filename.partition(":")
  if os.path.abspath(path) != PATH:
    return None
  return f"{epath.Path(workdir) / 'config.json'} with the --config.* overrides"
