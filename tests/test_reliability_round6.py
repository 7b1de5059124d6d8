"""Reliability, round 6 (issue 62): each case found by trying round 5's memories
as a user and a hostile tester would, tested at its cause."""

from __future__ import annotations

import pytest

from transformer_xl import default_config

from helpers import CONFIGS, load_config, run_main


def _problems(config) -> str:
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(config, 1)
  return str(err.value)


@pytest.mark.parametrize("name", ["KNN", "knnn", "compresive"])
def test_a_misspelt_memory_is_one_problem_not_a_key_error(name):
  c = load_config("quickstart")
  c.model.memory = name
  message = _problems(c)
  assert f"model.memory={name!r}: use one of ('armt', 'compressive', 'knn', 'xl')." in message
  assert message.count("\n  - ") <= 1  # that problem alone


def test_a_misspelt_memory_on_the_command_line_is_one_error_line(tmp_path):
  r = run_main(
      [
          f"--config={CONFIGS / 'quickstart.py'}",
          f"--workdir={tmp_path}",
          "--config.model.memory=knnn",
      ],
      devices=1,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert "model.memory='knnn': use one of" in r.stderr


def test_a_bad_knn_setting_is_reported_once_under_its_own_key():
  c = load_config("quickstart")
  c.model.memory = "knn"
  c.model.knn.num_neighbors = 0
  message = _problems(c)
  assert message.count("num_neighbors") == 1 and "eval.knn" not in message


def test_a_bad_knn_eval_override_names_the_key_given():
  c = load_config("quickstart")
  c.model.memory = "knn"
  c.model.knn.update(memory_size=64, num_neighbors=8)
  c.eval.knn.memory_size = 4  # fewer entries than the model's 8 neighbours
  message = _problems(c)
  assert "eval.knn.memory_size=4" in message
  assert "eval.knn.num_neighbors" not in message and "eval.knn.layers" not in message
