"""The reference implementation's models for the parity tests: HuggingFace's
``TransfoXLLMHeadModel`` (transformers 4.35.2, CPU torch) and the variables
of the reference's TF checkpoints.

A plain module shared by test_parity.py, test_convert.py,
test_convert_safetensors.py, test_pretrained.py and test_dynamic_eval_cli.py.
test_parity.py's docstring gives the three known differences between
HuggingFace's port and the reference, which these helpers handle as the
reference does: the empty initial memory (``empty_hf_mems``), the adaptive
softmax's cluster order (``reverse_clusters``) and HF's losses grouped by
cluster (per-token NLL taken from its log-probs, ``hf_segments``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# torch and transformers are in the test extra: a missing one is an error, not a skip.
import torch

with warnings.catch_warnings():  # transformers 4.35 uses a deprecated torch pytree API
  warnings.simplefilter("ignore", FutureWarning)
  import transformers  # noqa: F401  (a missing one fails the importing module here)

from transformer_xl import convert
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

TF_REASON = (
    "TensorFlow is not installed: reading the reference TF checkpoints needs the "
    "convert extra (pip install -e '.[convert]')"
)

# ---------------------------------------------------------------------------
# HuggingFace's model
# ---------------------------------------------------------------------------

# The sizes of every case (reference hparams names); CASES adds each case's options.
BASE = dict(
    n_token=40,
    n_layer=2,
    n_head=2,
    d_model=16,
    d_head=8,
    d_inner=32,
    dropout=0.0,
    dropatt=0.0,
    tgt_len=5,
    mem_len=7,
)
CASES = {
    "plain": dict(tie_weight=False),
    "plain_projected": dict(d_embed=24, tie_projs=[False]),
    "same_length_clamp": dict(same_length=True, clamp_len=3),
    "pre_lnorm": dict(pre_lnorm=True),
    "untie_r": dict(untie_r=True),
    "adaptive_div1_tied": dict(
        cutoffs=[10, 25], d_embed=24, div_val=1, tie_projs=[False, True, True]
    ),
    "adaptive_div1_untied": dict(
        cutoffs=[10, 25], d_embed=24, div_val=1, tie_projs=[False, False, False], tie_weight=False
    ),
    "adaptive_div4_tied": dict(
        cutoffs=[10, 25], d_embed=32, div_val=4, tie_projs=[False, True, True]
    ),
    "adaptive_div4_untied": dict(
        cutoffs=[10, 25], d_embed=32, div_val=4, tie_projs=[False, False, False], tie_weight=False
    ),
}
B = 2  # rows of random_tokens


def hparams(case: str, **overrides) -> dict:
  """Validated reference hparams of a test case."""
  return convert.load_hparams({**BASE, **CASES[case], **overrides})


def hf_model(hp: dict, seed: int = 0):
  """A TransfoXLLMHeadModel for reference hparams, parameters redrawn, eval mode."""
  with warnings.catch_warnings():  # deprecation warnings of transformers 4.35's TransfoXL
    warnings.simplefilter("ignore")
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    config = TransfoXLConfig(
        vocab_size=hp["n_token"],
        cutoffs=list(hp["cutoffs"]),
        d_model=hp["d_model"],
        d_embed=hp["d_embed"],
        n_head=hp["n_head"],
        d_head=hp["d_head"],
        d_inner=hp["d_inner"],
        div_val=hp["div_val"],
        pre_lnorm=hp["pre_lnorm"],
        n_layer=hp["n_layer"],
        mem_len=hp["mem_len"],
        clamp_len=hp["clamp_len"],
        same_length=hp["same_length"],
        dropout=0.0,
        dropatt=0.0,
        untie_r=hp["untie_r"],
        tie_word_embeddings=hp["tie_weight"],
    )
    config.tie_projs = list(hp["tie_projs"])
    model = TransfoXLLMHeadModel(config).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():  # shared (tied) tensors are listed once
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if name.endswith("layer_norm.weight") else 0.2 * noise)
  return model


def state_dict(model) -> dict[str, np.ndarray]:
  """The HF model's state dict as numpy copies."""
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def reverse_clusters(model) -> None:
  """Known difference (2): reverses HF's cluster rows in place."""
  if hasattr(model.crit, "cluster_weight"):
    with torch.no_grad():
      model.crit.cluster_weight.copy_(model.crit.cluster_weight.flip(0))
      model.crit.cluster_bias.copy_(model.crit.cluster_bias.flip(0))


