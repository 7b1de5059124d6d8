"""Every training and evaluation command of the guides is a valid config.

Each ``python -m transformer_xl.main --config=...`` line of a bash block in
docs/guide/*.md and README.md is parsed by the command line's own flag
parsing (``user_errors.parse_flags``: the config file, its preset, every
``--config.*`` override) and checked by ``default_config.validate`` for its
mode, in a fresh process (no data read, nothing trained): a command a user
copies is not refused as written.  Placeholders (``<name>``) are left out;
shell variables (``$WT2``) stand for a directory.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from helpers import REPO, run_python

pytestmark = pytest.mark.slow  # a process per command (~5 s each)

DOCS = [REPO / "README.md", *sorted((REPO / "docs" / "guide").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)

_DRIVER = r"""
import json, sys
import numpy as np
from absl import flags
import transformer_xl.main  # defines the command line's flags
from transformer_xl import default_config
from transformer_xl.cli import user_errors

argv = json.loads(sys.argv[1])
sys.argv = argv
user_errors.parse_flags(argv)
config = flags.FLAGS.config
devices = int(np.prod([d for d in config.mesh.shape if d > 0])) or 1
try:
  default_config.validate(config, devices, training=flags.FLAGS.mode == "train")
except default_config.ConfigError as err:
  sys.exit(f"error: {err}")
"""


def guide_commands() -> list[tuple[str, list[str]]]:
  """(file:line, argv) of every main command with --config in a bash block."""
  out = []
  for path in DOCS:
    text = path.read_text()
    for block in BLOCK.finditer(text):
      line_no = text[: block.start()].count("\n") + 2
      for line in block[1].replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line.startswith("python -m transformer_xl.main") or "--config=" not in line:
          continue
        if "<" in line or "[" in line:  # a placeholder, not a command
          continue
        line = re.sub(r"\$\{?\w+\}?", "/tmp/dir", line.split(" #")[0])
        argv = ["main", *shlex.split(line)[3:]]
        out.append((f"{path.relative_to(REPO)}:{line_no}", argv))
  return out


COMMANDS = guide_commands()


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_guide_command_is_a_valid_config(where, argv):
  r = run_python(["-c", _DRIVER, json.dumps(argv)], devices=8, timeout=300)
  assert r.returncode == 0, f"{where}: {' '.join(argv[1:])}\n{r.stderr[-2000:]}"


def test_the_guides_have_commands():
  assert len(COMMANDS) >= 15 and any("armt" in " ".join(a) for _, a in COMMANDS)
