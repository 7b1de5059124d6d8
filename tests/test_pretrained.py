"""transformer_xl.convert.pretrained: the released models from a local HTTP server.

A server on 127.0.0.1 serves a small release laid out exactly like the
reference's (``tf_wt103/data/cache.pkl``, ``data/corpus-info.json``,
``model/model.ckpt-0.{index,data-00000-of-00001}``): a TF checkpoint with the
released variable names of a small wt103-like model (div_val 4, per-layer
u and v, projections tied but the first), written from a HuggingFace model
whose NLL is the oracle; a pickled reference ``Corpus`` whose vocabulary is
our WikiText-103 sample's in another order.  The server can cut a response
short or flip a byte, and logs every request (with its Range header).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import pickle
import re
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from http_server import FileServer

from transformer_xl import convert, data
from transformer_xl.convert import download, pretrained, releases
from transformer_xl.convert.__main__ import main as convert_main
from transformer_xl.convert.hub import hub_files
from transformer_xl.data.download import sha256_of

from data_samples import _wiki_zip
from helpers import run_module
from hf_reference import BASE, hf_model, hf_segments, state_dict, tf_variables, write_tf_checkpoint

pytest.importorskip("tensorflow", reason="the releases are TF checkpoints (convert extra)")

EVAL = dict(tgt_len=8, mem_len=24, clamp_len=20, same_length=True, global_batch=1)


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# A small wt103-like release
# ---------------------------------------------------------------------------


def reference_cache_pickle(idx2sym: list[str], dataset: str, cutoffs: list[int]) -> bytes:
  """A ``cache.pkl`` as the reference's ``tf/data_utils.get_lm_corpus`` writes it:
  ``pickle.dump(corpus, protocol=2)`` of a ``data_utils.Corpus`` holding a
  ``vocabulary.Vocab`` and the encoded splits (numpy arrays)."""
  mods = {name: types.ModuleType(name) for name in ("data_utils", "vocabulary")}

  class Corpus:
    pass

  class Vocab:
    pass

  for cls, mod in ((Corpus, "data_utils"), (Vocab, "vocabulary")):
    cls.__module__, cls.__qualname__ = mod, cls.__name__
    setattr(mods[mod], cls.__name__, cls)
  saved = {k: sys.modules.get(k) for k in mods}
  sys.modules.update(mods)
  try:
    vocab = Vocab()
    vocab.__dict__.update(
        counter=collections.Counter({s: 3 for s in idx2sym}),
        special=["<eos>"],
        min_freq=0,
        max_size=None,
        lower_case=False,
        delimiter=None,
        vocab_file=None,
        idx2sym=list(idx2sym),
        sym2idx=collections.OrderedDict((s, i) for i, s in enumerate(idx2sym)),
    )
    corpus = Corpus()
    ids = np.arange(50, dtype=np.int64) % len(idx2sym)
    corpus.__dict__.update(
        dataset=dataset,
        vocab=vocab,
        train=ids,
        valid=ids[:20],
        test=ids[:30],
        cutoffs=[0, *cutoffs, len(idx2sym)],
    )
    return pickle.dumps(corpus, protocol=2)
  finally:
    for k, v in saved.items():
      if v is None:
        sys.modules.pop(k, None)
      else:
        sys.modules[k] = v


@dataclasses.dataclass
class SmallRelease:
  release: releases.Release
  files: dict[str, bytes]  # path under the release's url -> bytes
  model: object  # the HF model with the release's tensors
  hp: dict
  ref_vocab: list[str]
  manual: Path  # our WikiText-103 sample (data.manual_dir)
  data_dir: Path


@pytest.fixture(scope="module")
def small_release(tmp_path_factory) -> SmallRelease:
  tmp = tmp_path_factory.mktemp("release")
  manual, data_dir = tmp / "wiki", tmp / "tfds"
  _wiki_zip(manual, "wikitext-103")
  corpus = data.load_corpus(
      "wikitext103",
      data_dir=str(data_dir),
      manual_dir=str(manual),
      download=False,
      verify_checksums=False,
  )
  ours = list(corpus.vocab)
  cutoffs = [8, 16]
  # The release's ids: ours shuffled within each adaptive-softmax cluster.
  rng = np.random.default_rng(7)
  bounds = [0, *cutoffs, len(ours)]
  ref_vocab = []
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    ref_vocab += [ours[lo + i] for i in rng.permutation(hi - lo)]
  sizes = dict(
      BASE,
      n_layer=2,
      d_embed=32,
      div_val=4,
      untie_r=True,
      proj_share_all_but_first=True,
      tgt_len=EVAL["tgt_len"],
      mem_len=EVAL["mem_len"],
      clamp_len=EVAL["clamp_len"],
      same_length=True,
  )
  sizes.pop("n_token")
  hp = convert.load_hparams({**sizes, "n_token": len(ref_vocab), "cutoffs": cutoffs})
  model = hf_model(hp, seed=31)
  prefix = write_tf_checkpoint(tf_variables(state_dict(model), hp), tmp / "tf")
  files = {
      "data/cache.pkl": reference_cache_pickle(ref_vocab, "wt103", cutoffs),
      "data/corpus-info.json": json.dumps(
          {"vocab_size": len(ref_vocab), "cutoffs": bounds, "dataset": "wt103"}
      ).encode(),
      "model/model.ckpt-0.index": Path(prefix + ".index").read_bytes(),
      "model/model.ckpt-0.data-00000-of-00001": Path(prefix + ".data-00000-of-00001").read_bytes(),
  }
  rel = dataclasses.replace(
      releases.RELEASES["wt103"],
      hparams=sizes,
      n_token=len(ref_vocab),
      cutoffs=tuple(cutoffs),
      eval=EVAL,
      train_global_batch=8,
  )
  return SmallRelease(rel, files, model, hp, ref_vocab, manual, data_dir)


@pytest.fixture
def server(small_release, monkeypatch):
  srv = FileServer()
  for name, body in small_release.files.items():
    srv.files[f"/tf_wt103/{name}"] = body
  monkeypatch.setitem(
      releases.RELEASES,
      "wt103",
      dataclasses.replace(small_release.release, url=f"{srv.url}/tf_wt103"),
  )
  yield srv
  srv.close()


def cli(*args: str) -> None:
  convert_main(["convert", *args])


def data_flags(r: SmallRelease) -> list[str]:
  return [
      f"--data_dir={r.data_dir}",
      f"--dataset_manual_dir={r.manual}",
      "--verify_checksums=false",
  ]


def hf_valid_nll(r: SmallRelease) -> np.ndarray:
  """HF's per-token NLL of our valid stream in the release's ids (the oracle)."""
  corpus = data.load_corpus(
      "wikitext103",
      data_dir=str(r.data_dir),
      manual_dir=str(r.manual),
      download=False,
      verify_checksums=False,
  )
  valid = corpus.splits["valid"]
  stream = np.concatenate([[corpus.boundary_id], valid.read(0, valid.num_tokens)])
  ref_id = {s: i for i, s in enumerate(r.ref_vocab)}
  ref_stream = np.asarray([ref_id[corpus.vocab[t]] for t in stream])[None, :]
  nll, _ = hf_segments(r.model, r.hp, ref_stream, EVAL["tgt_len"])
  return nll


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_pretrained_wt103_downloads_converts_and_evaluates_at_the_release_settings(
    small_release, server, tmp_path, capsys
):
  cache, wd = tmp_path / "cache", tmp_path / "wd"
  cli("--pretrained=wt103", f"--workdir={wd}", f"--cache_dir={cache}", *data_flags(small_release))
  out = capsys.readouterr().out
  records = json.loads((cache / "downloads/wt103/checksums.json").read_text())["files"]
  for name, body in small_release.files.items():
    assert server.gets(name) == [None]  # one plain download each
    assert (cache / "downloads/wt103" / name).read_bytes() == body
    assert records[name]["size"] == len(body)
    assert records[name]["sha256"] in out  # printed for the user to compare
  config = json.loads((wd / "config.json").read_text())
  assert {k: config["eval"][k] for k in EVAL} == EVAL
  assert config["data"]["dataset"] == "wikitext103"
  r = run_module("transformer_xl.main", f"--workdir={wd}", "--mode=eval")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  results = json.loads((wd / "eval_results.json").read_text())
  ref = hf_valid_nll(small_release)
  assert results["valid"]["tokens"] == ref.size
  assert results["valid"]["loss_nats"] == pytest.approx(float(ref.mean()), rel=1e-5)
  # A second conversion uses the cache: no request, the same files verified.
  n = len(server.requests)
  cli(
      "--pretrained=wt103",
      f"--workdir={tmp_path / 'wd2'}",
      f"--cache_dir={cache}",
      *data_flags(small_release),
  )
  assert len(server.requests) == n


def test_manual_dir_offline_and_its_missing_files_named(small_release, server, tmp_path):
  manual = tmp_path / "tf_wt103"
  for name, body in small_release.files.items():
    (manual / name).parent.mkdir(parents=True, exist_ok=True)
    (manual / name).write_bytes(body)
  base = download.release_files(
      releases.release("wt103"), str(tmp_path / "cache"), manual_dir=str(manual)
  )
  assert base == manual and server.requests == []
  # Offline end to end: the conversion reads the manual dir, never the network.
  wd = tmp_path / "wd_offline"
  cli(
      "--pretrained=wt103",
      f"--workdir={wd}",
      f"--cache_dir={tmp_path / 'cache'}",
      f"--manual_dir={manual}",
      "--download=false",
      *data_flags(small_release),
  )
  config = json.loads((wd / "config.json").read_text())
  assert {k: config["eval"][k] for k in EVAL} == EVAL and server.requests == []
  (manual / "data/cache.pkl").unlink()
  (manual / "model/model.ckpt-0.index").unlink()
  with pytest.raises(SystemExit) as exc:
    cli(
        "--pretrained=wt103",
        f"--workdir={tmp_path / 'wd'}",
        f"--cache_dir={tmp_path / 'cache'}",
        f"--manual_dir={manual}",
        *data_flags(small_release),
    )
  msg = str(exc.value)
  assert msg.startswith("error: release wt103: 2 of its files missing") and "\n" not in msg
  for name in ("data/cache.pkl", "model/model.ckpt-0.index"):
    sha = json.loads((tmp_path / "cache/downloads/wt103/checksums.json").read_text())["files"][
        name
    ]["sha256"]
    assert f"{name} from {server.url}/tf_wt103/{name} (sha256 {sha}" in msg
  assert server.requests == []
  # A file of the manual dir that differs from its record is refused.
  (manual / "data/cache.pkl").write_bytes(small_release.files["data/cache.pkl"] + b" ")
  with pytest.raises(convert.ConvertError, match="differs from the data/cache.pkl recorded"):
    download.release_files(
        releases.release("wt103"), str(tmp_path / "cache"), manual_dir=str(manual)
    )


def test_garbage_release_files_are_not_recorded_as_the_release(small_release, server, tmp_path):
  """A manual dir whose files fail the conversion's checks (a checkpoint
  that does not read, a corpus-info.json that is not one) records no
  checksum: a later correct copy is used, not refused as "differs from the
  recorded"."""
  manual, cache = tmp_path / "tf_wt103", tmp_path / "cache"
  for name, body in small_release.files.items():
    (manual / name).parent.mkdir(parents=True, exist_ok=True)
    (manual / name).write_bytes(body)
  ckpt = "model/model.ckpt-0.data-00000-of-00001"
  (manual / ckpt).write_bytes(b"not a checkpoint" * 64)
  (manual / "data/corpus-info.json").write_text("{")
  args = [f"--cache_dir={cache}", f"--manual_dir={manual}", "--download=false"]
  with pytest.raises(SystemExit):
    cli("--pretrained=wt103", f"--workdir={tmp_path / 'wd1'}", *args, *data_flags(small_release))
  records = cache / "downloads/wt103/checksums.json"
  assert not records.exists() or not json.loads(records.read_text())["files"]
  for name in (ckpt, "data/corpus-info.json"):
    (manual / name).write_bytes(small_release.files[name])
  cli("--pretrained=wt103", f"--workdir={tmp_path / 'wd2'}", *args, *data_flags(small_release))
  recorded = json.loads(records.read_text())["files"]
  assert sorted(recorded) == sorted(small_release.files)
  for name, body in small_release.files.items():
    assert recorded[name]["sha256"] == hashlib.sha256(body).hexdigest()
  assert server.requests == []


