"""transformer_xl.convert: round trips, files, validation, TF checkpoints,
vocabulary mapping, and the end-to-end paths convert -> main --mode=score
and convert -> main --mode=eval, compared with HuggingFace's model.

The HuggingFace helpers (random models, segment-by-segment NLL with the
reference's empty initial memory) are in hf_reference.py, the known
HF-vs-reference differences in test_parity.py.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch  # noqa: E402  (test extra: missing is an error, not a skip)
import transformers  # noqa: E402,F401

from transformer_xl import convert

from helpers import restored, run_module, write_json, write_ptb_sample
from hf_reference import (
    BASE,
    TF_REASON,
    B,
    hf_model,
    hf_segments,
    hparams,
    our_segments,
    random_tokens,
    state_dict,
    tf_variables,
    write_tf_checkpoint,
)

# ---------------------------------------------------------------------------
# Round trips and files
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,extra",
    [
        ("adaptive_div4_tied", {}),  # shared u, v repeated per layer in HF
        ("adaptive_div1_untied", {"untie_r": True}),
        ("plain_projected", {"pre_lnorm": True}),
    ],
)
def test_round_trip_pytorch_to_ours_and_back_is_identical(case, extra):
  hp = hparams(case, **extra)
  cfg = convert.model_config_from_hparams(hp)
  sd = state_dict(hf_model(hp, seed=11))
  params = convert.params_from_state_dict(sd, cfg)  # "transformer." prefix: forward order
  back = convert.state_dict_from_params(params, cfg, layout="hf")
  assert set(back) == set(sd)
  for k in sd:
    assert back[k].dtype == sd[k].dtype and np.array_equal(back[k], sd[k]), k
  # Reference layout (no prefix, shared u, v once, reference cluster order).
  ref = convert.state_dict_from_params(params, cfg, layout="reference")
  assert not any(k.startswith("transformer.") for k in ref)
  again = convert.params_from_state_dict(ref, cfg)
  for k, v in convert.flatten_params(params).items():
    assert np.array_equal(convert.flatten_params(again)[k], v), k
  ref2 = convert.state_dict_from_params(again, cfg, layout="reference")
  assert set(ref2) == set(ref) and all(np.array_equal(ref2[k], ref[k]) for k in ref)
  if cfg.cutoffs:  # the reference order is HF's reversed
    np.testing.assert_array_equal(ref["crit.cluster_weight"], sd["crit.cluster_weight"][::-1])


def test_exported_hf_layout_loads_strictly_into_huggingface(tmp_path):
  from transformers import TransfoXLLMHeadModel

  hp = hparams("adaptive_div4_tied")
  cfg = convert.model_config_from_hparams(hp)
  source = hf_model(hp, seed=12)
  params = convert.params_from_state_dict(state_dict(source), cfg)
  path = str(tmp_path / "export.bin")
  convert.save_state_dict(convert.state_dict_from_params(params, cfg, layout="hf"), path)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fresh = TransfoXLLMHeadModel(source.config).eval()
  fresh.load_state_dict(torch.load(path, weights_only=True), strict=True)
  tokens = random_tokens(hp["n_token"], 2 * hp["tgt_len"] + 1, seed=13)
  np.testing.assert_array_equal(
      hf_segments(fresh, hp, tokens, hp["tgt_len"])[0],
      hf_segments(source, hp, tokens, hp["tgt_len"])[0],
  )


def test_state_dict_files(tmp_path):
  sd = state_dict(hf_model(hparams("plain"), seed=14))
  for name in ("sd.npz", "sd.pt"):
    convert.save_state_dict(sd, str(tmp_path / name))
    got = convert.read_state_dict(str(tmp_path / name))
    assert set(got) == set(sd) and all(np.array_equal(got[k], sd[k]) for k in sd)
  torch.save(
      {"state_dict": {k: torch.from_numpy(v) for k, v in sd.items()}}, tmp_path / "wrapped.pt"
  )
  assert set(convert.read_state_dict(str(tmp_path / "wrapped.pt"))) == set(sd)
  torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # what the reference train.py saves
  with pytest.raises(convert.ConvertError, match="state dict"):
    convert.read_state_dict(str(tmp_path / "module.pt"))
  with pytest.raises(convert.ConvertError, match="does not exist"):
    convert.read_state_dict(str(tmp_path / "missing.npz"))


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_every_attention_type_round_trips_with_the_reference_names(attn_type, tmp_path):
  """Reference names per type (MemTransformerLM): 1 has top-level r_emb
  [n_layer, max_klen, H, Dh], r_w_bias [n_layer, H, Dh], r_bias [n_layer,
  max_klen, H]; 2 and 3 have q_net / kv_net; 3 has r_emb; 0 and 2 the
  sinusoid's inv_freq buffer."""
  from transformer_xl.model import models

  hp = convert.load_hparams(
      {
          **BASE,
          "attn_type": attn_type,
          "d_model": 16,
          "n_head": 2,
          "d_head": 8,
          "tgt_len": 5,
          "mem_len": 7,
      }
  )
  cfg = convert.model_config_from_hparams(hp)
  assert cfg.attn_type == attn_type and cfg.pos_table_len == 12
  params = jax.tree_util.tree_map(
      np.asarray,
      jax.device_get(
          nn.unbox(models.init_params(models.TransformerXL(cfg), jax.random.PRNGKey(attn_type)))
      ),
  )
  sd = convert.state_dict_from_params(params, cfg, layout="reference")
  L, H, Dh, K = cfg.n_layer, 2, 8, 12
  want = {
      0: {
          "r_w_bias": (H, Dh),
          "r_r_bias": (H, Dh),
          "pos_emb.inv_freq": (8,),
          "layers.0.dec_attn.qkv_net.weight": (3 * H * Dh, 16),
          "layers.0.dec_attn.r_net.weight": (H * Dh, 16),
      },
      1: {
          "r_emb": (L, K, H, Dh),
          "r_w_bias": (L, H, Dh),
          "r_bias": (L, K, H),
          "layers.0.dec_attn.qkv_net.weight": (3 * H * Dh, 16),
      },
      2: {
          "pos_emb.inv_freq": (8,),
          "layers.0.dec_attn.q_net.weight": (H * Dh, 16),
          "layers.0.dec_attn.kv_net.weight": (2 * H * Dh, 16),
      },
      3: {
          "r_emb": (L, K, H, Dh),
          "layers.0.dec_attn.q_net.weight": (H * Dh, 16),
          "layers.0.dec_attn.kv_net.weight": (2 * H * Dh, 16),
      },
  }[attn_type]
  for name, shape in want.items():
    assert sd[name].shape == shape, name
  assert ("pos_emb.inv_freq" in sd) == (attn_type in (0, 2))
  assert not any(k.endswith(("r_net.weight", "qkv_net.weight")) for k in sd) or attn_type < 2
  np.savez(tmp_path / "sd.npz", **sd)
  again = convert.params_from_state_dict(convert.read_state_dict(str(tmp_path / "sd.npz")), cfg)
  for k, v in convert.flatten_params(params).items():
    np.testing.assert_array_equal(convert.flatten_params(again)[k], v, err_msg=k)
  if attn_type:
    with pytest.raises(convert.ConvertError, match="attn_type 0 only"):
      convert.state_dict_from_params(params, cfg, layout="hf")


