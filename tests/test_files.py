"""Atomic writes (util/files.py): two writers of one file, readers beside them."""

from __future__ import annotations

import json
import threading

import pytest

from transformer_xl.run import workdir as wd
from transformer_xl.util import files

# The two atomic writers: text (eval_results.json, configs, records) and bytes
# (score's --out .npy).
WRITERS = {
    "text": lambda path, record: wd.write_eval_results(str(path.parent), record),
    "bytes": lambda path, record: files.write_bytes_atomic(path, json.dumps(record).encode()),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_two_writers_of_one_file_and_a_reader_never_collide(tmp_path, kind):
  """Two evaluations of one workdir writing eval_results.json at once (each
  300 times, as threads of one process), or two scores writing one --out,
  and a reader: no writer fails, the reader only ever sees a whole file of
  one writer, no temporary file is left.  With one shared temporary name,
  writers took each other's file (FileNotFoundError) and readers saw torn
  files."""
  errors, torn, seen = [], [], set()
  done = threading.Event()
  write = WRITERS[kind]

  def writer(k):
    try:
      for i in range(300):
        write(tmp_path / "eval_results.json", {"writer": k, "i": i, "pad": "x" * 4096})
    except Exception as err:  # noqa: BLE001  (reported below)
      errors.append(repr(err))

  def reader():
    path = tmp_path / "eval_results.json"
    while not done.is_set():
      try:
        text = path.read_text()
      except FileNotFoundError:
        continue
      try:
        seen.add(json.loads(text)["writer"])
      except ValueError:
        torn.append(len(text))

  threads = [threading.Thread(target=writer, args=(k,)) for k in (1, 2)]
  watch = threading.Thread(target=reader)
  watch.start()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  done.set()
  watch.join()
  assert errors == [] and torn == []
  assert json.loads((tmp_path / "eval_results.json").read_text())["i"] == 299
  assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_results.json"]
  assert seen <= {1, 2}


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize("fails", ["write", "rename"])
def test_a_failed_write_keeps_the_target_and_leaves_no_temporary_file(
    tmp_path, monkeypatch, kind, fails
):
  """A full disk while the temporary file is written, or when it is renamed:
  the error propagates, the target keeps its old content, no temporary file."""
  path = tmp_path / "eval_results.json"
  WRITERS[kind](path, {"old": 1})
  old = path.read_bytes()

  def full(self, *args, **kwargs):
    raise OSError(28, "No space left on device")

  cls = type(files.temporary_name(path))
  if fails == "rename":
    monkeypatch.setattr(cls, "replace", full)
  else:
    real = {name: getattr(cls, name) for name in ("write_bytes", "write_text")}

    def writes_then_fails(name):
      def method(self, data, *args, **kwargs):
        real[name](self, data[: len(data) // 2], *args, **kwargs)  # half, then the disk is full
        raise OSError(28, "No space left on device")

      return method

    for name in real:
      monkeypatch.setattr(cls, name, writes_then_fails(name))
  with pytest.raises(OSError, match="No space left"):
    WRITERS[kind](path, {"new": 2})
  monkeypatch.undo()
  assert path.read_bytes() == old
  assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_results.json"]


def test_temporary_names_are_unique_and_hidden(tmp_path):
  names = {files.temporary_name(tmp_path / "a.json").name for _ in range(1000)}
  assert len(names) == 1000 and all(n.startswith(".a.json.") and n.endswith(".tmp") for n in names)
