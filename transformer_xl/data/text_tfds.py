"""A tfds text dataset as documents: ``data.dataset="tfds:NAME[/CONFIG]"``.

``TfdsText`` reads a tfds dataset's text feature (``data.text_key``) from
the splits ``data.tfds_splits`` names, one document per example, as lines
with the start of each document marked, the same as one's own files
(``text_reading.document_lines``); the builder (``text_builder.py``)
tokenises them alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from transformer_xl.data.corpus import DataError
from transformer_xl.data.text_settings import (
    SPLITS,
    STORAGE_FORMAT,
    TextSettings,
    fingerprint_settings,
)


class TfdsText:
  """A tfds text dataset as documents (``data.dataset="tfds:NAME[/CONFIG]"``).

  Each example's ``text_key`` feature is one document, its lines split with
  ``str.splitlines``.  The dataset is read with ``as_data_source`` (no
  TensorFlow); if that fails because it is not prepared, tfds downloads and
  prepares it (``download_and_prepare(file_format="array_record")``).

  Raises (on construction):
    DataError: tfds does not know the name, or the dataset lacks
      ``text_key`` (the message lists its text features).
  """

  def __init__(self, s: TextSettings, data_dir=None):
    self.name, self.text_key = s.tfds_name, s.text_key
    self.splits = dict(zip(SPLITS, [x.strip() for x in s.tfds_splits.split(",")]))
    self._settings = s
    try:
      self.builder = tfds.builder(self.name, data_dir=data_dir)
    except Exception as err:  # pylint: disable=broad-except  (tfds raises several kinds)
      raise DataError(
          f"data.dataset='tfds:{self.name}': tfds cannot load it "
          f"({str(err).splitlines()[0][:200]}); see "
          "https://www.tensorflow.org/datasets/catalog for the names."
      ) from None
    features = self.builder.info.features
    if self.text_key not in features:
      texts = [k for k, v in features.items() if isinstance(v, tfds.features.Text)]
      raise DataError(
          f"data.text_key={self.text_key!r}: tfds:{self.name} has no such feature; "
          f"its text features are {texts or 'none'} (e.g. "
          f"--config.data.text_key={texts[0] if texts else 'text'})."
      )
    self._sources: dict = {}

  def source(self, split: str):
    """The tfds data source of our ``split`` (prepared first if needed)."""
    if split not in self._sources:
      tfds_split = self.splits[split]
      try:
        self._sources[split] = self.builder.as_data_source(split=tfds_split)
      except Exception:  # pylint: disable=broad-except  (not prepared, or not array_record)
        try:
          self.builder.download_and_prepare(file_format="array_record")
          self._sources[split] = self.builder.as_data_source(split=tfds_split)
        except Exception as err:  # pylint: disable=broad-except
          raise DataError(
              f"tfds:{self.name} split {tfds_split!r} cannot be read "
              f"({str(err).splitlines()[0][:200]}); check data.tfds_splits and "
              "the dataset's manual download instructions."
          ) from None
    return self._sources[split]

  def num_documents(self, split: str) -> int:
    """Examples (documents) of our ``split``."""
    return len(self.source(split))

  def fingerprint(self) -> str:
    """16 hex digits naming the prepared corpus: settings, dataset version, sizes."""
    desc = {
        "format": STORAGE_FORMAT,
        "settings": fingerprint_settings(self._settings),
        "version": str(self.builder.info.version),
        "sizes": {split: self.num_documents(split) for split in SPLITS},
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]

  def document_lines(self, split: str, progress=None) -> Iterator[tuple[str, bool]]:
    """(line, starts a document) for every line of every example, in order."""
    source = self.source(split)
    for i in range(len(source)):
      text = source[i][self.text_key]
      if isinstance(text, (bytes, np.bytes_)):
        text = bytes(text).decode("utf-8", errors="replace")
      for j, line in enumerate(str(text).splitlines() or [""]):
        yield line, j == 0
      if progress is not None:
        progress.update(1)