def test_hparams_validation(tmp_path):
  with pytest.raises(convert.ConvertError, match=r"unknown hparams \['n_tokens'\]"):
    convert.load_hparams({**BASE, "n_tokens": 3})
  with pytest.raises(convert.ConvertError, match=r"missing required hparams \['d_inner'\]"):
    convert.load_hparams({k: v for k, v in BASE.items() if k != "d_inner"})
  with pytest.raises(convert.ConvertError, match="n_layer='2' must be an integer"):
    convert.load_hparams({**BASE, "n_layer": "2"})
  with pytest.raises(convert.ConvertError, match="attn_type=4"):
    convert.load_hparams({**BASE, "attn_type": 4})
  with pytest.raises(convert.ConvertError, match="more entries than"):
    convert.load_hparams({**BASE, "cutoffs": [10], "tie_projs": [False, True, True]})
  with pytest.raises(convert.ConvertError, match="cutoffs"):
    convert.load_hparams({**BASE, "cutoffs": [50]})  # not < n_token
  with pytest.raises(convert.ConvertError, match="nope.json does not exist"):
    convert.load_hparams(str(tmp_path / "nope.json"))
  hp = convert.load_hparams(
      write_json(
          tmp_path / "hp.json",
          {
              **BASE,
              "cutoffs": [10, 20],
              "proj_share_all_but_first": True,
              "d_embed": None,
              "clamp_len": -1,
          },
      )
  )
  assert hp["tie_projs"] == [False, True, True] and hp["d_embed"] == BASE["d_model"]
  cfg = convert.model_config_from_hparams(hp)
  assert cfg.clamp_len == 0 and cfg.tie_projs == (False, True, True) and cfg.d_embed is None
  assert convert.load_hparams({**BASE, "tie_projs": [True]})["tie_projs"] == [True]
  # Round trip of the hparams through a ModelConfig.
  assert (
      convert.model_config_from_hparams(
          convert.load_hparams(convert.hparams_from_model_config(cfg))
      )
      == cfg
  )


def test_state_dict_validation_names_tensor_and_shapes():
  hp = hparams("adaptive_div4_untied")
  cfg = convert.model_config_from_hparams(hp)
  sd = state_dict(hf_model(hp, seed=15))
  bad = dict(sd)
  bad["transformer.layers.1.dec_attn.qkv_net.weight"] = np.zeros((47, 16), np.float32)
  with pytest.raises(
      convert.ConvertError,
      match=r"layers\.1\.dec_attn\.qkv_net\.weight: expected "
      r"shape \(48, 16\) from the hparams, got \(47, 16\)",
  ):
    convert.params_from_state_dict(bad, cfg)
  missing = {k: v for k, v in sd.items() if k != "crit.out_projs.2"}
  with pytest.raises(
      convert.ConvertError, match=r"lacks 'crit\.out_projs\.2' \(expected shape \(16, 2\)\)"
  ):
    convert.params_from_state_dict(missing, cfg)
  with pytest.raises(convert.ConvertError, match="do not account for.*extra.weight"):
    convert.params_from_state_dict({**sd, "extra.weight": np.zeros(3)}, cfg)
  # Strings that would parse as floats, and non-finite values, are refused too.
  as_text = {**sd, "crit.cluster_bias": sd["crit.cluster_bias"].astype(str)}
  with pytest.raises(convert.ConvertError, match=r"crit\.cluster_bias has dtype <U"):
    convert.params_from_state_dict(as_text, cfg)
  inf = {**sd, "crit.cluster_bias": np.full_like(sd["crit.cluster_bias"], -np.inf)}
  with pytest.raises(convert.ConvertError, match=r"crit\.cluster_bias holds 2 NaN or infinite"):
    convert.params_from_state_dict(inf, cfg)
  # HF's default model unties u, v; hparams that say shared find no r_w_bias.
  shared = convert.model_config_from_hparams(hparams("plain"))
  untied_sd = state_dict(hf_model(hparams("plain", untie_r=True), seed=16))
  with pytest.raises(convert.ConvertError, match="lacks 'r_._bias'.*set untie_r=true"):
    convert.params_from_state_dict(untied_sd, shared)
  # The reference's names hold shared u, v once; hparams that untie them find none per layer.
  reference_names = convert.state_dict_from_params(
      convert.params_from_state_dict(state_dict(hf_model(hparams("plain"), seed=16)), shared),
      shared,
      layout="reference",
  )
  with pytest.raises(
      convert.ConvertError, match="lacks 'layers.0.dec_attn.r_._bias'.*set untie_r=false"
  ):
    convert.params_from_state_dict(
        reference_names, convert.model_config_from_hparams(hparams("plain", untie_r=True))
    )
  # Tied copies must really be tied.
  tied_cfg = convert.model_config_from_hparams(hparams("adaptive_div4_tied"))
  tied_sd = state_dict(hf_model(hparams("adaptive_div4_tied"), seed=17))
  tied_sd["crit.out_projs.1"] = tied_sd["crit.out_projs.1"] + 1.0
  with pytest.raises(
      convert.ConvertError, match="crit.out_projs.1 should be tied to word_emb.emb_projs.1"
  ):
    convert.params_from_state_dict(tied_sd, tied_cfg)


