"""The paper's released models: download, verify, cache and convert (``--pretrained=NAME``).

    python -m transformer_xl.convert --pretrained=wt103 --workdir=/tmp/wt103
    python -m transformer_xl.main --workdir=/tmp/wt103 --mode=eval

    from transformer_xl.inference.language_model import LanguageModel
    lm = LanguageModel.from_pretrained("wt103")

``RELEASES`` holds the four models of the reference implementation
(Dai et al. 2019; the TF checkpoints that its ``tf/sota/download.sh`` fetches
from ``http://curtis.ml.cmu.edu/datasets/pretrained_xl``), with the sizes and
evaluation settings of its ``tf/sota/<name>.sh`` and the paper's result.

What happens, in order:

1. **Files.**  Each file of the release is taken from ``--manual_dir`` (a
   directory laid out like the release: ``data/cache.pkl``,
   ``data/corpus-info.json``, ``model/model.ckpt-N.index``,
   ``model/model.ckpt-N.data-00000-of-00001``; the reference's
   ``pretrained_xl/tf_<name>`` directory is one) or from the cache
   (``$TRANSFORMER_XL_CACHE``, default ``~/.cache/transformer_xl``, under
   ``downloads/<name>/``), downloading what is missing
   (``transformer_xl.data.download.fetch``): a progress bar on stderr, a
   partial download (``<file>.part``) resumed with an HTTP range request,
   a download cut short (fewer bytes than the server announced) resumed,
   three tries.
2. **Integrity.**  The release publishes no checksum, so the SHA-256 and
   size of each file are recorded at its first download
   (``downloads/<name>/checksums.json``, ``transformer_xl.convert.download``), printed for the user to compare
   with a copy they trust, and verified on every later use; a file that no
   longer matches is fetched again (from ``--manual_dir``: refused).  The
   TF checkpoint must also read cleanly: every tensor is read once, which
   checks TF's own per-tensor CRC32C; a damaged download is fetched again
   once.
3. **Vocabulary.**  The release's only vocabulary is a pickled reference
   ``Corpus`` (``data/cache.pkl``); it is read with
   ``transformer_xl.convert.safe_pickle``'s restricted unpickler (no code
   in it can run), checked against ``corpus-info.json`` (size, cutoffs),
   and mapped onto our corpus's ids by symbol
   (``transformer_xl.convert.vocab.map_vocab``).
4. **Conversion** (``transformer_xl.convert.convert_to_workdir``) into
   the workdir with the release's evaluation settings (``eval.tgt_len``,
   ``mem_len``, ``clamp_len``, ``same_length``, ``global_batch``), so that
   ``--mode=eval`` reproduces the reference's ``tf/sota/<name>.sh``
   evaluation.  ``pretrained_workdir`` converts into
   ``<cache>/workdirs/<name>`` once and reuses it.

Errors a user can cause (no network and no ``--manual_dir``, a missing
file, a file that fails its checksum) raise ``ConvertError`` with one
line naming each file, its URL and its recorded checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_xl.convert.download import Records, matches
from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.data.download import CHUNK, DownloadError, fetch, sha256_of
from transformer_xl.util import files
from transformer_xl.util.report import log

RELEASE_URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"
CACHE_ENV = "TRANSFORMER_XL_CACHE"
VOCAB_FILE = "vocab.txt"  # derived from data/cache.pkl, in the download directory


@dataclasses.dataclass(frozen=True)
class Release:
  """A released model of the reference implementation.

  Attributes:
    name: our name (``--pretrained=NAME``).
    url: the directory of its files (``<RELEASE_URL>/tf_<name>``; enwik8's
      is ``tf_enwiki8`` there).
    checkpoint: the TF checkpoint prefix under ``url``.
    dataset: our corpus (``data.CORPUS_NAMES``) its vocabulary maps onto.
    hparams: the reference constructor's arguments and TF flags
      (``transformer_xl.convert.load_hparams``): the sizes of
      ``tf/sota/<name>.sh``, the training tgt_len and mem_len of
      ``tf/scripts/<name>_large_tpu.sh`` (the converted config's training
      settings, for fine-tuning), dropout 0; without ``n_token`` and
      ``cutoffs`` (from ``corpus-info.json``).
    n_token: the vocabulary size the release must have (corpus-info.json).
    cutoffs: its adaptive-softmax cutoffs, without the reference's 0 and
      n_token.
    eval: ``tgt_len``, ``mem_len``, ``clamp_len`` (-1: none), ``same_length``
      and ``global_batch`` of ``tf/sota/<name>.sh`` (TEST_TGT_LEN,
      TEST_MEM_LEN, TEST_CLAMP_LEN, same_length, TEST_BSZ).
    paper: the paper's test result, e.g. ``(0.99, "bpc", "Table 2")``.
    params_m: the paper's parameter count in millions.
    train_global_batch: ``train.global_batch`` of the converted config (the
      rows of the saved training memory); 16 divides the data-parallel
      devices of hosts of 1 to 16 accelerators, as the config requires.
    dynamic: the dynamic-evaluation settings of Krause et al. (2019) for
      this model (``config.eval.dynamic``: rule, lr, decay, eps; their
      ``tf/sota/<name>.sh`` in benkrause/dynamiceval-transformer, with the
      release's ``eval`` lengths and one row), or None.
    dynamic_paper: their published test result with them, e.g.
      ``(16.4, "ppl", "Krause et al. 2019, Table 1")``, or None.
  """

  name: str
  url: str
  checkpoint: str
  dataset: str
  hparams: Mapping[str, Any]
  n_token: int
  cutoffs: tuple[int, ...]
  eval: Mapping[str, Any]
  paper: tuple[float, str, str]
  params_m: float
  train_global_batch: int = 16
  dynamic: Mapping[str, Any] | None = None
  dynamic_paper: tuple[float, str, str] | None = None

  @property
  def files(self) -> tuple[str, ...]:
    """The files conversion needs, relative to ``url`` (the release's ``checkpoint``
    file and ``.meta`` graph are not needed)."""
    return (
        "data/corpus-info.json",
        "data/cache.pkl",
        f"{self.checkpoint}.index",
        f"{self.checkpoint}.data-00000-of-00001",
    )


_CHAR_24L = dict(
    n_layer=24,
    d_model=1024,
    d_embed=1024,
    n_head=8,
    d_head=128,
    d_inner=3072,
    dropout=0.0,
    dropatt=0.0,
    tgt_len=768,
    mem_len=768,
)
_CHAR_EVAL = dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True, global_batch=16)

RELEASES: dict[str, Release | HubRelease] = {
    "enwik8": Release(
        name="enwik8",
        url=f"{RELEASE_URL}/tf_enwiki8",
        checkpoint="model/model.ckpt-0",
        dataset="enwik8",
        hparams=_CHAR_24L,
        n_token=204,
        cutoffs=(),
        eval=_CHAR_EVAL,
        paper=(0.99, "bpc", "Table 2"),
        params_m=277,
        dynamic=dict(rule="rms", lr=1.2e-5, decay=24.0, eps=1e-4),
        dynamic_paper=(0.940, "bpc", "Krause et al. 2019"),
    ),
    "text8": Release(
        name="text8",
        url=f"{RELEASE_URL}/tf_text8",
        checkpoint="model/model.ckpt-0",
        dataset="text8",
        hparams=_CHAR_24L,
        n_token=27,
        cutoffs=(),
        eval=_CHAR_EVAL,
        paper=(1.08, "bpc", "Table 3"),
        params_m=277,
        dynamic=dict(rule="rms", lr=1.5e-5, decay=24.0, eps=1e-4),
        dynamic_paper=(1.038, "bpc", "Krause et al. 2019"),
    ),
    "wt103": Release(
        name="wt103",
        url=f"{RELEASE_URL}/tf_wt103",
        checkpoint="model/model.ckpt-0",
        dataset="wikitext103",
        hparams=dict(
            n_layer=18,
            d_model=1024,
            d_embed=1024,
            n_head=16,
            d_head=64,
            d_inner=4096,
            div_val=4,
            untie_r=True,
            proj_share_all_but_first=True,
            dropout=0.0,
            dropatt=0.0,
            tgt_len=384,
            mem_len=384,
        ),
        n_token=267735,
        cutoffs=(20000, 40000, 200000),
        eval=dict(tgt_len=128, mem_len=1600, clamp_len=1000, same_length=True, global_batch=16),
        paper=(18.3, "ppl", "Table 1"),
        params_m=257,
        dynamic=dict(rule="rms", lr=2e-6, decay=0.0, eps=1e-5),
        dynamic_paper=(16.4, "ppl", "Krause et al. 2019"),
    ),
    "lm1b": Release(
        name="lm1b",
        url=f"{RELEASE_URL}/tf_lm1b",
        checkpoint="model/model.ckpt-1191000",
        dataset="lm1b",
        hparams=dict(
            n_layer=24,
            d_model=1280,
            d_embed=1280,
            n_head=16,
            d_head=80,
            d_inner=8192,
            div_val=4,
            untie_r=True,
            proj_share_all_but_first=False,
            proj_same_dim=False,
            dropout=0.0,
            dropatt=0.0,
            tgt_len=32,
            mem_len=32,
        ),
        n_token=793471,
        cutoffs=(60000, 100000, 640000),
        eval=dict(tgt_len=32, mem_len=128, clamp_len=-1, same_length=True, global_batch=16),
        paper=(21.8, "ppl", "Table 4"),
        params_m=800,
    ),
}


@dataclasses.dataclass(frozen=True)
class HubRelease:
  """A released model on the HuggingFace Hub, read with ``huggingface_hub``
  (``pip install -e ".[hub]"``): HuggingFace's ``TransfoXLLMHeadModel`` state
  dict (``pytorch_model.bin``, read with ``torch.load(weights_only=True)``),
  its ``config.json`` and its tokenizer's ``vocab.pkl`` (restricted
  unpickling).  ``transfo-xl/transfo-xl-wt103`` holds the reference's wt103
  release, converted by HuggingFace.

  Attributes:
    name: our name, the Hub repository.
    repo_id: the Hub repository.
    like: the reference release (a key of ``RELEASES``) whose corpus,
      evaluation settings and paper result apply.
    revision: the Hub revision.
    endpoint: the Hub's address (None: ``huggingface_hub``'s default,
      ``$HF_ENDPOINT`` or https://huggingface.co).
  """

  name: str
  repo_id: str
  like: str
  revision: str = "main"
  endpoint: str | None = None
  files: tuple[str, ...] = ("config.json", "vocab.pkl", "pytorch_model.bin")


RELEASES["transfo-xl/transfo-xl-wt103"] = HubRelease(
    name="transfo-xl/transfo-xl-wt103", repo_id="transfo-xl/transfo-xl-wt103", like="wt103"
)


def dynamic_settings(name: str) -> dict[str, Any]:
  """The ``config.eval.dynamic`` settings of Krause et al. (2019) for a release
  (a HubRelease: those of the release it is ``like``), with one row.

  Raises:
    ConvertError: an unknown name, or a release they did not evaluate (lm1b).
  """
  rel = release(name)
  like = RELEASES[rel.like] if isinstance(rel, HubRelease) else rel
  assert isinstance(like, Release)
  if like.dynamic is None:
    with_it = sorted(k for k, r in RELEASES.items() if isinstance(r, Release) and r.dynamic)
    raise ConvertError(
        f"{name!r} has no published dynamic-evaluation settings (Krause et al. 2019 evaluated "
        f"{', '.join(with_it)}); set eval.dynamic yourself, tuned on the valid split."
    )
  return {**like.dynamic, "global_batch": 1}


def release(name: str) -> Release | HubRelease:
  """The release called ``name``; ConvertError naming the choices otherwise."""
  if name not in RELEASES:
    raise ConvertError(f"--pretrained={name!r}: choose one of {sorted(RELEASES)}.")
  return RELEASES[name]


def cache_root(cache_dir: str | None = None) -> Path:
  """``cache_dir``, else ``$TRANSFORMER_XL_CACHE``, else ``~/.cache/transformer_xl``."""
  return Path(
      cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "transformer_xl"
  ).expanduser()


# ---------------------------------------------------------------------------
# A release's files
# ---------------------------------------------------------------------------


def release_files(
    rel: Release,
    cache_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    progress: bool = True,
    records: Records | None = None,
) -> Path:
  """The directory that holds ``rel.files``, each verified (see the module docstring).

  Args:
    rel: the release.
    cache_dir: see ``cache_root``; downloads go to ``<cache>/downloads/<name>``.
    manual_dir: a directory with the release's files (used in place, never
      downloaded into); checked against the recorded checksums.
    download: may download missing files (``False``: cached files only).
    progress: show a progress bar per download.
    records: the release's checksum records (default: read from, and new
      ones written at once to, ``<cache>/downloads/<name>/checksums.json``;
      ``convert_release`` passes deferred ones that it commits only once
      the files have passed its checks).

  Returns:
    ``manual_dir`` or the download directory.

  Raises:
    ConvertError: missing files that cannot be downloaded (every one named
      with its URL and recorded checksum), a file of ``manual_dir`` that
      differs from its record, a download that fails.
  """
  downloads = cache_root(cache_dir) / "downloads" / rel.name
  records = Records(downloads) if records is None else records
  base = Path(manual_dir).expanduser() if manual_dir else downloads
  missing = []
  for name in rel.files:
    path, url, record = base / name, f"{rel.url}/{name}", records.get(name)
    if path.exists():
      ok, sha, size = matches(path, record)
      if ok:
        if record is None:
          records.put(name, sha, size, url)
          log(f"  {path}: {size:,} bytes, sha256 {sha} (recorded in {records.path}).")
        continue
      if manual_dir:
        raise ConvertError(
            f"{path} differs from the {name} recorded at its first download "
            f"({_describe_record(record)}); replace it with the release's file "
            f"from {url}, or delete {records.path} if the record is wrong."
        )
      log(
          f"  {path} differs from its record ({_describe_record(record)}): "
          + ("fetching it again." if download else "removed (downloads are off).")
      )
      path.unlink()
    if manual_dir or not download:
      missing.append((name, url, record))
      continue
    _download_checked(url, path, name, records, progress)
  if missing:
    where = f"--manual_dir={manual_dir}" if manual_dir else f"{downloads} (downloads are off)"
    listed = "; ".join(f"{n} from {u} ({_describe_record(r)})" for n, u, r in missing)
    raise ConvertError(
        f"release {rel.name}: {len(missing)} of its files missing in {where}: {listed}. "
        "Put each at that path (relative to the directory), or allow downloads."
    )
  return base


def _download_checked(url: str, path: Path, name: str, records: Records, progress: bool) -> None:
  """Downloads one file; against its record if any (a mismatch: one fresh download more)."""
  record = records.get(name)
  for attempt in range(2):
    log(f"Downloading {url}")
    _fetch(url, path, progress)
    ok, sha, size = matches(path, record)
    if ok:
      if record is None:
        records.put(name, sha, size, url)
        log(
            f"  {name}: {size:,} bytes, sha256 {sha}.  First download: recorded in "
            f"{records.path} and verified on every later use; compare it with a copy you "
            "trust."
        )
      return
    path.unlink()
    if attempt == 0:
      log(
          f"  {name}: {size:,} bytes, sha256 {sha or '(size differs)'} is not the recorded "
          f"{_describe_record(record)}: downloading it again."
      )
  raise ConvertError(
      f"{url} does not match its record ({_describe_record(record)}) after two "
      f"downloads: the file on the server changed or the network corrupts it; "
      f"delete {records.path} only if you trust the new file."
  )


def _fetch(url: str, path: Path, progress: bool) -> None:
  """``fetch`` (resumed, retried), its failure phrased with the way out (--manual_dir).

  Raises:
    ConvertError: the file is not at ``url`` (HTTP 403, 404, 410), or no
      complete file after the tries; the message names the URL.
  """
  try:
    fetch(url, path, progress=progress)
  except DownloadError as err:
    if err.status in (403, 404, 410):
      raise ConvertError(
          f"{url}: {err.reason}; the release is not at this "
          "address (download its files by hand and pass --manual_dir)."
      ) from None
    tries = f"{err.tries} tr{'y' if err.tries == 1 else 'ies'}"
    raise ConvertError(
        f"cannot download {url} ({err.reason}, {tries}); check the network, run "
        "again to resume, or download it by hand and pass --manual_dir."
    ) from None


def _describe_record(record: dict | None) -> str:
  if record is None:
    return "no checksum recorded yet: the release publishes none"
  return f"sha256 {record['sha256']}, {record['size']:,} bytes"


def forget(rel: Release, names, cache_dir: str | None = None) -> None:
  """Deletes downloaded files of ``rel`` (and their records), so the next use fetches them."""
  downloads = cache_root(cache_dir) / "downloads" / rel.name
  records = Records(downloads)
  for name in names:
    (downloads / name).unlink(missing_ok=True)
    records.drop(name)


# ---------------------------------------------------------------------------
# Vocabulary and hyperparameters of a release
# ---------------------------------------------------------------------------


def read_corpus_info(rel: Release, base: Path) -> dict:
  """``data/corpus-info.json`` (``{"vocab_size", "cutoffs", "dataset"}``), checked
  against the release's expected vocabulary size and cutoffs.

  Raises:
    ConvertError: unreadable, or other values than the release's.
  """
  path = base / "data" / "corpus-info.json"
  try:
    info = json.loads(path.read_text())
    size, cutoffs = int(info["vocab_size"]), [int(c) for c in info["cutoffs"]]
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise ConvertError(
        f"{path} is not the release's corpus-info.json ({describe(err)}); fetch it again."
    ) from None
  inner = cutoffs[1:-1] if cutoffs else []
  if size != rel.n_token or tuple(inner) != tuple(rel.cutoffs):
    raise ConvertError(
        f"{path}: vocab_size {size} and cutoffs {cutoffs} are not release "
        f"{rel.name}'s ({rel.n_token}, {[0, *rel.cutoffs, rel.n_token] if rel.cutoffs else []}); "
        "this is another release's file."
    )
  return info


def release_vocab(rel: Release, base: Path, out: Path) -> Path:
  """Writes the release's vocabulary (``data/cache.pkl``, restricted unpickling) to
  ``out`` (one symbol per line) and returns it.

  Raises:
    ConvertError: a cache that the restricted unpickler refuses, or whose
      vocabulary does not fit ``corpus-info.json``.
  """
  from transformer_xl.convert import safe_pickle

  path = base / "data" / "cache.pkl"
  symbols, _ = safe_pickle.reference_corpus_vocab(str(path))
  return _write_vocab(symbols, path, rel.n_token, out)


def release_hparams(rel: Release) -> dict:
  """The reference constructor's arguments of ``rel`` (validated)."""
  from transformer_xl.convert.hparams import load_hparams

  return load_hparams({**rel.hparams, "n_token": rel.n_token, "cutoffs": list(rel.cutoffs)})


