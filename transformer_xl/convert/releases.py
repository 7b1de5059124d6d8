"""The paper's released models: the table (``RELEASES``) and the look-ups on it.

``RELEASES`` holds the four models of the reference implementation
(Dai et al. 2019; the TF checkpoints that its ``tf/sota/download.sh`` fetches
from ``http://curtis.ml.cmu.edu/datasets/pretrained_xl``), with the sizes and
evaluation settings of its ``tf/sota/<name>.sh`` and the paper's result, and
the Hugging Face Hub's copy of wt103 (a ``HubRelease``).  Their files are
fetched by ``download.py`` (the reference's server) and ``hub.py`` (the
Hub); ``pretrained.py`` converts them (``--pretrained=NAME``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from transformer_xl.convert.errors import ConvertError

RELEASE_URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"


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