# ---------------------------------------------------------------------------
# TensorFlow checkpoints
# ---------------------------------------------------------------------------


TF_CASES = {
    # The released wt103 model's structure: div_val 4, projections tied but
    # the first, per-layer u, v.
    "wt103_like": dict(
        cutoffs=[10, 25], d_embed=32, div_val=4, tie_projs=[False, True, True], untie_r=True
    ),
    # enwik8 / text8: one table, no cutoffs, d_embed = d_model, shared u, v.
    "enwik8_like": dict(),
    # div_val 1 with a projection and cutoffs: no cutoff scope in the embedding,
    # per-cluster softmax biases concatenated, one untied softmax projection.
    "div1_projected": dict(
        cutoffs=[10, 25], d_embed=24, div_val=1, tie_projs=[False, True, True], untie_r=True
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TF_CASES))
def test_tf_checkpoint_converts_to_the_same_model(case, tmp_path):
  pytest.importorskip("tensorflow", reason=TF_REASON)
  hp = convert.load_hparams({**BASE, **TF_CASES[case]})
  model = hf_model(hp, seed=21)
  sd = state_dict(model)
  prefix = write_tf_checkpoint(tf_variables(sd, hp), tmp_path / "tf")
  workdir = tmp_path / "wd"
  report = convert.convert_to_workdir("tf", prefix, hp, str(workdir))
  assert report["cluster_order"] == "forward"
  _, cfg, _, _, params = restored(workdir)
  tokens = random_tokens(hp["n_token"], 3 * hp["tgt_len"] + 1, seed=22)
  ours, _ = our_segments(params, cfg, tokens, hp["tgt_len"])
  ref, _ = hf_segments(model, hp, tokens, hp["tgt_len"])  # TF and HF 4.35: forward order
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
  if case == "wt103_like":
    # HuggingFace's own TF loader reads the same names into the same tensors.
    from transformers import TransfoXLLMHeadModel
    from transformers.models.transfo_xl.modeling_transfo_xl import load_tf_weights_in_transfo_xl

    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      fresh = TransfoXLLMHeadModel(model.config)
    load_tf_weights_in_transfo_xl(fresh, model.config, prefix)
    for k, v in state_dict(fresh).items():
      np.testing.assert_array_equal(v, sd[k], err_msg=k)


def test_tf_checkpoint_validation(tmp_path):
  pytest.importorskip("tensorflow", reason=TF_REASON)
  hp = convert.load_hparams({**BASE, **TF_CASES["wt103_like"]})
  variables = tf_variables(state_dict(hf_model(hp, seed=23)), hp)
  cfg = convert.model_config_from_hparams(hp)
  with pytest.raises(convert.ConvertError, match="untie_r=false; set untie_r=true"):
    convert.state_dict_from_tf(
        variables, hp, convert.model_config_from_hparams({**hp, "untie_r": False})
    )
  with pytest.raises(convert.ConvertError, match="do not account for.*layer_9"):
    convert.state_dict_from_tf(
        {**variables, "transformer/layer_9/ff/layer_1/bias": np.zeros(3)}, hp, cfg
    )
  with pytest.raises(convert.ConvertError, match="lacks transformer/layer_1/rel_attn/o/kernel"):
    convert.state_dict_from_tf(
        {k: v for k, v in variables.items() if k != "transformer/layer_1/rel_attn/o/kernel"},
        hp,
        cfg,
    )
  untied = convert.load_hparams({**hp, "tie_projs": [False, False, False]})
  extra_proj = dict(variables)
  extra_proj["transformer/adaptive_softmax/cutoff_1/proj"] = np.zeros((8, 16), np.float32)
  with pytest.raises(convert.ConvertError, match=r"tie_projs\[1\]=true"):
    convert.state_dict_from_tf(extra_proj, hp, cfg)
  # Untied in the hparams but tied in the checkpoint: the embedding projection is copied.
  pt = convert.state_dict_from_tf(variables, untied, convert.model_config_from_hparams(untied))
  np.testing.assert_array_equal(pt["crit.out_projs.2"], pt["word_emb.emb_projs.2"])
  with pytest.raises(convert.ConvertError, match="no TF checkpoint at .*nothing"):
    convert.read_tf_checkpoint(str(tmp_path / "nothing"))
  # Damaged files: the index (read on opening) and the data (read per tensor).
  prefix = write_tf_checkpoint(variables, tmp_path / "tf")
  data = Path(prefix + ".data-00000-of-00001")
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
  opening = f"cannot read the TF checkpoint {re.escape(prefix)} "
  with pytest.raises(
      convert.ConvertError, match=opening + r"\(.*\); pass the prefix of a complete checkpoint"
  ):
    convert.read_tf_checkpoint(prefix)
  strings = write_tf_checkpoint(
      {**variables, "transformer/notes": np.array([b"x"])}, tmp_path / "tf_strings"
  )
  with pytest.raises(
      convert.ConvertError, match="transformer/notes has dtype object, not a real number type"
  ):
    convert.read_tf_checkpoint(strings)
  index = Path(prefix + ".index")
  index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
  with pytest.raises(convert.ConvertError, match=opening):
    convert.read_tf_checkpoint(prefix)


