"""Atomic writes (util/files.py): two writers of one file, readers beside them."""

from __future__ import annotations

import json
import threading

from transformer_xl.run import workdir as wd
from transformer_xl.util import files


def test_two_writers_of_one_file_and_a_reader_never_collide(tmp_path):
  """Two evaluations of one workdir writing eval_results.json at once (each
  300 times, as threads of one process) and a reader: no writer fails, the
  reader only ever sees a whole file of one writer, no temporary file is
  left.  With one shared temporary name, writers took each other's file
  (FileNotFoundError) and readers saw torn files."""
  errors, torn, seen = [], [], set()
  done = threading.Event()

  def writer(k):
    try:
      for i in range(300):
        wd.write_eval_results(str(tmp_path), {"writer": k, "i": i, "pad": "x" * 4096})
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


def test_a_failed_write_keeps_the_target_and_leaves_no_temporary_file(tmp_path, monkeypatch):
  path = tmp_path / "config.json"
  files.write_text_atomic(path, "old")

  def no_rename(self, target):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(type(files.temporary_name(path)), "replace", no_rename)
  try:
    files.write_text_atomic(path, "new")
  except OSError:
    pass
  else:
    raise AssertionError("the write did not fail")
  assert path.read_text() == "old"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_temporary_names_are_unique_and_hidden(tmp_path):
  names = {files.temporary_name(tmp_path / "a.json").name for _ in range(1000)}
  assert len(names) == 1000 and all(n.startswith(".a.json.") and n.endswith(".tmp") for n in names)
