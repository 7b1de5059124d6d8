"""One base class for what a user can get wrong, reported as one line."""

from __future__ import annotations

import inspect

import pytest

from transformer_xl import data, default_config, errors
from transformer_xl.analysis import recl
from transformer_xl.cli import user_errors
from transformer_xl.convert import errors as convert_errors
from transformer_xl.data import download
from transformer_xl.inference import evaluate
from transformer_xl.run import checkpointing, metrics, workdir

KINDS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, errors.UserError) and cls is not errors.UserError
]


def test_every_kind_is_reexported_by_the_module_that_raises_it():
  reexports = {
      data.DataError,
      default_config.ConfigError,
      evaluate.ScoreInputError,
      checkpointing.CheckpointError,
      metrics.NonFiniteError,
      workdir.WorkdirError,
      convert_errors.ConvertError,
      download.DownloadError,
      recl.UsageError,
  }
  assert reexports == set(KINDS)


@pytest.mark.parametrize(
    "kind, builtin",
    [
        (errors.ConfigError, ValueError),
        (errors.DataError, FileNotFoundError),
        (errors.WorkdirError, RuntimeError),
        (errors.CheckpointError, RuntimeError),
        (errors.NonFiniteError, RuntimeError),
        (errors.ScoreInputError, ValueError),
        (errors.ConvertError, ValueError),
        (errors.UsageError, ValueError),
        (errors.DownloadError, OSError),
    ],
)
def test_each_kind_keeps_its_builtin_base(kind, builtin):
  assert issubclass(kind, errors.UserError) and issubclass(kind, builtin)
  with pytest.raises(builtin):  # ``except <builtin>`` code keeps catching it
    raise kind("x")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_the_command_line_reports_each_kind_as_one_line(kind, capsys):
  with pytest.raises(SystemExit) as exit_info:
    with user_errors.report(debug=False):
      raise kind("data.vocab_size=3 is too small: use at least 256.")
  assert exit_info.value.code == "error: data.vocab_size=3 is too small: use at least 256."


def test_debug_shows_the_traceback_and_a_bug_is_not_a_user_error():
  with pytest.raises(errors.ConfigError):
    with user_errors.report(debug=True):
      raise errors.ConfigError("x")
  with pytest.raises(KeyError):  # a bug propagates with its traceback
    with user_errors.report(debug=False):
      raise KeyError("x")