# ---------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------


def convert_release(
    name: str,
    workdir: str,
    *,
    cache_dir: str | None = None,
    manual_dir: str | None = None,
    download: bool = True,
    data_dir: str | None = None,
    dataset_manual_dir: str | None = None,
    verify_checksums: bool = True,
    progress: bool = True,
) -> dict:
  """``--pretrained=NAME``: a released model into ``workdir``, at its evaluation settings.

  Args:
    name: a key of ``RELEASES``.
    workdir: a new or empty directory.
    cache_dir: see ``cache_root``.
    manual_dir: the release's files already on disk (``release_files``,
      ``hub_files``).
    download: may download the release's files and the dataset's sources.
    data_dir: tfds data dir of the release's dataset (``data.data_dir``).
    dataset_manual_dir: the dataset's source files (``data.manual_dir``).
    verify_checksums: check the dataset's source files.
    progress: progress bars.

  Returns:
    ``transformer_xl.convert.convert_to_workdir``'s report, plus
    ``"release"`` (the name) and ``"files"`` (their directory).

  Raises:
    ConvertError: see ``release_files``, ``hub_files``,
      ``release_vocab``; a checkpoint that does not read cleanly twice.
    data.DataError: the dataset cannot be prepared.
  """
  from transformer_xl.convert import safe_pickle
  from transformer_xl.convert.tf import check_tf_checkpoint
  from transformer_xl.convert.workdir_io import check_new_workdir, convert_to_workdir

  rel = release(name)
  like = RELEASES[rel.like] if isinstance(rel, HubRelease) else rel
  vocab_out = cache_root(cache_dir) / "downloads" / _slug(rel.name) / VOCAB_FILE
  check_new_workdir(workdir)
  if isinstance(rel, HubRelease):
    paths = hub_files(rel, cache_dir, manual_dir, download)
    hp = hub_hparams(paths["config.json"], like)
    symbols, _ = safe_pickle.hf_vocab(str(paths["vocab.pkl"]))
    source, checkpoint, base = (
        "pytorch",
        str(paths["pytorch_model.bin"]),
        paths["config.json"].parent,
    )
    vocab = _write_vocab(symbols, paths["vocab.pkl"], hp["n_token"], vocab_out)
  else:
    hp = release_hparams(rel)
    # First-use checksums are recorded only once the files pass the checks below.
    records = Records(cache_root(cache_dir) / "downloads" / rel.name, deferred=True)
    base = release_files(rel, cache_dir, manual_dir, download, progress, records)
    source, checkpoint = "tf", str(base / rel.checkpoint)
    try:
      check_tf_checkpoint(checkpoint)
    except ConvertError as err:
      if manual_dir or not download:
        raise
      log(f"  {err}\n  Fetching the checkpoint again.")
      forget(rel, [f for f in rel.files if f.startswith(rel.checkpoint)], cache_dir)
      records = Records(cache_root(cache_dir) / "downloads" / rel.name, deferred=True)
      base = release_files(rel, cache_dir, manual_dir, download, progress, records)
      check_tf_checkpoint(checkpoint)
    read_corpus_info(rel, base)
    vocab = release_vocab(rel, base, vocab_out)
    records.commit()
  e = like.eval
  report = convert_to_workdir(
      source,
      checkpoint,
      hp,
      workdir,
      vocab=str(vocab),
      dataset=like.dataset,
      data_dir=data_dir,
      manual_dir=dataset_manual_dir,
      download=download,
      verify_checksums=verify_checksums,
      eval_tgt_len=e["tgt_len"],
      eval_mem_len=e["mem_len"],
      eval_clamp_len=max(0, int(e["clamp_len"])),
      eval_same_length=e["same_length"],
      global_batch=like.train_global_batch,
      eval_global_batch=e["global_batch"],
  )
  metric, unit_name = like.paper[0], like.paper[1]
  log(
      f"Release {rel.name}: the paper reports {metric} {unit_name} on the {like.dataset} test "
      f"set ({like.paper[2]}); evaluate with: python -m transformer_xl.main --workdir={workdir} "
      "--mode=eval"
  )
  report.update(release=rel.name, files=str(base))
  return report


