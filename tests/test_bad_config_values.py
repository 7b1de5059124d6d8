"""Bad input refused by construction: every key of ``default_config`` set in turn
to wrong values (wrong type, negative, zero, huge, NaN, empty, a misspelt
choice) is either valid or a ``ConfigError`` of ``default_config.validate``
(one ``error:`` line on the command line), never another exception: the
validation alone, in-process, so it is fast.  A value of the wrong type that
``ml_collections`` refuses on assignment is the flag parser's one-line error
(``user_errors.parse_flags``; one case on the command line below)."""

from __future__ import annotations

from typing import Any

import ml_collections
import pytest

from transformer_xl import default_config

from helpers import CONFIGS, run_main


def leaves(d: dict, prefix: str = ""):
  for key, value in d.items():
    if isinstance(value, dict):
      yield from leaves(value, prefix + key + ".")
    else:
      yield prefix + key, value


def bad_values(value: Any) -> list[Any]:
  if isinstance(value, bool):
    return [not value]
  if isinstance(value, int):
    return [-1, 0, -(10**12), 10**12]
  if isinstance(value, float):
    return [-1.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e30]
  if isinstance(value, str):
    return ["", " ", "knnn", "x" * 300, "../../etc"]
  if isinstance(value, tuple):
    return [(), (-1,), (0, 0), ("a",), (1.5,), (True,)]
  return []


KEYS = [k for k, v in leaves(default_config.get_config().to_dict()) if bad_values(v)]


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> bool:
  """Sets ``key``; False where ml_collections refuses the value's type."""
  *path, last = key.split(".")
  section = config
  for part in path:
    section = section[part]
  try:
    with config.unlocked():
      section[last] = value
  except (TypeError, ValueError, KeyError, AttributeError):
    return False
  return True


@pytest.mark.parametrize("key", KEYS)
def test_a_wrong_value_of_any_key_is_valid_or_one_config_error(key):
  default = dict(leaves(default_config.get_config().to_dict()))[key]
  unexpected = []
  for value in bad_values(default):
    config = default_config.get_config()
    if not _set(config, key, value):
      continue
    try:
      default_config.validate(config, 1)  # training's checks: a superset of evaluation's
    except default_config.ConfigError as err:
      assert str(err).startswith("Invalid config:") or "\n" not in str(err), str(err)
    except Exception as err:  # pylint: disable=broad-except
      unexpected.append(f"{key}={value!r}: {type(err).__name__}: {err}")
  assert not unexpected, "\n".join(unexpected)


def test_every_tuple_setting_has_its_element_type():
  tuples = {k for k, v in leaves(default_config.get_config().to_dict()) if isinstance(v, tuple)}
  assert tuples == set(default_config.tuple_elements())


def test_a_tuple_of_the_wrong_elements_on_the_command_line_is_one_error_line(tmp_path):
  r = run_main(
      [
          f"--config={CONFIGS / 'quickstart.py'}",
          f"--workdir={tmp_path}",
          "--config.model.cutoffs=('a',)",
      ],
      devices=1,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "model.cutoffs=('a',): give a tuple of int values." in r.stderr