# ---------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_enwik8_reference_vocabulary_maps_onto_bytes(tmp_path, reports):
  """The reference enwik8 vocabulary: 204 byte values written as decimals, by
  frequency, no newline (byte 10).  Mapped onto our 256 byte ids."""
  rng = np.random.default_rng(31)
  seen = np.sort(rng.choice(np.setdiff1d(np.arange(256), [10]), size=204, replace=False))
  ref_symbols = [str(b) for b in rng.permutation(seen)]
  hp = convert.load_hparams({**BASE, "n_token": 204})
  model = hf_model(hp, seed=32)
  np.savez(tmp_path / "sd.npz", **state_dict(model))
  (tmp_path / "vocab.txt").write_text("".join(f"{s} 123\n" for s in ref_symbols))
  report = convert.convert_to_workdir(
      "pytorch",
      str(tmp_path / "sd.npz"),
      hp,
      str(tmp_path / "wd"),
      vocab=str(tmp_path / "vocab.txt"),
      dataset="enwik8",
  )
  out = reports.text
  assert report["vocab"]["matched"] == 204 and len(report["vocab"]["ours_unseen"]) == 52
  assert "matched 204 of the model's 204 symbols onto enwik8's 256 ids" in out
  assert "newline" in out and "byte 10" in out
  config, cfg, unit, _, params = restored(tmp_path / "wd")
  assert cfg.n_token == 256 and unit == "byte" and config.data.dataset == "enwik8"
  unseen = np.setdiff1d(np.arange(256), seen)
  assert np.all(params["word_emb"]["emb_layers_0"][unseen] == 0)
  assert np.all(params["crit"]["out_bias_0"][unseen] == convert.UNSEEN_BIAS)
  # The same model: bytes here, reference ids there.
  ref_id = {int(s): r for r, s in enumerate(ref_symbols)}
  stream = rng.choice(seen, size=(B, 2 * hp["tgt_len"] + 1))
  ours, _ = our_segments(params, cfg, stream, hp["tgt_len"])
  ref, _ = hf_segments(model, hp, np.vectorize(ref_id.get)(stream), hp["tgt_len"])
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_text8_and_word_vocabulary_symbols():
  from transformer_xl.data import tokenizers

  ref = ["_"] + list("etaoinshrdlcumwfgypbvkxjqz")
  ref_of_ours, rep = convert.map_vocab(ref, tokenizers.TEXT8_VOCAB, "text8")
  assert rep["matched"] == 27 and ref_of_ours[0] == 0  # " " <- "_"
  assert [ref[r] for r in ref_of_ours[1:]] == list("abcdefghijklmnopqrstuvwxyz")
  ref_of_ours, rep = convert.map_vocab(["<eos>", "the", "zzz"], ["<eos>", "a", "the"])
  assert ref_of_ours.tolist() == [0, -1, 1] and rep["ref_unmatched"] == ["zzz"]
  assert rep["ours_unseen"] == ["a"]