def empty_hf_mems(hp: dict, batch: int):
  """Known difference (1): the reference's empty memory, in HF's format."""
  return [torch.zeros(0, batch, hp["d_model"]) for _ in range(hp["n_layer"])]


def hf_segments(model, hp: dict, tokens: np.ndarray, seg_len: int, mems=None):
  """HF's per-token NLL [B, T] and memories after each segment.

  Args:
    tokens: int [B, T + 1]; segment s predicts tokens[:, s*L+1 : (s+1)*L+1].
    mems: initial memories; default the reference's empty memory.

  Returns:
    (nll float32 [B, T] from HF's log-probs, list of per-segment memories
    as numpy [n_layer, B, m, d_model]).
  """
  mems = empty_hf_mems(hp, tokens.shape[0]) if mems is None else mems
  nlls, all_mems = [], []
  t = tokens.shape[1] - 1
  with torch.no_grad():
    for s in range(0, t, seg_len):
      x = torch.from_numpy(tokens[:, s : min(s + seg_len, t)]).long()
      y = torch.from_numpy(tokens[:, s + 1 : min(s + seg_len, t) + 1]).long()
      out = model(input_ids=x, mems=mems)
      mems = out.mems
      nlls.append(-out.prediction_scores.gather(-1, y[..., None])[..., 0].numpy())
      all_mems.append(np.stack([m.numpy() for m in mems]).transpose(0, 2, 1, 3))
  return np.concatenate(nlls, axis=1), all_mems


def our_segments(params, cfg, tokens: np.ndarray, seg_len: int):
  """Our per-token NLL [B, T] and memories (valid slots only) after each segment."""
  model = models.TransformerXL(cfg)
  step = jax.jit(lambda p, x, mem, y: model.apply({"params": p}, x, mem, y))
  memory = memory_lib.init_memory(cfg, tokens.shape[0])
  nlls, all_mems = [], []
  for s in range(0, tokens.shape[1] - 1, seg_len):
    x, y = tokens[:, s : s + seg_len], tokens[:, s + 1 : s + seg_len + 1]
    nll, memory = step(params, jnp.asarray(x, jnp.int32), memory, jnp.asarray(y, jnp.int32))
    nlls.append(np.asarray(nll))
    mlen = int(np.asarray(memory.mlen_B)[0])
    all_mems.append(np.asarray(memory.mems_LxBxMxD)[:, :, cfg.mem_len - mlen :])
  return np.concatenate(nlls, axis=1), all_mems


def random_tokens(n_token: int, length: int, seed: int = 0, batch: int = B) -> np.ndarray:
  """int64 [batch, length] token ids drawn uniformly from [0, n_token)."""
  return np.random.default_rng(seed).integers(0, n_token, size=(batch, length)).astype(np.int64)


# ---------------------------------------------------------------------------
# The reference's TensorFlow checkpoints
# ---------------------------------------------------------------------------


