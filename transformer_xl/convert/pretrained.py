"""The paper's released models converted: ``--pretrained=NAME``.

    python -m transformer_xl.convert --pretrained=wt103 --workdir=/tmp/wt103
    python -m transformer_xl.main --workdir=/tmp/wt103 --mode=eval

    from transformer_xl.inference.language_model import LanguageModel
    lm = LanguageModel.from_pretrained("wt103")

``releases.RELEASES`` holds the four models of the reference implementation
(Dai et al. 2019; the TF checkpoints that its ``tf/sota/download.sh`` fetches
from ``http://curtis.ml.cmu.edu/datasets/pretrained_xl``), with the sizes and
evaluation settings of its ``tf/sota/<name>.sh`` and the paper's result;
``download.py`` fetches and checks their files, ``hub.py`` those of the
Hugging Face Hub's copy; this module converts them (``convert_release``).

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
   three tries (``download.release_files``).
2. **Integrity.**  The release publishes no checksum, so the SHA-256 and
   size of each file are recorded at its first download
   (``downloads/<name>/checksums.json``, ``download.Records``), printed for
   the user to compare with a copy they trust, and verified on every later
   use; a file that no longer matches is fetched again (from
   ``--manual_dir``: refused).  The TF checkpoint must also read cleanly:
   every tensor is read once, which checks TF's own per-tensor CRC32C; a
   damaged download is fetched again once.
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

import json
import os
import shutil
from pathlib import Path

from transformer_xl.convert.download import Records, cache_root, forget, release_files, slug
from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.hub import hub_files, hub_hparams
from transformer_xl.convert.releases import RELEASES, HubRelease, Release, release
from transformer_xl.util import files
from transformer_xl.util.report import log

VOCAB_FILE = "vocab.txt"  # derived from data/cache.pkl, in the download directory


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
  vocab_out = cache_root(cache_dir) / "downloads" / slug(rel.name) / VOCAB_FILE
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
  final = cache_root(cache_dir) / "workdirs" / slug(name)
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