def test_a_download_cut_short_is_resumed_with_a_range_request(small_release, server, tmp_path):
  name = "model/model.ckpt-0.data-00000-of-00001"
  body = small_release.files[name]
  server.faults[f"/tf_wt103/{name}"] = ["truncate"]
  base = download.release_files(releases.release("wt103"), str(tmp_path / "c"), progress=False)
  assert (base / name).read_bytes() == body
  assert server.gets(name) == [None, f"bytes={len(body) // 2}-"]


def test_a_partial_file_of_an_interrupted_run_is_resumed(small_release, server, tmp_path):
  name = "data/cache.pkl"
  body = small_release.files[name]
  part = tmp_path / "c/downloads/wt103/data/cache.pkl.part"
  server.faults[f"/tf_wt103/{name}"] = ["truncate", 503, 503]
  with pytest.raises(convert.ConvertError, match="cannot download"):
    download.release_files(releases.release("wt103"), str(tmp_path / "c"), progress=False)
  assert part.read_bytes() == body[: len(body) // 2]
  base = download.release_files(releases.release("wt103"), str(tmp_path / "c"), progress=False)
  assert (base / name).read_bytes() == body and not part.exists()
  assert server.gets(name)[3:] == [f"bytes={len(body) // 2}-"]
  # A stale .part of other content (no record of what it is a prefix of) is not resumed.
  (base / name).unlink()
  part.write_bytes(b"x" * 100)
  base = download.release_files(releases.release("wt103"), str(tmp_path / "c"), progress=False)
  assert (base / name).read_bytes() == body and server.gets(name)[4:] == [None]


def test_a_cached_file_that_changed_is_fetched_again(small_release, server, tmp_path):
  rel, cache = releases.release("wt103"), str(tmp_path / "c")
  base = download.release_files(rel, cache, progress=False)
  name = "model/model.ckpt-0.data-00000-of-00001"
  damaged = bytearray((base / name).read_bytes())
  damaged[len(damaged) // 3] ^= 1  # one low bit
  (base / name).write_bytes(bytes(damaged))
  download.release_files(rel, cache, progress=False)
  assert (base / name).read_bytes() == small_release.files[name]
  assert server.gets(name) == [None, None]
  # Offline, the same damage is an error naming the file, not a silent use.
  (base / name).write_bytes(bytes(damaged))
  with pytest.raises(convert.ConvertError, match="of its files missing"):
    download.release_files(rel, cache, download=False)


@pytest.mark.slow
def test_a_corrupted_first_download_is_caught_by_the_checkpoint_crc_and_fetched_again(
    small_release, server, tmp_path
):
  name = "model/model.ckpt-0.data-00000-of-00001"
  server.faults[f"/tf_wt103/{name}"] = ["corrupt"]
  report = pretrained.convert_release(
      "wt103",
      str(tmp_path / "wd"),
      cache_dir=str(tmp_path / "c"),
      progress=False,
      data_dir=str(small_release.data_dir),
      dataset_manual_dir=str(small_release.manual),
      verify_checksums=False,
  )
  assert server.gets(name) == [None, None]
  downloaded = Path(report["files"]) / name
  assert downloaded.read_bytes() == small_release.files[name]
  record = json.loads((tmp_path / "c/downloads/wt103/checksums.json").read_text())["files"][name]
  assert record["sha256"] == sha256_of(downloaded)


def test_a_malicious_vocabulary_cache_is_refused_and_never_run(small_release, server, tmp_path):
  marker = tmp_path / "pwned"

  class Evil:

    def __reduce__(self):
      import os

      return os.system, (f"touch {marker}",)

  server.files["/tf_wt103/data/cache.pkl"] = pickle.dumps({"vocab": Evil()}, protocol=2)
  with pytest.raises(SystemExit) as exc:
    cli(
        "--pretrained=wt103",
        f"--workdir={tmp_path / 'wd'}",
        f"--cache_dir={tmp_path / 'c'}",
        *data_flags(small_release),
    )
  assert str(exc.value).startswith("error: ") and "system" in str(exc.value)
  assert not marker.exists() and not (tmp_path / "wd" / "config.json").exists()


def test_unknown_release_and_unreachable_server_are_one_line_errors(tmp_path, monkeypatch):
  with pytest.raises(SystemExit) as exc:
    cli("--pretrained=wt104", f"--workdir={tmp_path / 'wd'}")
  assert str(exc.value) == (
      "error: flag --pretrained=wt104: value should be one of "
      "<enwik8|lm1b|text8|transfo-xl/transfo-xl-wt103|wt103>"
  )
  with pytest.raises(convert.ConvertError, match=r"choose one of \['enwik8', 'lm1b'"):
    pretrained.convert_release("wt104", str(tmp_path / "wd"))
  # A port nothing listens on: three tries, then the URL and the way out.
  monkeypatch.setitem(
      releases.RELEASES,
      "text8",
      dataclasses.replace(releases.RELEASES["text8"], url="http://127.0.0.1:9/tf_text8"),
  )
  with pytest.raises(SystemExit) as exc:
    cli("--pretrained=text8", f"--workdir={tmp_path / 'wd'}", f"--cache_dir={tmp_path / 'c'}")
  msg = str(exc.value)
  assert (
      msg.startswith("error: cannot download http://127.0.0.1:9/tf_text8/data/corpus-info.json")
      and "--manual_dir" in msg
      and "\n" not in msg
  )


@pytest.mark.slow
def test_from_pretrained_scores_and_generates_in_three_lines(small_release, server, tmp_path):
  from transformer_xl import LanguageModel

  lm = LanguageModel.from_pretrained(
      "wt103",
      cache_dir=str(tmp_path / "c"),
      data_dir=str(small_release.data_dir),
      dataset_manual_dir=str(small_release.manual),
      verify_checksums=False,
  )
  score = lm.score_text("The game is carried over .\n")
  out = lm.generate("The game", num_tokens=5, seed=0)
  assert score.nll.shape == (7,) and np.all(np.isfinite(score.nll))
  assert out.tokens.shape == (1, 5) and out.texts[0]
  n = len(server.requests)  # the second call reuses the converted workdir in the cache
  again = LanguageModel.from_pretrained(
      "wt103",
      cache_dir=str(tmp_path / "c"),
      data_dir=str(small_release.data_dir),
      dataset_manual_dir=str(small_release.manual),
      verify_checksums=False,
  )
  assert len(server.requests) == n
  np.testing.assert_array_equal(again.score_text("The game is carried over .\n").nll, score.nll)


# ---------------------------------------------------------------------------
# HuggingFace's transfo-xl/transfo-xl-wt103 layout, from a Hub on 127.0.0.1
# ---------------------------------------------------------------------------

HUB = "/transfo-xl/transfo-xl-wt103/resolve/main"


@pytest.fixture
def hub(small_release, server, hf_tokenization, tmp_path, monkeypatch):
  """The server also answers as the Hub for the small release in HuggingFace's
  layout: ``config.json`` (a TransfoXLConfig), ``pytorch_model.bin``
  (``torch.save`` of the state dict), ``vocab.pkl`` (the tokenizer's
  ``save_vocabulary``); ETags as the Hub sends them (git blob SHA-1 for
  config.json, SHA-256 for the LFS files)."""
  import torch

  r = small_release
  (tmp_path / "vocab.txt").write_text("\n".join(r.ref_vocab) + "\n", encoding="utf-8")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tok = hf_tokenization.TransfoXLTokenizer(vocab_file=str(tmp_path / "vocab.txt"))
    (vocab_pkl,) = tok.save_vocabulary(str(tmp_path))
  torch.save(r.model.state_dict(), tmp_path / "pytorch_model.bin")
  files = {
      "config.json": r.model.config.to_json_string().encode(),
      "vocab.pkl": Path(vocab_pkl).read_bytes(),
      "pytorch_model.bin": (tmp_path / "pytorch_model.bin").read_bytes(),
  }
  for name, body in files.items():
    server.files[f"{HUB}/{name}"] = body
    server.etags[f"{HUB}/{name}"] = (
        hashlib.sha1(f"blob {len(body)}\0".encode() + body).hexdigest()
        if name == "config.json"
        else hashlib.sha256(body).hexdigest()
    )
  monkeypatch.setitem(
      releases.RELEASES,
      "transfo-xl/transfo-xl-wt103",
      dataclasses.replace(releases.RELEASES["transfo-xl/transfo-xl-wt103"], endpoint=server.url),
  )
  return files


@pytest.mark.slow
def test_the_hub_release_converts_checks_its_checksums_and_evaluates(
    small_release, server, hub, tmp_path
):
  server.faults[f"{HUB}/pytorch_model.bin"] = ["corrupt"]
  wd = tmp_path / "wd"
  cli(
      "--pretrained=transfo-xl/transfo-xl-wt103",
      f"--workdir={wd}",
      f"--cache_dir={tmp_path / 'c'}",
      *data_flags(small_release),
  )
  # The corrupted weights failed the Hub's SHA-256 and were downloaded again.
  assert server.gets("pytorch_model.bin") == [None, None]
  assert server.gets("vocab.pkl") == [None] and server.gets("config.json") == [None]
  config = json.loads((wd / "config.json").read_text())
  assert {k: config["eval"][k] for k in EVAL} == EVAL
  r = run_module("transformer_xl.main", f"--workdir={wd}", "--mode=eval")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  results = json.loads((wd / "eval_results.json").read_text())
  ref = hf_valid_nll(small_release)
  assert results["valid"]["loss_nats"] == pytest.approx(float(ref.mean()), rel=1e-5)


def test_the_hub_release_offline_from_manual_dir(small_release, server, hub, tmp_path):
  manual = tmp_path / "hf"
  manual.mkdir()
  for name, body in hub.items():
    (manual / name).write_bytes(body)
  rel = releases.release("transfo-xl/transfo-xl-wt103")
  paths = hub_files(rel, str(tmp_path / "c"), manual_dir=str(manual))
  assert {n: p.read_bytes() for n, p in paths.items()} == hub and server.requests == []
  (manual / "vocab.pkl").unlink()
  with pytest.raises(
      convert.ConvertError,
      match=r"1 of its files missing .*vocab.pkl from " + re.escape(f"{server.url}{HUB}/vocab.pkl"),
  ):
    hub_files(rel, str(tmp_path / "c"), manual_dir=str(manual))