def test_vocabulary_remap_keeps_adaptive_clusters(tmp_path):
  hp = hparams("adaptive_div4_untied")
  cfg = convert.model_config_from_hparams(hp)
  params = convert.params_from_state_dict(state_dict(hf_model(hp, seed=33)), cfg, "reference")
  # Permute inside each cluster and leave one id of the last cluster unseen.
  rng = np.random.default_rng(34)
  ref_of_ours = np.concatenate(
      [rng.permutation(np.arange(lo, hi)) for lo, hi in ((0, 10), (10, 25), (25, 40))]
  )
  ref_of_ours[30] = -1
  new, new_cfg = convert.remap_vocab(params, cfg, ref_of_ours)
  assert new_cfg.n_token == 40
  j, r = 17, ref_of_ours[17]  # cluster 1: local rows
  np.testing.assert_array_equal(
      new["word_emb"]["emb_layers_1"][j - 10], params["word_emb"]["emb_layers_1"][r - 10]
  )
  np.testing.assert_array_equal(
      new["crit"]["out_weight_1"][j - 10], params["crit"]["out_weight_1"][r - 10]
  )
  assert new["crit"]["out_bias_2"][30 - 25] == convert.UNSEEN_BIAS
  assert not new["word_emb"]["emb_layers_2"][30 - 25].any()
  swapped = np.arange(40)
  swapped[[3, 30]] = [30, 3]
  with pytest.raises(convert.ConvertError, match="2 symbols would change adaptive-softmax cluster"):
    convert.remap_vocab(params, cfg, swapped)
  # A vocabulary needs a dataset to map onto, and must fit the hparams.
  np.savez(tmp_path / "sd.npz", **state_dict(hf_model(hparams("plain"), seed=35)))
  (tmp_path / "v.txt").write_text("a\nb\n")
  with pytest.raises(convert.ConvertError, match="--vocab needs --dataset"):
    convert.convert_to_workdir(
        "pytorch",
        str(tmp_path / "sd.npz"),
        hparams("plain"),
        str(tmp_path / "wd"),
        vocab=str(tmp_path / "v.txt"),
    )
  with pytest.raises(convert.ConvertError, match="has 2 symbols but hparams n_token=40"):
    convert.convert_to_workdir(
        "pytorch",
        str(tmp_path / "sd.npz"),
        hparams("plain"),
        str(tmp_path / "wd"),
        vocab=str(tmp_path / "v.txt"),
        dataset="enwik8",
    )
  with pytest.raises(convert.ConvertError, match="enwik8 has a vocabulary of 256"):
    convert.convert_to_workdir(
        "pytorch",
        str(tmp_path / "sd.npz"),
        hparams("plain"),
        str(tmp_path / "wd"),
        dataset="enwik8",
    )


# ---------------------------------------------------------------------------
# Bad input files on the command line: one "error:" line naming the file
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_inputs(tmp_path_factory):
  """(directory, its hparams.json, a matching state dict) for BASE, written fast
  (zero tensors from the expected shapes: no HuggingFace model)."""
  root = tmp_path_factory.mktemp("inputs")
  cfg = convert.model_config_from_hparams(convert.load_hparams(BASE))
  params = convert.unflatten_params(
      {p: np.zeros(s, np.float32) for p, s in convert.expected_param_shapes(cfg).items()}
  )
  sd = convert.state_dict_from_params(params, cfg)
  np.savez(root / "good.npz", **sd)
  return root, write_json(root / "hparams.json", BASE), sd


def _npz_bytes(root):
  return (root / "good.npz").read_bytes()


def _damaged_member(root, path, sd):  # pylint: disable=unused-argument
  """good.npz with bytes of its first array's data overwritten (stored
  uncompressed by np.savez: the zip's CRC no longer matches)."""
  import zipfile

  data = bytearray(_npz_bytes(root))
  with zipfile.ZipFile(root / "good.npz") as z:
    info = z.infolist()[0]
  start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 128
  data[start : start + 8] = b"\xff" * 8
  path.write_bytes(bytes(data))


def _damaged_directory(root, path, sd):  # pylint: disable=unused-argument
  """good.npz with its zip directory's first entry damaged (its end record intact)."""
  data = bytearray(_npz_bytes(root))
  end = data.rfind(b"PK\x05\x06")
  directory = int.from_bytes(data[end + 16 : end + 20], "little")
  data[directory : directory + 4] = b"\0\0\0\0"
  path.write_bytes(bytes(data))


def _with(sd, **changes):
  return {k: v for k, v in {**sd, **changes}.items() if v is not None}