def _slug(name: str) -> str:
  """A directory name for a release name (Hub names have a "/")."""
  return name.replace("/", "--")


# ---------------------------------------------------------------------------
# HuggingFace Hub releases
# ---------------------------------------------------------------------------


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
    records = Records(cache_root(cache_dir) / "downloads" / _slug(rel.name))
    base, missing, out = Path(manual_dir).expanduser(), [], {}
    for name in rel.files:
      path, url = base / name, _hub_url(rel, name)
      if not path.exists():
        missing.append(f"{name} from {url} ({_describe_record(records.get(name))})")
        continue
      ok, sha, size = matches(path, records.get(name))
      if not ok:
        raise ConvertError(
            f"{path} differs from the {name} recorded at its first use "
            f"({_describe_record(records.get(name))}); replace it with {url}."
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


def _write_vocab(symbols: list[str], source: Path, n_token: int, out: Path) -> Path:
  """Writes a released vocabulary one symbol per line (for ``--vocab``)."""
  if len(symbols) != n_token:
    raise ConvertError(
        f"{source}: the vocabulary has {len(symbols):,} symbols, the model "
        f"{n_token:,}; fetch the release's file again."
    )
  bad = [s for s in symbols if not s or s.split() != [s]]
  if bad:
    raise ConvertError(
        f"{source}: symbols with whitespace or empty ({bad[:3]}) cannot be "
        "written one per line; this is not a released vocabulary."
    )
  out.parent.mkdir(parents=True, exist_ok=True)
  files.write_text_atomic(out, "\n".join(symbols) + "\n")
  return out


def pretrained_workdir(name: str, cache_dir: str | None = None, **kwargs) -> Path:
  """The converted workdir of a release in the cache (``<cache>/workdirs/<name>``),
  converted on first use (into a temporary directory renamed when complete,
  so an interrupted conversion is never taken for a finished one).

  Args:
    name: a key of ``RELEASES``.
    cache_dir: see ``cache_root``.
    **kwargs: ``convert_release``'s other arguments.

  Raises:
    ConvertError, data.DataError: see ``convert_release``.
  """
  release(name)
  final = cache_root(cache_dir) / "workdirs" / _slug(name)
  if (final / "config.json").exists():
    return final
  tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    convert_release(name, str(tmp), cache_dir=cache_dir, **kwargs)
    tmp.replace(final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return final
