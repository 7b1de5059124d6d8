"""What the command line writes where its output is not a terminal (a log
file, a pipe, a batch job): its own lines, and no preparation noise from
tfds (progress bars with escape codes, its printed lines, its warning about
a custom configuration) unless ``--verbosity`` asks for it; the training
progress bar only on a terminal."""

import io
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.cli import process_settings
from transformer_xl.run import metrics

from helpers import REPO, run_main, tiny_flags

# 3 steps of segments and memory of 16, evaluation with memory 32, a checkpoint at step 3.
TINY = tiny_flags(
    model__tgt_len=16,
    model__mem_len=16,
    train__num_steps=3,
    train__warmup_steps=0,
    eval__tgt_len=16,
    eval__mem_len=32,
    eval__global_batch=8,
    checkpoint__every_steps=3,
)


def _main(args):
  """``python -m transformer_xl.main ARGS``, piped, on one CPU device."""
  return run_main(args, devices=1, timeout=600)


# tfds's noise, each as it appeared in a log before: its progress bars (their
# names), the two lines it prints on stdout, its warning.
TFDS_NOISE = (
    "Generating splits",
    "examples/s",
    "Shuffling",
    "Downloading and preparing dataset",
    "Subsequent calls will reuse this data",
    "Using custom data configuration",
)


def _own_text(tmp_path: Path) -> list[str]:
  """Three small word-level files and the flags of a tiny training on them."""
  rng = np.random.default_rng(0)
  words = "the a of and cat dog house river stone light dark".split()
  files = tmp_path / "files"
  files.mkdir()
  for split, lines in (("train", 400), ("valid", 60), ("test", 60)):
    text = "\n".join(" ".join(rng.choice(words, 12)) for _ in range(lines)) + "\n"
    (files / f"{split}.txt").write_text(text)
  return [
      f"--config={REPO / 'configs/text.py'}",
      *(f"--config.data.{s}_files={files / s}.txt" for s in ("train", "valid", "test")),
      "--config.data.tokenizer=word",
      "--config.data.vocab_size=0",
      *TINY,
  ]


@pytest.mark.slow
def test_own_text_commands_print_no_preparation_noise_unless_verbosity_asks(tmp_path):
  """Issue 37: every own-text command printed tfds's progress bars (escape
  codes and carriage returns in a log file), its "Downloading and preparing
  dataset Unknown size ..." lines and absl's "Using custom data configuration"
  warning, and training wrote its progress bar beside the step lines.  With
  stdout and stderr not terminals: the package's lines only; with
  ``--verbosity=1`` tfds's lines are back (as its logs)."""
  flags = _own_text(tmp_path)
  workdir = tmp_path / "run"
  r = _main([*flags, f"--workdir={workdir}", f"--config.data.data_dir={tmp_path / 'tfds'}"])
  assert r.returncode == 0, r.stderr[-3000:]
  evaluated = _main([f"--workdir={workdir}", "--mode=eval"])
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  for out in (r.stdout, r.stderr, evaluated.stdout, evaluated.stderr):
    assert "\x1b[" not in out and "\r" not in out, out[-2000:]
    assert not [noise for noise in TFDS_NOISE if noise in out], out[-2000:]
  assert "step 3: loss=" in r.stdout and "Corpus text:" in r.stdout
  assert "step/s" not in r.stderr  # no training progress bar
  assert "Wrote " in evaluated.stdout and "eval_results.json" in evaluated.stdout
  # The stderr of both: nothing at all (no warning was due).
  assert r.stderr.strip() == "" and evaluated.stderr.strip() == "", r.stderr + evaluated.stderr

  verbose = _main(
      [
          *flags,
          f"--workdir={tmp_path / 'verbose'}",
          f"--config.data.data_dir={tmp_path / 'tfds_verbose'}",
          "--config.train.num_steps=1",
          "--verbosity=1",
      ]
  )
  assert verbose.returncode == 0, verbose.stderr[-3000:]
  for noise in ("Downloading and preparing dataset", "Using custom data configuration"):
    assert noise in verbose.stderr, verbose.stderr[-3000:]
  assert "Generating splits" in verbose.stderr  # tfds's bars, as asked
  assert "Downloading and preparing" not in verbose.stdout  # a log now, not a print


