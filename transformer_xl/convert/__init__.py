"""Checkpoint conversion between the reference implementation and this package.

    # reference PyTorch / HuggingFace state dict (.npz, .safetensors or torch file) -> workdir
    python -m transformer_xl.convert --from=pytorch --checkpoint=model.pt \\
        --hparams=hparams.json --workdir=/tmp/txl
    # the same from a .safetensors file (no pickle; --from=pytorch reads it too)
    python -m transformer_xl.convert --from=safetensors --checkpoint=model.safetensors \\
        --hparams=hparams.json --workdir=/tmp/txl
    # reference TensorFlow checkpoint (needs ``pip install ".[convert]"``) -> workdir
    python -m transformer_xl.convert --from=tf --checkpoint=tf_enwik8/model/model.ckpt-0 \\
        --hparams=hparams.json --workdir=/tmp/txl --vocab=vocab.txt --dataset=enwik8
    # workdir -> state dict with the reference names (and hparams.json)
    python -m transformer_xl.convert --to=pytorch --workdir=/tmp/txl --checkpoint=out.pt
    # workdir -> .safetensors with HuggingFace's TransfoXLLMHeadModel names, to share
    python -m transformer_xl.convert --to=safetensors --workdir=/tmp/txl \\
        --checkpoint=model.safetensors --layout=hf
    # a released model (enwik8, text8, wt103, lm1b, transfo-xl/transfo-xl-wt103):
    # downloaded, checked, cached, converted at the paper's evaluation settings
    python -m transformer_xl.convert --pretrained=wt103 --workdir=/tmp/wt103

The format of a state dict file is its extension's: ``.npz``, ``.safetensors``
or else a torch file, for ``--from=pytorch`` and ``--to=pytorch`` alike.
``--from=safetensors`` and ``--to=safetensors`` are these, but refuse a
``--checkpoint`` that does not end in ``.safetensors``.  A ``.safetensors``
export holds float32 tensors and the metadata ``{"format": "pt"}``, so
``safetensors.torch.load_file`` and transformers' ``from_pretrained`` (as
``model.safetensors`` beside the model's ``config.json``) read it.  An
export never replaces an existing ``--checkpoint`` (or an hparams file of
other hparams) without ``--overwrite``.

A converted workdir holds ``config.json``, ``model_config.json`` and an orbax
checkpoint of a full ``train_state.TrainState`` at step 0, so that
``python -m transformer_xl.main --workdir=DIR --mode=eval|score`` (and
``--mode=train`` with a ``--config`` of the same model, which fine-tunes
from step 0) load it like a trained run.

Sources of truth: the reference PyTorch code (Dai et al. 2019,
``pytorch/mem_transformer.py``, ``pytorch/utils/proj_adaptive_softmax.py``),
its TensorFlow code (``tf/model.py``, whose variable names the released
models use) and HuggingFace's port (``transformers`` 4.35,
``TransfoXLLMHeadModel``, the same names under a ``transformer.`` prefix).
Where HuggingFace and the reference differ, the reference is followed
(docs/guide/conversion.md).

``HPARAMS.json`` holds the reference constructor's arguments
(``MemTransformerLM(n_token, n_layer, n_head, d_model, d_head, d_inner,
dropout, dropatt, tie_weight, d_embed, div_val, tie_projs, pre_lnorm,
tgt_len, ext_len, mem_len, cutoffs, adapt_inp, same_length, attn_type,
clamp_len, sample_softmax)``) plus the TF flags ``untie_r``,
``proj_share_all_but_first`` and ``proj_same_dim``; see ``load_hparams``.

Where the sources differ (adaptive-softmax cluster order, tied names, the
TF checkpoints' LayerNorm epsilon, masks and initial memory, the
vocabularies) and what the converter does about it, and what it
guarantees (parity to 1e-5 with HuggingFace's port, bit-exact round
trips): docs/guide/conversion.md.

Modules, one role each.  The converter is off the training path (nothing
in training imports it); of the package, only ``workdir_io.py`` and
``export.py`` call ``default_config``, ``train_state``, ``workdir``,
``sharding`` and ``checkpointing``, to write and read workdirs:

* ``errors.py``: ``ConvertError`` and its one-line messages (the
  conversion's reports go through ``transformer_xl.util.report.log``);
* ``names.py``: ``NAME_TABLE`` (ours / reference PyTorch and HuggingFace /
  TF names, layout kinds), tied aliases, cluster order, ``flatten_params``
  / ``unflatten_params``;
* ``hparams.py``: ``load_hparams``, ``ModelConfig`` <-> reference
  constructor arguments, ``expected_param_shapes``;
* ``pytorch.py``: ``params_from_state_dict``, ``state_dict_from_params``,
  state dict files (.npz, .safetensors, torch);
* ``tf.py``: ``read_tf_checkpoint``, ``check_tf_checkpoint``,
  ``state_dict_from_tf``;
* ``vocab.py``: ``read_vocab``, ``dataset_vocab``, ``map_vocab``,
  ``remap_vocab``;
* ``workdir_io.py``: ``write_workdir``, ``convert_to_workdir``;
* ``export.py``: ``export_pytorch`` (a workdir back out);
* ``releases.py``: ``RELEASES``, the released models (the reference's
  and the Hugging Face Hub's), ``release``, ``dynamic_settings``;
* ``download.py``: a release's files from the cache or the manual dir,
  downloaded (``transformer_xl.data.download.fetch``), with the checksums
  recorded at a first download;
* ``hub.py``: the files and hparams of a release on the Hugging Face Hub;
* ``pretrained.py``: ``convert_release``, ``pretrained_workdir``
  (``--pretrained``, ``LanguageModel.from_pretrained``);
* ``safe_pickle.py``: the restricted unpickler of the released
  vocabularies;
* ``__main__.py``: the command line.
"""