def tf_variables(sd: dict, hp: dict) -> dict:
  """The reference TF model's variables (tf/model.py names) for an HF state dict.

  Written independently of transformer_xl.convert; TF order of clusters = HF 4.35's.
  Adds optimizer slots and global_step, which the converter must skip.
  """
  sd = {k[len("transformer.") :] if k.startswith("transformer.") else k: v for k, v in sd.items()}
  L, cut, V = hp["n_layer"], hp["cutoffs"], hp["n_token"]
  out = {}

  def put(name, value):
    out["transformer/" + name] = np.asarray(value, np.float32)

  for b in ("r_w_bias", "r_r_bias"):
    put(b, np.stack([sd[f"layers.{l}.dec_attn.{b}"] for l in range(L)]) if hp["untie_r"] else sd[b])
  if hp["div_val"] == 1:
    put("adaptive_embed/lookup_table", sd["word_emb.emb_layers.0.weight"])
    if "word_emb.emb_projs.0" in sd:
      put("adaptive_embed/proj_W", sd["word_emb.emb_projs.0"].T)
  else:
    for i in range(len(cut) + 1):
      put(f"adaptive_embed/cutoff_{i}/lookup_table", sd[f"word_emb.emb_layers.{i}.weight"])
      put(f"adaptive_embed/cutoff_{i}/proj_W", sd[f"word_emb.emb_projs.{i}"].T)
  for l in range(L):
    a, f = f"layers.{l}.dec_attn.", f"layers.{l}.pos_ff."
    put(f"layer_{l}/rel_attn/qkv/kernel", sd[a + "qkv_net.weight"].T)
    put(f"layer_{l}/rel_attn/r/kernel", sd[a + "r_net.weight"].T)
    put(f"layer_{l}/rel_attn/o/kernel", sd[a + "o_net.weight"].T)
    put(f"layer_{l}/rel_attn/LayerNorm/gamma", sd[a + "layer_norm.weight"])
    put(f"layer_{l}/rel_attn/LayerNorm/beta", sd[a + "layer_norm.bias"])
    put(f"layer_{l}/ff/layer_1/kernel", sd[f + "CoreNet.0.weight"].T)
    put(f"layer_{l}/ff/layer_1/bias", sd[f + "CoreNet.0.bias"])
    put(f"layer_{l}/ff/layer_2/kernel", sd[f + "CoreNet.3.weight"].T)
    put(f"layer_{l}/ff/layer_2/bias", sd[f + "CoreNet.3.bias"])
    put(f"layer_{l}/ff/LayerNorm/gamma", sd[f + "layer_norm.weight"])
    put(f"layer_{l}/ff/LayerNorm/beta", sd[f + "layer_norm.bias"])
  if not cut:
    put("adaptive_softmax/bias", sd["crit.out_layers.0.bias"])
  else:
    bounds = [0] + cut + [V]
    for i in range(len(cut) + 1):
      put(
          f"adaptive_softmax/cutoff_{i}/b",
          sd["crit.out_layers.0.bias"][bounds[i] : bounds[i + 1]]
          if hp["div_val"] == 1
          else sd[f"crit.out_layers.{i}.bias"],
      )
      if not hp["tie_projs"][i] and f"crit.out_projs.{i}" in sd:
        put(f"adaptive_softmax/cutoff_{i}/proj", sd[f"crit.out_projs.{i}"].T)
    put("adaptive_softmax/cutoff_0/cluster_W", sd["crit.cluster_weight"])
    put("adaptive_softmax/cutoff_0/cluster_b", sd["crit.cluster_bias"])
  for name in list(out)[:3]:
    out[name + "/Adam"] = np.zeros_like(out[name])
    out[name + "/Adam_1"] = np.zeros_like(out[name])
  out["global_step"] = np.asarray(1000, np.int64)
  return out


def write_tf_checkpoint(variables: dict, directory: Path) -> str:
  """A TF1 checkpoint (tf.compat.v1 Saver, as the reference's TF code writes)."""
  tf = pytest.importorskip("tensorflow", reason=TF_REASON)
  graph = tf.Graph()
  with graph.as_default():
    tf_vars = [tf.compat.v1.Variable(v, name=k) for k, v in variables.items()]
    saver = tf.compat.v1.train.Saver(tf_vars)
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      return saver.save(sess, str(directory / "model.ckpt"), global_step=0)
