"""BABILong's sources: the bAbI task files and the background documents.

The bAbI tasks (Weston et al. 2015, ``tasks_1-20_v1-2/en-10k``) are read
from ``data.manual_dir`` (the task's two files, or the archive) or
downloaded (``sources.locate``); the background text is a tfds dataset's
split (PG-19: ``tfds:pg19``, feature ``book_text``) or one's own files,
each file one document, read when a document is drawn.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from transformer_xl import errors
from transformer_xl.data import sources

TASK_NAMES = {  # the bAbI file names (tasks_1-20_v1-2/en-10k/qaN_NAME_{train,test}.txt)
    "qa1": "single-supporting-fact",
    "qa2": "two-supporting-facts",
    "qa3": "three-supporting-facts",
    "qa4": "two-arg-relations",
    "qa5": "three-arg-relations",
    "qa6": "yes-no-questions",
    "qa7": "counting",
    "qa8": "lists-sets",
    "qa9": "simple-negation",
    "qa10": "indefinite-knowledge",
    "qa11": "basic-coreference",
    "qa12": "conjunction",
    "qa13": "compound-coreference",
    "qa14": "time-reasoning",
    "qa15": "basic-deduction",
    "qa16": "basic-induction",
    "qa17": "positional-reasoning",
    "qa18": "size-reasoning",
    "qa19": "path-finding",
    "qa20": "agents-motivations",
}
ARCHIVE = "tasks_1-20_v1-2.tar.gz"
URL = "http://www.thespermwhale.com/jaseweston/babi/tasks_1-20_v1-2.tar.gz"
MEMBER_DIR = "tasks_1-20_v1-2/en-10k"
PREFIX = "babilong:"


def babi_spec(task: str) -> sources.SourceSpec:
  name = f"{task}_{TASK_NAMES[task]}"
  return sources.SourceSpec(
      corpus=PREFIX + task,
      archive=ARCHIVE,
      url=URL,
      files=tuple(
          sources.SourceFile(name=f"{name}_{split}.txt", member=f"{MEMBER_DIR}/{name}_{split}.txt")
          for split in ("train", "test")
      ),
      note="BABILong reads the en-10k files of bAbI (Weston et al. 2015).",
  )


def read_babi(
    task: str,
    manual_dir: str | None,
    data_dir: str | None = None,
    download: bool = True,
    timeout_s: float | None = None,
) -> dict[str, str]:
  """The task's bAbI files' texts: {"train": ..., "test": ...}.

  Looked for in ``manual_dir`` (the files, or the archive; default
  ``<data_dir>/downloads/manual``, ``data_dir`` by default tfds's:
  ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), then downloaded (``sources.locate``).

  Raises:
    errors.DataError: missing (the message names the files, where they go
      and the archive's URL), unreadable, or not UTF-8 (naming the file).
  """
  default = os.environ.get("TFDS_DATA_DIR") or Path.home() / "tensorflow_datasets"  # tfds's
  base = Path(data_dir or default).expanduser()
  manual = Path(manual_dir).expanduser() if manual_dir else base / "downloads" / "manual"
  found = sources.locate(
      babi_spec(task),
      manual_dir=manual,
      download_dir=base / "downloads",
      download=download,
      timeout_s=timeout_s,
  )
  texts = {}
  for split, f in zip(("train", "test"), babi_spec(task).files):
    raw = found[f.name].read_bytes()
    try:
      texts[split] = raw.decode("utf-8")
    except UnicodeDecodeError as err:
      raise errors.DataError(
          f"{found[f.name]}: not UTF-8 text (byte {err.start:,} is {raw[err.start]:#04x}); "
          f"bAbI files are plain text: put the {f.name} of the en-10k archive there."
      ) from None
  return texts


class TextDocuments:
  """One's own files as documents (each file one text), read when indexed."""

  def __init__(self, patterns: str, key: str):
    files: list[str] = []
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
      files += sorted(f for f in glob.glob(str(Path(pattern).expanduser()), recursive=True))
    files = [f for f in files if Path(f).is_file()]
    if not files:
      raise errors.DataError(
          f"data.{key}={patterns!r} (BABILong's background text) matches no file: give "
          "comma-separated globs of text files."
      )
    self.files = files

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> str:
    return Path(self.files[i]).read_text(encoding="utf-8", errors="replace")


class TfdsDocuments:
  """A tfds split's texts (``data_source``), decoded when indexed."""

  def __init__(self, name: str, split: str, key: str, data_dir: str | None):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    try:
      builder = tfds.builder(name, data_dir=data_dir)
      if key not in builder.info.features:
        raise errors.DataError(
            f"data.text_key={key!r}: tfds:{name} has no such feature (its features: "
            f"{sorted(builder.info.features)}; PG-19's text is --config.data.text_key=book_text)."
        )
      try:
        self.source = builder.as_data_source(split=split)
      except Exception:  # pylint: disable=broad-except  (not prepared yet)
        builder.download_and_prepare(file_format="array_record")
        self.source = builder.as_data_source(split=split)
    except errors.DataError:
      raise
    except Exception as err:  # pylint: disable=broad-except
      raise errors.DataError(
          f"data.babilong_noise='tfds:{name}' (split {split!r}) does not load: "
          f"{str(err).splitlines()[0][:200]}"
      ) from None
    self.key = key

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i: int) -> str:
    text = self.source[i][self.key]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)