from __future__ import annotations

from transformer_xl.convert.errors import ConvertError
from transformer_xl.convert.export import export_pytorch
from transformer_xl.convert.hparams import (
    OPTIONAL_HPARAMS,
    REQUIRED_HPARAMS,
    expected_param_shapes,
    hparams_from_model_config,
    load_hparams,
    model_config_from_hparams,
)
from transformer_xl.convert.names import (
    NAME_TABLE,
    Row,
    flatten_params,
    resolve_cluster_order,
    unflatten_params,
)
from transformer_xl.convert.pytorch import (
    SAFETENSORS_METADATA,
    inv_freq,
    params_from_state_dict,
    read_state_dict,
    save_state_dict,
    state_dict_format,
    state_dict_from_params,
)
from transformer_xl.convert.tf import read_tf_checkpoint, state_dict_from_tf
from transformer_xl.convert.vocab import (
    UNSEEN_BIAS,
    dataset_vocab,
    map_vocab,
    read_vocab,
    remap_vocab,
)
from transformer_xl.convert.workdir_io import convert_to_workdir, one_device_mesh, write_workdir

__all__ = [
    "ConvertError",
    "NAME_TABLE",
    "OPTIONAL_HPARAMS",
    "REQUIRED_HPARAMS",
    "Row",
    "SAFETENSORS_METADATA",
    "UNSEEN_BIAS",
    "convert_to_workdir",
    "dataset_vocab",
    "expected_param_shapes",
    "export_pytorch",
    "flatten_params",
    "hparams_from_model_config",
    "inv_freq",
    "load_hparams",
    "map_vocab",
    "model_config_from_hparams",
    "one_device_mesh",
    "params_from_state_dict",
    "read_state_dict",
    "read_tf_checkpoint",
    "read_vocab",
    "remap_vocab",
    "resolve_cluster_order",
    "save_state_dict",
    "state_dict_format",
    "state_dict_from_params",
    "state_dict_from_tf",
    "unflatten_params",
    "write_workdir",
]