# name -> (file name, writer(root, path, sd), what the message says).  Each case
# is one kind of bad file; --from=pytorch unless the name says otherwise.
BAD_INPUTS = {
    "npz cut at 0 bytes": ("sd.npz", lambda r, p, sd: p.write_bytes(b""), "is empty"),
    "npz cut at 10 bytes": (
        "sd.npz",
        lambda r, p, sd: p.write_bytes(_npz_bytes(r)[:10]),
        "is truncated or damaged",
    ),
    "npz cut at half": (
        "sd.npz",
        lambda r, p, sd: p.write_bytes(_npz_bytes(r)[: len(_npz_bytes(r)) // 2]),
        "is truncated or damaged",
    ),
    "npz cut 10 bytes short": (
        "sd.npz",
        lambda r, p, sd: p.write_bytes(_npz_bytes(r)[:-10]),
        "is truncated or damaged",
    ),
    "not a zip": (
        "sd.npz",
        lambda r, p, sd: p.write_text("name,value\nw,1.0\n"),
        "is not an .npz archive (not a zip file)",
    ),
    "a .npy named .npz": (
        "sd.npz",
        lambda r, p, sd: np.save(open(p, "wb"), np.zeros(3)),
        "is a single .npy array",
    ),
    "object array": (
        "sd.npz",
        lambda r, p, sd: np.savez(p, **_with(sd, r_w_bias=np.array([{"w": 1}], dtype=object))),
        "array 'r_w_bias' holds Python objects (dtype=object)",
    ),
    "damaged member": ("sd.npz", _damaged_member, "is damaged (BadZipFile: Bad CRC-32"),
    "damaged zip directory": (
        "sd.npz",
        _damaged_directory,
        "is not a readable .npz archive (BadZipFile",
    ),
    "member not .npy": (
        "sd.npz",
        lambda r, p, sd: torch.save({"w": torch.zeros(2)}, p),
        "it looks like a torch file",
    ),
    "no arrays": ("sd.npz", lambda r, p, sd: np.savez(p), "holds no tensors"),
    "missing key": (
        "sd.npz",
        lambda r, p, sd: np.savez(p, **_with(sd, **{"layers.1.dec_attn.o_net.weight": None})),
        "state dict lacks 'layers.1.dec_attn.o_net.weight' (expected shape (16, 16))",
    ),
    "wrong shape": (
        "sd.npz",
        lambda r, p, sd: np.savez(
            p, **_with(sd, **{"layers.1.pos_ff.CoreNet.0.weight": np.zeros((31, 16), np.float32)})
        ),
        "layers.1.pos_ff.CoreNet.0.weight: expected shape (32, 16) from the hparams, "
        "got (31, 16); the state dict and the hparams describe different models",
    ),
    "string dtype": (
        "sd.npz",
        lambda r, p, sd: np.savez(p, **_with(sd, r_w_bias=np.full((2, 8), "0.5"))),
        "'r_w_bias' has dtype <U3",
    ),
    "NaN values": (
        "sd.npz",
        lambda r, p, sd: np.savez(p, **_with(sd, r_w_bias=np.full((2, 8), np.nan, np.float32))),
        "r_w_bias holds 16 NaN or infinite values",
    ),
    "a directory": ("sd.npz", lambda r, p, sd: p.mkdir(), "is a directory"),
    "torch: pickled module": (
        "sd.pt",
        lambda r, p, sd: torch.save(torch.nn.Linear(2, 2), p),
        "holds pickled Python objects",
    ),
    "torch: truncated": (
        "sd.pt",
        lambda r, p, sd: (
            torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, p),
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        ),
        "is damaged or not a torch file",
    ),
    "torch: nested dict": (
        "sd.pt",
        lambda r, p, sd: torch.save(
            {"model": {k: torch.from_numpy(v) for k, v in sd.items()}, "step": 3}, p
        ),
        "is not a state dict (a flat dict name -> tensor) (its keys: ['model', 'step'])",
    ),
    "hparams: not JSON": (
        "hp.json",
        lambda r, p, sd: p.write_text("{n_token: 40}"),
        "is not valid JSON",
    ),
    "hparams: not UTF-8": (
        "hp.json",
        lambda r, p, sd: p.write_bytes(b"\xff\xfe{}"),
        "is not UTF-8 text",
    ),
    "hparams: not an object": (
        "hp.json",
        lambda r, p, sd: p.write_text("[40, 2]"),
        "expected a JSON object of constructor arguments, got list",
    ),
    "vocab: not UTF-8": (
        "vocab.txt",
        lambda r, p, sd: p.write_bytes(b"a\nb\n\xff\n"),
        "is not UTF-8 text (line 3, byte 4",
    ),
    "vocab: repeated symbol": (
        "vocab.txt",
        lambda r, p, sd: p.write_text("a\nb\na\n"),
        ":3: symbol 'a' repeats line 1",
    ),
    "tf: no checkpoint": ("model.ckpt-0", lambda r, p, sd: None, "no TF checkpoint at"),
    "tf: the .index file": (
        "model.ckpt-0.index",
        lambda r, p, sd: p.write_bytes(b"x"),
        "pass the prefix without the extension",
    ),
}


def _bad_input(case, good_inputs, tmp_path):
  """(source, checkpoint, hparams, vocab, dataset, the bad file, expected
  words) for a BAD_INPUTS case, its bad file written under tmp_path."""
  root, good_hparams, sd = good_inputs
  name, write, expected = BAD_INPUTS[case]
  bad = tmp_path / name
  write(root, bad, sd)
  checkpoint, hparams, vocab, dataset = str(root / "good.npz"), good_hparams, None, None
  if case.startswith("hparams:"):
    hparams = str(bad)
  elif case.startswith("vocab:"):
    vocab, dataset = str(bad), "enwik8"
  else:
    checkpoint = str(bad)
  return (
      "tf" if case.startswith("tf:") else "pytorch",
      checkpoint,
      hparams,
      vocab,
      dataset,
      bad,
      expected,
  )


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_file_is_a_one_line_error_naming_it(case, good_inputs, tmp_path):
  """Every bad input is a ConvertError, raised before anything is written,
  whose message is one line naming the file, what is wrong and what to do."""
  source, checkpoint, hparams, vocab, dataset, bad, expected = _bad_input(
      case, good_inputs, tmp_path
  )
  workdir = tmp_path / "wd"
  with pytest.raises(convert.ConvertError) as err:
    convert.convert_to_workdir(
        source, checkpoint, hparams, str(workdir), vocab=vocab, dataset=dataset
    )
  message = str(err.value)
  assert "\n" not in message and str(bad) in message and expected in message, message
  assert "; " in message, message  # "<what is wrong>; <what to do>"
  assert not workdir.exists()


# The command line, in fresh processes (~3 s each): the cases of the issue.
CLI_CASES = [
    "npz cut at 0 bytes",
    "npz cut at 10 bytes",
    "npz cut at half",
    "not a zip",
    "object array",
    "missing key",
    "wrong shape",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_bad_input_file_on_the_command_line_is_one_error_line(case, good_inputs, tmp_path):
  """Exit status 1, stderr exactly one "error: ..." line naming the file, no
  traceback, nothing written to --workdir."""
  source, checkpoint, hparams, _, _, bad, expected = _bad_input(case, good_inputs, tmp_path)
  workdir = tmp_path / "wd"
  r = run_module(
      "transformer_xl.convert",
      f"--from={source}",
      f"--checkpoint={checkpoint}",
      f"--hparams={hparams}",
      f"--workdir={workdir}",
      timeout=120,
  )
  assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
  assert str(bad) in lines[0] and expected in lines[0], lines[0]
  assert not workdir.exists()


def test_a_file_name_with_a_line_break_still_gives_one_error_line(good_inputs, tmp_path):
  """The command line prints every message on one line, whatever it quotes."""
  _, hparams, _ = good_inputs
  r = run_module(
      "transformer_xl.convert",
      "--from=pytorch",
      f"--checkpoint={tmp_path / 'two'}\nlines.npz",
      f"--hparams={hparams}",
      f"--workdir={tmp_path / 'wd'}",
      timeout=120,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
  assert f"{tmp_path / 'two'} lines.npz does not exist" in lines[0], lines[0]


def test_settings_and_small_inputs_are_checked_before_the_checkpoint(good_inputs, tmp_path):
  """What needs neither the checkpoint nor the corpus fails first: the
  checkpoint here does not exist, and is never reached."""
  _, hparams, _ = good_inputs
  missing = str(tmp_path / "never_read.npz")
  (tmp_path / "big_vocab.txt").write_text("".join(f"w{i}\n" for i in range(41)))
  (tmp_path / "a_file").write_text("")
  (tmp_path / "used" / "checkpoints" / "0").mkdir(parents=True)
  cases = [
      (dict(global_batch=0), "train.global_batch=0 must be >= 1"),
      (dict(eval_tgt_len=0), "eval: tgt_len must be >= 1"),
      (
          dict(vocab=str(tmp_path / "big_vocab.txt"), dataset="enwik8"),
          "big_vocab.txt has 41 symbols but hparams n_token=40",
      ),
      (dict(vocab=str(tmp_path / "no_vocab.txt"), dataset="enwik8"), "no_vocab.txt does not exist"),
      (dict(dataset="enwik9"), "dataset='enwik9': choose one of"),
      (dict(unit="bits"), "unit='bits': use byte, char or word"),
      (dict(workdir=str(tmp_path / "used")), "already holds checkpoints (step 0)"),
      (dict(workdir=str(tmp_path / "a_file")), "is a file"),
      (dict(workdir=str(tmp_path / "a_file" / "wd")), "a_file is a file"),
  ]
  for kwargs, expected in cases:
    workdir = kwargs.pop("workdir", str(tmp_path / "wd"))
    with pytest.raises(convert.ConvertError) as err:
      convert.convert_to_workdir("pytorch", missing, hparams, workdir, **kwargs)
    assert expected in str(err.value) and "\n" not in str(err.value), (kwargs, str(err.value))
  assert not (tmp_path / "wd").exists()


def test_export_inputs_are_checked_before_the_restore(tmp_path):
  (tmp_path / "empty").mkdir()
  (tmp_path / "a_file").write_text("")
  cases = [
      (
          tmp_path / "nowhere",
          tmp_path / "out.npz",
          "--workdir=" + str(tmp_path / "nowhere") + " is not a directory",
      ),
      (
          tmp_path / "empty",
          tmp_path / "out.npz",
          str(tmp_path / "empty" / "config.json") + " does not exist",
      ),
      (tmp_path / "empty", tmp_path / "a_file" / "out.npz", "a_file is a file"),
      (tmp_path / "empty", tmp_path / "empty", "is a directory; pass the path of the file"),
  ]
  for workdir, out, expected in cases:
    with pytest.raises(convert.ConvertError) as err:
      convert.export_pytorch(str(workdir), str(out))
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
  assert not (tmp_path / "out.npz").exists()


def test_export_from_a_damaged_workdir_is_one_error_line(tmp_path):
  """workdir.WorkdirError (a damaged config.json) used to end in a traceback."""
  (tmp_path / "wd").mkdir()
  (tmp_path / "wd" / "config.json").write_text("{not json")
  r = run_module(
      "transformer_xl.convert",
      "--to=pytorch",
      f"--workdir={tmp_path / 'wd'}",
      f"--checkpoint={tmp_path / 'out.npz'}",
      timeout=120,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
  assert str(tmp_path / "wd" / "config.json") + " is damaged" in lines[0], lines[0]
  assert not (tmp_path / "out.npz").exists()


def test_an_os_error_is_one_error_line(good_inputs, tmp_path):
  """An OSError of the environment (here a name longer than the file system
  allows) is one line naming the path, not a traceback."""
  root, hparams, _ = good_inputs
  workdir = tmp_path / ("x" * 300)
  r = run_module(
      "transformer_xl.convert",
      "--from=pytorch",
      f"--checkpoint={root / 'good.npz'}",
      f"--hparams={hparams}",
      f"--workdir={workdir}",
      timeout=120,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: {workdir}: "), r.stderr
  assert "check the path" in lines[0], lines[0]


# ---------------------------------------------------------------------------
# End to end: convert (CLI) -> main --mode=score (CLI) -> export
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_end_to_end_convert_then_score_matches_huggingface(tmp_path):
  raw = {
      **BASE,
      "cutoffs": [10, 25],
      "d_embed": 24,
      "tie_projs": [False, True, False],
      "same_length": True,
      "clamp_len": 4,
  }
  hp = convert.load_hparams(raw)
  model = hf_model(hp, seed=41)
  sd = state_dict(model)
  np.savez(tmp_path / "sd.npz", **sd)
  torch.save(model.state_dict(), tmp_path / "sd.bin")  # HuggingFace's own file
  hp_path = write_json(tmp_path / "hparams.json", raw)
  # 1. The command line, from the .npz (8 simulated devices: global batch 8).
  wd_npz, wd_torch = tmp_path / "wd_npz", tmp_path / "wd_torch"
  r = run_module(
      "transformer_xl.convert",
      "--from=pytorch",
      f"--checkpoint={tmp_path / 'sd.npz'}",
      f"--hparams={hp_path}",
      f"--workdir={wd_npz}",
      "--global_batch=8",
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert "cluster order: forward" in r.stdout
  config = json.loads((wd_npz / "config.json").read_text())
  assert config["eval"]["tgt_len"] == 5 and config["eval"]["mem_len"] == 7
  assert config["eval"]["clamp_len"] == 4 and config["eval"]["same_length"] is True
  assert json.loads((wd_npz / "model_config.json").read_text())["model"]["n_token"] == 40
  # 2. The torch file, in process: the same parameters.
  convert.convert_to_workdir("pytorch", str(tmp_path / "sd.bin"), hp_path, str(wd_torch))
  p_npz, p_torch = restored(wd_npz)[-1], restored(wd_torch)[-1]
  assert all(
      np.array_equal(convert.flatten_params(p_torch)[k], v)
      for k, v in convert.flatten_params(p_npz).items()
  )
  # 3. Score with main in a subprocess: eval segments of 5, memory 7, same_length, clamp 4.
  tokens = random_tokens(hp["n_token"], 18, seed=42, batch=3)  # T = 17: last segment padded
  np.save(tmp_path / "tokens.npy", tokens)
  r = run_module(
      "transformer_xl.main",
      f"--workdir={wd_npz}",
      "--mode=score",
      f"--tokens={tmp_path / 'tokens.npy'}",
      f"--out={tmp_path / 'nll.npy'}",
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  nll = np.load(tmp_path / "nll.npy")
  ref, _ = hf_segments(model, hp, tokens, hp["tgt_len"])
  assert nll.shape == ref.shape == (3, 17)
  np.testing.assert_allclose(nll, ref, rtol=1e-5, atol=1e-5)
  # 4. Export back (command line), HF names: the file HF was converted from.
  r = run_module(
      "transformer_xl.convert",
      "--to=pytorch",
      f"--workdir={wd_npz}",
      f"--checkpoint={tmp_path / 'out.bin'}",
      "--layout=hf",
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  back = torch.load(tmp_path / "out.bin", weights_only=True)
  assert set(back) == set(sd)
  assert all(np.array_equal(back[k].numpy(), sd[k]) for k in sd)
  exported_hp = convert.load_hparams(str(tmp_path / "out.hparams.json"))
  assert convert.model_config_from_hparams(exported_hp) == convert.model_config_from_hparams(hp)
  # 5. Errors are one line naming the problem; a converted workdir is not overwritten.
  r = run_module(
      "transformer_xl.convert",
      "--from=pytorch",
      f"--checkpoint={tmp_path / 'sd.npz'}",
      f"--hparams={hp_path}",
      f"--workdir={wd_npz}",
      "--global_batch=8",
  )
  assert r.returncode != 0 and "already holds checkpoints" in r.stderr


@pytest.mark.slow
def test_converted_word_model_with_a_mapped_vocabulary_runs_main_eval(tmp_path):
  """--vocab + --dataset on a word corpus (a PTB-format sample), then
  ``main --mode=eval``: its valid loss is HF's NLL of the valid stream."""
  from transformer_xl import data

  manual, data_dir = write_ptb_sample(tmp_path / "ptb"), tmp_path / "tfds"
  corpus = data.load_corpus(
      "ptb", data_dir=str(data_dir), manual_dir=str(manual), download=False, verify_checksums=False
  )
  ours = list(corpus.vocab)
  # The released model's vocabulary: another order and one symbol we do not have.
  ref_vocab = ["@not-in-ptb@"] + [ours[i] for i in np.random.default_rng(51).permutation(len(ours))]
  (tmp_path / "vocab.txt").write_text("\n".join(ref_vocab) + "\n")
  hp = convert.load_hparams(
      {**BASE, "n_token": len(ref_vocab), "tgt_len": 16, "mem_len": 24, "same_length": True}
  )
  model = hf_model(hp, seed=52)
  np.savez(tmp_path / "sd.npz", **state_dict(model))
  wd = tmp_path / "wd"
  report = convert.convert_to_workdir(
      "pytorch",
      str(tmp_path / "sd.npz"),
      hp,
      str(wd),
      vocab=str(tmp_path / "vocab.txt"),
      dataset="ptb",
      data_dir=str(data_dir),
      manual_dir=str(manual),
      download=False,
      verify_checksums=False,
      global_batch=8,
  )
  assert report["vocab"]["matched"] == len(ours)
  assert report["vocab"]["ref_unmatched"] == ["@not-in-ptb@"]
  r = run_module("transformer_xl.main", f"--workdir={wd}", "--mode=eval")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  results = json.loads((wd / "eval_results.json").read_text())
  valid = corpus.splits["valid"]
  stream = np.concatenate([[corpus.boundary_id], valid.read(0, valid.num_tokens)])
  ref_id = {s: r for r, s in enumerate(ref_vocab)}
  ref_stream = np.asarray([ref_id[ours[t]] for t in stream])[None, :]
  with torch.no_grad():  # the dropped symbol's probability mass is renormalised away
    model.crit.out_layers[0].bias[0] = -1e4
  ref, _ = hf_segments(model, hp, ref_stream, hp["tgt_len"])
  assert results["valid"]["tokens"] == valid.num_tokens
  assert results["valid"]["loss_nats"] == pytest.approx(float(ref.mean()), rel=1e-5)
  assert results["valid"]["ppl"] == pytest.approx(float(np.exp(ref.mean())), rel=1e-4)