def test_tfds_custom_configuration_warning_only_with_verbosity(monkeypatch):
  """The handler's filter drops tfds's warning about a custom BuilderConfig
  (every dataset of this package) without ``--verbosity``, keeps it with
  it, and keeps every other warning either way."""
  import tensorflow_datasets as tfds
  from absl import logging as absl_logging
  from tensorflow_datasets.core.utils import tqdm_utils

  handler = absl_logging.get_absl_handler()
  monkeypatch.setattr(handler, "filters", list(handler.filters))
  monkeypatch.setattr(tqdm_utils, "_active", tqdm_utils._active)
  for name in process_settings._TFDS_PRINTS:
    monkeypatch.setattr(tfds.core.DatasetBuilder, name, getattr(tfds.core.DatasetBuilder, name))

  builder_file = os.path.join(
      os.sep, "site-packages", "tensorflow_datasets", "core", "dataset_builder.py"
  )

  def record(msg, level=logging.WARNING, path=builder_file):
    return logging.LogRecord("absl", level, path, 1, msg, None, None)

  custom = record("Using custom data configuration: BuilderConfig(name='f81fa1e24d6dd8b5')")
  other = record("Not enough disk space")
  process_settings.configure_logging(debug=False, verbosity_given=False)
  assert not handler.filter(custom)
  assert handler.filter(other)
  assert handler.filter(record("Using custom data configuration", path="/x/our_tool.py"))
  assert not tqdm_utils._active  # tfds's bars off
  process_settings.configure_logging(debug=False, verbosity_given=True)
  assert handler.filter(custom) and handler.filter(other)
  assert tqdm_utils._active


def test_tfds_printed_lines_become_its_info_records(monkeypatch, capsys, caplog):
  """tfds's "Dataset ... downloaded and prepared to ..." (a print on stdout)
  becomes an absl INFO record of whoever called the method (tfds's own
  ``download_and_prepare``: a third-party INFO record, shown only with
  ``--verbosity``), with nothing printed."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.utils import tqdm_utils

  monkeypatch.setattr(tqdm_utils, "_active", tqdm_utils._active)
  builder = tfds.core.DatasetBuilder
  for name in process_settings._TFDS_PRINTS:
    monkeypatch.setattr(builder, name, getattr(builder, name))
  monkeypatch.setenv("FORCE_COLOR", "1")  # termcolor's bold escape codes, removed
  caplog.set_level("INFO")
  process_settings._quiet_preparation(verbose=False)
  process_settings._quiet_preparation(verbose=False)  # idempotent: wrapped once

  class Prepared:
    name = "txl_text"
    data_dir = "/data/txl_text/1.0.0"

  builder._log_download_done(Prepared())
  assert capsys.readouterr().out == ""
  [rec] = [r for r in caplog.records if "downloaded and prepared" in r.getMessage()]
  assert rec.getMessage() == (
      "Dataset txl_text downloaded and prepared to /data/txl_text/1.0.0. "
      "Subsequent calls will reuse this data."
  )
  assert rec.levelno == logging.INFO and rec.pathname == __file__  # the caller's record


class _Stderr(io.StringIO):
  """A stderr that says it is (or is not) a terminal."""

  def __init__(self, terminal: bool):
    super().__init__()
    self._terminal = terminal

  def isatty(self) -> bool:
    return self._terminal


@pytest.mark.parametrize("terminal", [True, False])
def test_training_progress_bar_only_on_a_terminal(monkeypatch, terminal):
  """Issue 37: the training progress bar was written into logs that are not
  terminals, beside the step lines; now it is drawn only where stderr is a
  terminal, and the step lines (``bar.write``, on stdout) come either way."""
  err, out = _Stderr(terminal), io.StringIO()
  monkeypatch.setattr(sys, "stderr", err)
  monkeypatch.setattr(sys, "stdout", out)
  bar = metrics.progress_bar(total=5, initial=1)
  bar.update(2)
  bar.set_postfix(loss="1.234")
  bar.write("step 3: loss=1.234")
  bar.close()
  assert ("3/5" in err.getvalue() and "loss=1.234" in err.getvalue()) == terminal, err.getvalue()
  if not terminal:
    assert err.getvalue() == ""
  assert out.getvalue() == "step 3: loss=1.234\n"


def test_every_page_that_says_to_run_tensorboard_names_its_extra():
  """Issue 37: the README told users to run tensorboard, but no extra
  installed it (training writes the event files with tensorboardX)."""
  import configparser

  cfg = configparser.ConfigParser()
  cfg.read(REPO / "setup.cfg")
  extra = cfg["options.extras_require"]["tensorboard"].split()
  assert any(req.startswith("tensorboard>=") for req in extra), extra
  pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
  telling = [p for p in pages if "tensorboard --logdir" in p.read_text()]
  assert REPO / "README.md" in telling
  for page in telling:
    assert '".[tensorboard]"' in page.read_text(), page
