"""The released models on the Hugging Face Hub: their files and hparams.

A ``HubRelease`` (``releases.py``) is read with ``huggingface_hub``
(``pip install -e ".[hub]"``): ``hub_files`` downloads each file into the
cache's ``hub/`` folder and checks it against the checksum the Hub
published for it (or takes it from ``--manual_dir``, checked against the
checksums recorded at its first use, as ``download.release_files`` does);
``hub_hparams`` reads HuggingFace's ``config.json`` as the reference
constructor's arguments.  ``pretrained.convert_release`` converts them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from transformer_xl.convert.download import Records, cache_root, describe_record, matches, slug
from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.releases import HubRelease, Release
from transformer_xl.data.download import CHUNK, sha256_of
from transformer_xl.util.report import log


def hub_files(
    rel: HubRelease,
    cache_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
) -> dict[str, Path]:
  """Each of ``rel.files``, from the Hub or ``manual_dir``, checked.

  From the Hub: ``huggingface_hub.hf_hub_download`` into ``<cache>/hub``
  (its progress bars, its resume of ``.incomplete`` files), then the file
  is checked against the checksum the Hub published for it, which names
  its blob in that cache: the SHA-256 of files kept in git LFS (the
  weights, the vocabulary), the git blob SHA-1 of the others
  (``config.json``).  A file that does not match is removed and downloaded
  once more.  From ``manual_dir`` (the files by name): checked against the
  checksums recorded at their first use, as ``release_files`` does.

  Raises:
    ConvertError: huggingface_hub missing, a file that cannot be had (the
      URL named), or one that does not match its checksum twice.
  """
  if manual_dir:
    records = Records(cache_root(cache_dir) / "downloads" / slug(rel.name))
    base, missing, out = Path(manual_dir).expanduser(), [], {}
    for name in rel.files:
      path, url = base / name, _hub_url(rel, name)
      if not path.exists():
        missing.append(f"{name} from {url} ({describe_record(records.get(name))})")
        continue
      ok, sha, size = matches(path, records.get(name))
      if not ok:
        raise ConvertError(
            f"{path} differs from the {name} recorded at its first use "
            f"({describe_record(records.get(name))}); replace it with {url}."
        )
      if records.get(name) is None:
        records.put(name, sha, size, url)
      out[name] = path
    if missing:
      raise ConvertError(
          f"release {rel.name}: {len(missing)} of its files missing in "
          f"--manual_dir={manual_dir}: {'; '.join(missing)}."
      )
    return out
  try:
    import huggingface_hub
  except ImportError:
    raise ConvertError(
        f"--pretrained={rel.name} downloads with huggingface_hub: "
        "pip install -e '.[hub]' (or pass the files with --manual_dir)."
    ) from None
  out = {}
  for name in rel.files:
    for attempt in range(2):
      try:
        path = Path(
            huggingface_hub.hf_hub_download(
                rel.repo_id,
                name,
                revision=rel.revision,
                endpoint=rel.endpoint,
                cache_dir=str(cache_root(cache_dir) / "hub"),
                local_files_only=not download,
                force_download=attempt > 0,
            )
        )
      except Exception as err:  # huggingface_hub's HTTP, offline and not-found errors
        raise ConvertError(
            f"cannot get {_hub_url(rel, name)} ({describe(err)}); check the "
            "network (or allow downloads), or pass the files with "
            "--manual_dir."
        ) from None
      expected, actual = _hub_checksum(path)
      if expected == actual:
        out[name] = path
        break
      log(
          f"  {name}: {actual} is not the Hub's {expected}: "
          + ("downloading it again." if attempt == 0 else "giving up.")
      )
      Path(os.path.realpath(path)).unlink(missing_ok=True)
      path.unlink(missing_ok=True)
    else:
      raise ConvertError(
          f"{_hub_url(rel, name)} does not match the checksum the Hub published "
          "after two downloads; try again later."
      )
  return out


def _hub_url(rel: HubRelease, name: str) -> str:
  endpoint = rel.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
  return f"{endpoint}/{rel.repo_id}/resolve/{rel.revision}/{name}"


def _hub_checksum(path: Path) -> tuple[str, str]:
  """(the Hub's checksum of a downloaded file, the file's): huggingface_hub
  names each blob of its cache by the ETag the Hub sent, a SHA-256 (64 hex
  digits, LFS files) or a git blob SHA-1 (40).  ("", "") if the cache keeps
  no blob names (a copy instead of a link), which leaves nothing to check."""
  blob = Path(os.path.realpath(path))
  expected = blob.name
  if blob == path.absolute() or not all(c in "0123456789abcdef" for c in expected):
    return "", ""
  if len(expected) == 64:
    return expected, sha256_of(blob)
  h = hashlib.sha1(f"blob {blob.stat().st_size}\0".encode())
  with open(blob, "rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return expected, h.hexdigest()


def hub_hparams(config_json: Path, like: Release) -> dict:
  """The reference constructor's arguments of a HuggingFace ``TransfoXLConfig``
  (``config.json``): sizes and flags by their names there (``vocab_size``:
  n_token; ``tie_word_embeddings``: tie_weight when ``tie_weight`` is absent),
  dropout 0, the training tgt_len and mem_len of ``like``.

  Raises:
    ConvertError: an unreadable file, or values ``load_hparams`` refuses.
  """
  from transformer_xl.convert.hparams import OPTIONAL_HPARAMS, load_hparams

  try:
    c = json.loads(config_json.read_text())
    hp = {"n_token": c.get("n_token", c.get("vocab_size"))}
    for k in ("n_layer", "n_head", "d_model", "d_head", "d_inner", *OPTIONAL_HPARAMS):
      if k in c:
        hp[k] = c[k]
  except (OSError, ValueError, AttributeError) as err:
    raise ConvertError(
        f"{config_json} is not a HuggingFace TransfoXL config.json ({describe(err)})."
    ) from None
  hp.setdefault("tie_weight", c.get("tie_word_embeddings", True))
  hp.pop("adapt_inp", None)
  hp.update(
      dropout=0.0,
      dropatt=0.0,
      tgt_len=like.hparams["tgt_len"],
      mem_len=like.hparams["mem_len"],
      ext_len=0,
  )
  try:
    return load_hparams(hp)
  except ConvertError as err:
    raise ConvertError(f"{config_json}: {err}") from None
