"""``--out`` of score and generate on a full disk: one error line that names
the flag and the file (it was the training's message, "use another
--workdir ... checkpoints ... resumes"), an existing file unchanged, no
temporary file left.  The disk is made full by a temporary file whose
writes raise ENOSPC, as a full disk's do."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from transformer_xl.cli import eval_modes, generate_mode, modes

from helpers import tiny_text_config, write_corpus


class _FullDisk:
  """A temporary path whose writes fail with ENOSPC (its file is created)."""

  def __init__(self, path: Path):
    self.path = Path(path)

  def _enospc(self, *args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

  def write_bytes(self, data):
    self.path.write_bytes(b"")
    self._enospc()

  def open(self, *args, **kwargs):
    f = open(self.path, *args, **kwargs)  # noqa: SIM115  (closed by close)
    return type("Full", (), {"write": self._enospc, "flush": self._enospc, "close": f.close})()

  def replace(self, target):
    raise AssertionError("a failed write is never renamed over the output")

  def exists(self):
    return self.path.exists()

  def unlink(self):
    self.path.unlink()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("out_full_disk")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  return workdir


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_a_full_disk_under_out_is_one_line_naming_out(mode, trained, tmp_path, monkeypatch):
  out = tmp_path / ("nll.npy" if mode == "score" else "samples.json")
  out.write_bytes(b"an earlier result")
  module = eval_modes if mode == "score" else generate_mode
  made = []
  monkeypatch.setattr(
      module.files,
      "temporary_name",
      lambda path: made.append(_FullDisk(Path(str(path)).parent / ".tmp-full")) or made[-1],
  )
  (tmp_path / "t.txt").write_text("the cat sat\n")
  if mode == "score":
    inputs = {"text": str(tmp_path / "t.txt")}
  else:
    inputs = {"prompt": "the cat", "num_tokens": 2}
  request = modes.Request(mode=mode, workdir=str(trained), out=str(out), **inputs)
  with pytest.raises(SystemExit) as exit_info:
    modes.run(request)
  line = str(exit_info.value.code)
  assert line.startswith(f"error: --out={out}: cannot write it (no space left on the device); ")
  assert "give another --out" in line and "checkpoints" not in line, line
  assert out.read_bytes() == b"an earlier result" and made
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
