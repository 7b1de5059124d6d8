"""Our parameters <-> state dicts with the reference PyTorch names, and their files.

A state dict holds the reference ``MemTransformerLM``'s names (reference
``mem_transformer.py``) or HuggingFace's ``TransfoXLLMHeadModel``'s (the same
under a ``transformer.`` prefix, except ``crit.*``); the names and layouts are
those of ``transformer_xl.convert.names.NAME_TABLE``.  Files are ``.npz``
archives, ``.safetensors`` files or torch files of tensors, told apart by the
extension (``state_dict_format``); only torch files involve pickle, which
``torch.load(weights_only=True)`` restricts to tensors.  torch and
safetensors are imported only to read or write their files.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.hparams import expected_param_shapes
from transformer_xl.convert.names import (
    HF_PREFIX,
    INV_FREQ,
    aliases,
    flatten_params,
    pytorch_name,
    pytorch_shape,
    resolve_cluster_order,
    row_for,
    strip_hf_prefix,
    to_ours,
    to_pytorch,
    unflatten_params,
)
from transformer_xl.util import files

# What to check when a state dict's shapes do not fit the hparams.
_SIZES_HINT = (
    "check n_layer, n_head, d_model, d_head, d_inner, d_embed, div_val, cutoffs and "
    "n_token in the hparams"
)


def inv_freq(d_model: int) -> np.ndarray:
  """The reference's ``pos_emb.inv_freq`` buffer, float32 [d_model // 2].

  ``1 / 10000 ** (arange(0, d_model, 2) / d_model)``, computed in float32
  as torch does.
  """
  try:
    import torch

    return (1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))).numpy()
  except ImportError:
    x = np.arange(0.0, d_model, 2.0, dtype=np.float32) / np.float32(d_model)
    return (np.float32(1) / (np.float32(10000) ** x)).astype(np.float32)


def finite(name: str, value: Any) -> np.ndarray:
  """``value`` as float32, every entry finite: the check of every tensor a
  converter reads (the reference's, the memory tokens', ARMT's).

  Raises:
    ConvertError: ``name`` holds NaN or infinite values (how many).
  """
  a = np.asarray(value, np.float32)
  bad = int(a.size - np.count_nonzero(np.isfinite(a)))
  if bad:
    raise ConvertError(
        f"{name} holds {bad} NaN or infinite values (of {a.size}); the model "
        "cannot be evaluated or trained from them: convert a checkpoint saved "
        "before its training diverged."
    )
  return a


def params_from_state_dict(state: Mapping[str, Any], cfg, cluster_order: str = "auto") -> dict:
  """Our parameter tree from a state dict with the reference PyTorch names.

  Args:
    state: name -> array (numpy or anything ``np.asarray`` takes); the
      reference names of ``NAME_TABLE``, optionally with HuggingFace's
      ``transformer.`` prefix.  Copies of tied tensors (``names.aliases``)
      and ``pos_emb.inv_freq`` may be present and are checked.
    cfg: the ``models.ModelConfig`` the tensors belong to.
    cluster_order: "reference" (tail cluster i in head column -i), "forward"
      (column cutoffs[0] + i - 1: TF, HuggingFace 4.35; the rows of
      cluster_weight/cluster_bias are reversed) or "auto"
      (``resolve_cluster_order``).

  Returns:
    Nested dict of float32 numpy arrays, the structure of the model's
    ``params`` (layer parameters stacked on a leading [n_layer] axis).

  Raises:
    ConvertError: a missing tensor, an unknown name, a shape that does not
      match the hparams (naming the tensor, expected and actual shapes), a
      parameter that is not of a floating-point type (integers, which a
      .safetensors header can also claim for float data) or holds NaN or
      inf, or tied copies that differ.
  """
  order = resolve_cluster_order(cluster_order, list(state))
  state, _ = strip_hf_prefix({k: v for k, v in state.items()})
  used = set()

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in state:
      hint = "check the hparams (e.g. untie_r, cutoffs, div_val, d_embed, tie_weight)"
      bias = name.rsplit(".", 1)[-1]
      if bias in ("r_w_bias", "r_r_bias"):
        if not cfg.untie_r and f"layers.0.dec_attn.{bias}" in state:
          hint = "the state dict has per-layer u, v: set untie_r=true"
        elif cfg.untie_r and bias in state:
          hint = "the state dict has shared u, v: set untie_r=false"
      raise ConvertError(f"state dict lacks {name!r} (expected shape {shape}); {hint}.")
    a = np.asarray(state[name])
    if tuple(a.shape) != tuple(shape):
      raise ConvertError(
          f"{name}: expected shape {tuple(shape)} from the hparams, got "
          f"{tuple(a.shape)}; the state dict and the hparams describe different "
          f"models: {_SIZES_HINT}."
      )
    if a.dtype.kind != "f":  # integers would become parameters of nonsense values
      raise ConvertError(
          f"{name} has dtype {a.dtype}, not a floating-point type: a parameter stored as "
          "integers (or float data labelled as integers) cannot be converted; save the "
          "model's float tensors (float32, float16 or bfloat16)."
      )
    used.add(name)
    return finite(name, a)

  flat = {}
  for path, shape in expected_param_shapes(cfg).items():
    row, i = row_for(path)
    if row.kind == "stacked":
      flat[path] = take(pytorch_name(row, i), tuple(shape))
    elif path.startswith("layers/"):
      per_layer = tuple(shape[1:])
      flat[path] = np.stack(
          [
              to_ours(
                  row.kind,
                  take(pytorch_name(row, i, l), pytorch_shape(row.kind, per_layer)),
                  per_layer,
              )
              for l in range(shape[0])
          ]
      )
    else:
      flat[path] = to_ours(
          row.kind, take(pytorch_name(row, i), pytorch_shape(row.kind, shape)), shape
      )
    if row.kind == "clusters" and order == "forward":
      flat[path] = flat[path][::-1].copy()
  for copy, source in aliases(cfg, "hf"):
    if copy in state:
      if source not in state:
        raise ConvertError(f"state dict has {copy!r} but not {source!r}.")
      a, b = np.asarray(state[copy]), np.asarray(state[source])
      if a.shape != b.shape or not np.array_equal(a, b):
        raise ConvertError(
            f"{copy} should be tied to {source} (hparams: tie_weight={cfg.tie_weight}, "
            f"tie_projs={list(cfg.tie_projs)}, untie_r={cfg.untie_r}) but differs "
            f"(shapes {a.shape} and {b.shape}); fix the hparams."
        )
      used.add(copy)
  if INV_FREQ in state and cfg.attn_type in (0, 2):  # types 1 and 3 have no sinusoid
    got = np.asarray(state[INV_FREQ])
    if got.shape != (cfg.d_model // 2,):
      raise ConvertError(
          f"{INV_FREQ}: expected shape ({cfg.d_model // 2},) for d_model="
          f"{cfg.d_model}, got {got.shape}; check d_model in the hparams."
      )
    used.add(INV_FREQ)
  unknown = sorted(set(state) - used)
  if unknown:
    raise ConvertError(
        f"state dict has tensors the hparams do not account for: {unknown[:20]}"
        f"{' ...' if len(unknown) > 20 else ''} (check untie_r, tie_weight, "
        "tie_projs, cutoffs, div_val, d_embed, n_layer)."
    )
  return unflatten_params(flat)


def state_dict_from_params(
    params: Mapping[str, Any], cfg, layout: str = "reference", cluster_order: str = "auto"
) -> dict[str, np.ndarray]:
  """The state dict of our parameters with the reference PyTorch names.

  Args:
    params: our parameter tree (nested dicts of arrays).
    cfg: its ``models.ModelConfig``.
    layout: "reference" (the names of the reference's ``MemTransformerLM``:
      no prefix, shared u, v once) or "hf" (``TransfoXLLMHeadModel``:
      ``transformer.`` prefix except ``crit.*``, shared u, v repeated under
      every layer; attn_type 0 only).  Both include the copies of tied
      tensors and (attn_type 0 and 2) ``pos_emb.inv_freq``, so
      ``load_state_dict`` (strict) accepts them.
    cluster_order: "reference", "forward" or "auto" (forward for "hf",
      which makes HuggingFace 4.35 compute what this model computes).

  Returns:
    name -> float32 numpy array, PyTorch layouts.

  Raises:
    ConvertError: unknown layout / cluster_order, layout "hf" for an
      attn_type other than 0, or params that do not match cfg.
  """
  if layout not in ("reference", "hf"):
    raise ConvertError(f"layout={layout!r}: use reference or hf.")
  if layout == "hf" and cfg.attn_type != 0:
    raise ConvertError(
        f"layout=hf: HuggingFace's TransfoXLLMHeadModel has attn_type 0 only "
        f"(this model has {cfg.attn_type}); use layout=reference."
    )
  order = (
      ("forward" if layout == "hf" else "reference")
      if cluster_order == "auto"
      else resolve_cluster_order(cluster_order, [])
  )
  flat = flatten_params(params)
  expected = expected_param_shapes(cfg)
  if set(flat) != set(expected):
    raise ConvertError(
        f"params do not match the model config: missing "
        f"{sorted(set(expected) - set(flat))}, unexpected "
        f"{sorted(set(flat) - set(expected))}."
    )
  out = {}
  for path, shape in expected.items():
    a = np.asarray(flat[path], np.float32)
    if tuple(a.shape) != tuple(shape):
      raise ConvertError(f"params/{path}: expected shape {shape}, got {a.shape}.")
    row, i = row_for(path)
    if row.kind == "clusters" and order == "forward":
      a = a[::-1]
    if row.kind == "stacked":
      out[pytorch_name(row, i)] = np.array(a, copy=True)
    elif path.startswith("layers/"):
      for l in range(shape[0]):
        out[pytorch_name(row, i, l)] = to_pytorch(row.kind, a[l])
    else:
      out[pytorch_name(row, i)] = to_pytorch(row.kind, a)
  for copy, source in aliases(cfg, layout):
    out[copy] = out[source].copy()
  if cfg.attn_type in (0, 2):  # the sinusoid's buffer (reference PositionalEmbedding)
    out[INV_FREQ] = inv_freq(cfg.d_model)
  if layout == "hf":
    out = {(k if k.startswith("crit.") else HF_PREFIX + k): v for k, v in out.items()}
  return out


def state_dict_format(path: str) -> str:
  """The format of a state dict file, by its extension (any case): "npz"
  (``.npz``), "safetensors" (``.safetensors``) or "torch" (anything else:
  ``.pt``, ``.bin``, ...)."""
  lower = str(path).lower()
  if lower.endswith(".npz"):
    return "npz"
  return "safetensors" if lower.endswith(".safetensors") else "torch"


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads a state dict: a ``.npz`` of arrays, a ``.safetensors`` file, or a torch file.

  The format is the extension's (``state_dict_format``).  ``.npz``
  files are read without pickles (``allow_pickle=False``): every member
  must be a ``.npy`` array of numbers.  ``.safetensors`` files (HuggingFace's
  pickle-free format: an 8-byte header length, a JSON header of names,
  dtypes, shapes and offsets, then the raw data) are read with
  ``safetensors.safe_open(path, framework="numpy")``; bfloat16 and float16
  tensors are widened to float32, float8 tensors are refused.  Torch files
  are loaded with ``torch.load(..., map_location="cpu", weights_only=True)``:
  a dict name -> tensor (a ``{"state_dict": {...}}`` or
  ``{"model_state_dict": {...}}`` wrapper is unwrapped).  The reference
  ``train.py`` saves the whole module (``torch.save(model)``); save its
  ``model.state_dict()`` instead.

  Returns:
    name -> numpy array (floating tensors as float32).

  Raises:
    ConvertError: a missing, empty, truncated or damaged file; an ``.npz``
      that is not a zip of ``.npy`` arrays or holds object arrays; a
      ``.safetensors`` file whose header or size is wrong, or safetensors
      not installed; a torch file that holds pickled objects or is not a
      flat dict of tensors; no tensors; a tensor that is not of a real
      number type.  The message names the file (and the tensor) and what
      to do.
  """
  if not os.path.exists(path):
    raise ConvertError(
        f"checkpoint {path} does not exist; pass the state dict file (.npz, "
        ".safetensors or torch) with --checkpoint."
    )
  if os.path.isdir(path):
    raise ConvertError(
        f"checkpoint {path} is a directory; pass the state dict file (.npz, "
        ".safetensors or torch) with --checkpoint (a TF checkpoint needs "
        "--from=tf)."
    )
  try:
    size = os.path.getsize(path)
    with open(path, "rb"):
      pass
  except OSError as err:
    raise ConvertError(
        f"cannot read the checkpoint {path} ({describe(err)}); check the path "
        "and its permissions."
    ) from None
  if size == 0:
    raise ConvertError(
        f"checkpoint {path} is empty (0 bytes); copy it again or save the state dict again."
    )
  state = {"npz": _read_npz, "safetensors": _read_safetensors, "torch": _read_torch}[
      state_dict_format(path)
  ](path)
  if not state:
    raise ConvertError(f"checkpoint {path} holds no tensors; pass the model's state dict.")
  for name, a in state.items():
    if a.dtype.kind not in "fiu":
      raise ConvertError(
          f"checkpoint {path}: tensor {name!r} has dtype {a.dtype}, not a real "
          "number type; a state dict holds the model's float tensors: save "
          "them as float32."
      )
  return state


_NPZ_FIX = "save the state dict with numpy.savez(path, **{name: float32 array})"


def _read_npz(path: str) -> dict[str, np.ndarray]:
  """The arrays of an ``.npz`` (see ``read_state_dict``); ConvertError if unreadable."""
  if not zipfile.is_zipfile(path):
    with open(path, "rb") as f:
      head = f.read(6)
    if head.startswith(b"\x93NUMPY"):
      what = "is a single .npy array, not an .npz archive of named arrays"
    elif head.startswith(b"PK"):
      what = "is truncated or damaged (a zip archive without its directory)"
    elif _looks_like_safetensors(path):
      raise ConvertError(
          f"checkpoint {path} is a safetensors file, not an .npz archive; give "
          "it a .safetensors name."
      )
    else:
      what = "is not an .npz archive (not a zip file)"
    raise ConvertError(f"checkpoint {path} {what}; copy it again, or {_NPZ_FIX}.")
  try:
    archive = np.load(path, allow_pickle=False)
  except Exception as err:  # zipfile and numpy raise several types for damaged archives
    raise ConvertError(
        f"checkpoint {path} is not a readable .npz archive ({describe(err)}); "
        f"copy it again, or {_NPZ_FIX}."
    ) from None
  with archive:
    members = archive.zip.namelist()
    others = [m for m in members if not m.endswith(".npy")]
    if others:
      hint = (
          " (it looks like a torch file: give it a .pt or .bin name)"
          if any(m.endswith("data.pkl") for m in others)
          else ""
      )
      raise ConvertError(
          f"checkpoint {path} is not an .npz of arrays: member {others[0]!r} is "
          f"not a .npy array{hint}; {_NPZ_FIX}."
      )
    state = {}
    for name in archive.files:
      try:
        state[name] = _as_float32(archive[name])
      except ValueError as err:
        if "object" in str(err).lower():
          raise ConvertError(
              f"checkpoint {path}: array {name!r} holds Python objects "
              f"(dtype=object), which are not loaded (no pickles); {_NPZ_FIX}."
          ) from None
        raise ConvertError(
            f"checkpoint {path}: array {name!r} is damaged ({describe(err)}); "
            f"copy the file again, or {_NPZ_FIX}."
        ) from None
      except Exception as err:  # zipfile, zlib and numpy raise several types for damaged members
        raise ConvertError(
            f"checkpoint {path}: array {name!r} is damaged ({describe(err)}); "
            f"copy the file again, or {_NPZ_FIX}."
        ) from None
  return state


def _read_torch(path: str) -> dict[str, np.ndarray]:
  """The tensors of a torch file (see ``read_state_dict``); ConvertError if unreadable."""
  try:
    import torch
  except ImportError:
    raise ConvertError(
        f"reading the torch file {path} needs torch installed (or pass a .npz "
        "of the state dict)."
    ) from None
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as err:  # torch raises several types for bad files
    if _looks_like_safetensors(path):
      raise ConvertError(
          f"checkpoint {path} is a safetensors file, not a torch file; give it "
          "a .safetensors name."
      ) from None
    with open(path, "rb") as f:  # torch's files: a zip archive, or (legacy) a pickle
      torch_like = zipfile.is_zipfile(path) or f.read(1) == b"\x80"  # pickle's PROTO
    if torch_like and "weights only load failed" in str(err).lower():
      raise ConvertError(
          f"checkpoint {path} holds pickled Python objects besides tensors (e.g. "
          "a whole module, as the reference train.py saves), which are not "
          "loaded (weights_only=True); save the state dict instead: "
          "torch.save(model.state_dict(), path)."
      ) from None
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z:
        names = z.namelist()
      if names and all(n.endswith(".npy") for n in names):
        raise ConvertError(
            f"checkpoint {path} is an .npz archive, not a torch file; give it a .npz name."
        ) from None
    raise ConvertError(
        f"checkpoint {path} is damaged or not a torch file ({describe(err)}); "
        "copy it again, or save the state dict with torch.save("
        "model.state_dict(), path) or as a .npz."
    ) from None
  for key in ("state_dict", "model_state_dict"):
    if isinstance(obj, dict) and set(obj) == {key}:
      obj = obj[key]
  if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
    keys = f" (its keys: {list(obj)[:5]})" if isinstance(obj, Mapping) else ""
    raise ConvertError(
        f"checkpoint {path} is not a state dict (a flat dict name -> tensor)"
        f"{keys}; save model.state_dict() with torch.save."
    )
  state = {}
  for k, v in obj.items():
    try:
      state[str(k)] = _as_float32(
          v.detach().cpu().float().numpy() if v.is_floating_point() else v.detach().cpu().numpy()
      )
    except Exception as err:  # quantized, sparse, meta tensors and the like
      raise ConvertError(
          f"checkpoint {path}: tensor {k!r} cannot be read as an array "
          f"({describe(err)}); save the model's dense float tensors."
      ) from None
  return state


_SAFETENSORS_FIX = (
    "save the state dict with safetensors.torch.save_file(model.state_dict(), "
    "path) or safetensors.numpy.save_file({name: float32 array}, path)"
)


def _looks_like_safetensors(path: str) -> bool:
  """Whether the file starts as a safetensors file does: an 8-byte
  little-endian header length that fits the file, then ``{``."""
  try:
    with open(path, "rb") as f:
      head = f.read(9)
    size = os.path.getsize(path)
  except OSError:
    return False
  return len(head) == 9 and head[8:] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The tensors of a ``.safetensors`` file (see ``read_state_dict``);
  ConvertError if unreadable.  safetensors checks the header (its length,
  JSON, dtypes, shapes, offsets) and that the data fills the file exactly
  when it opens the file, so a truncated or padded file fails there."""
  try:
    import safetensors
  except ImportError:
    raise ConvertError(
        f"reading the safetensors file {path} needs the safetensors package "
        "(pip install safetensors), or pass a .npz of the state dict."
    ) from None
  try:
    import ml_dtypes  # noqa: F401  (a jax dependency: numpy's bfloat16, so BF16 tensors load)
  except ImportError:
    pass
  try:
    handle = safetensors.safe_open(path, framework="numpy")
  except Exception as err:  # SafetensorError (header, size) and, for odd files, others
    if zipfile.is_zipfile(path):
      raise ConvertError(
          f"checkpoint {path} is a zip archive (an .npz or torch file), not a "
          "safetensors file; give it a .npz or .pt name."
      ) from None
    raise ConvertError(
        f"checkpoint {path} is truncated, damaged or not a safetensors file "
        f"({describe(err)}); copy it again, or {_SAFETENSORS_FIX}."
    ) from None
  state = {}
  with handle as f:
    for name in f.keys():
      dtype = f.get_slice(name).get_dtype()  # safetensors' codes: F32, BF16, I64, BOOL, ...
      try:
        a = np.asarray(f.get_tensor(name))
      except Exception as err:  # a dtype numpy lacks (float8, float4)
        raise ConvertError(
            f"checkpoint {path}: tensor {name!r} has dtype {dtype}, which numpy "
            f"cannot hold ({describe(err)}); save the model's float tensors as "
            "float32, float16 or bfloat16."
        ) from None
      # F16/F32/F64 and BF16 (ml_dtypes' bfloat16, which numpy does not count as floating).
      state[name] = a.astype(np.float32) if dtype.startswith(("F", "BF")) else a
  return state


def _as_float32(a: np.ndarray) -> np.ndarray:
  a = np.asarray(a)
  return a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a


# The metadata HuggingFace's tools expect in a .safetensors file of torch
# tensors (transformers' from_pretrained refuses one without a "format").
SAFETENSORS_METADATA = {"format": "pt"}


def save_state_dict(state: Mapping[str, np.ndarray], path: str) -> None:
  """Writes a state dict in the format of ``path``'s extension (``state_dict_format``).

  ``.npz``: ``numpy.savez``.  ``.safetensors``: ``safetensors.numpy.save_file``
  with the metadata ``SAFETENSORS_METADATA`` (``{"format": "pt"}``), each
  tensor C-contiguous and of the state dict's dtype (float32 for the
  parameters of ``state_dict_from_params``), which
  ``safetensors.torch.load_file`` and transformers' ``from_pretrained`` read.
  Otherwise a torch file of tensors (``torch.save``).  The file is written
  under a temporary name beside ``path`` (``util.files.temporary_name``) and
  renamed to it when complete, so a file already at ``path`` is replaced
  whole or not at all (whether it may be replaced is the caller's decision:
  ``export_pytorch``'s ``overwrite``).

  Raises:
    ConvertError: a torch or safetensors file was asked for but its package
      is not installed, or a tensor's dtype that safetensors cannot store.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fmt = state_dict_format(path)
  writers = {"npz": _write_npz, "safetensors": _write_safetensors, "torch": _write_torch}
  tmp = str(files.temporary_name(path))
  try:
    writers[fmt](state, tmp, path)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def _write_npz(state: Mapping[str, np.ndarray], tmp: str, path: str) -> None:
  del path
  with open(tmp, "wb") as f:  # a file object: numpy appends ".npz" to other names
    np.savez(f, **{k: np.asarray(v) for k, v in state.items()})


def _write_safetensors(state: Mapping[str, np.ndarray], tmp: str, path: str) -> None:
  try:
    import safetensors
    import safetensors.numpy
  except ImportError:
    raise ConvertError(
        f"writing the safetensors file {path} needs the safetensors package "
        "(pip install safetensors); or use a .npz path."
    ) from None
  arrays = {k: np.asarray(v, order="C") for k, v in state.items()}
  try:
    safetensors.numpy.save_file(arrays, tmp, metadata=dict(SAFETENSORS_METADATA))
  except safetensors.SafetensorError as err:  # a dtype it cannot store (str, object, ...)
    raise ConvertError(
        f"cannot write {path} as safetensors ({describe(err)}); save the "
        "state dict's float tensors as float32, or use a .npz path."
    ) from None


def _write_torch(state: Mapping[str, np.ndarray], tmp: str, path: str) -> None:
  try:
    import torch
  except ImportError:
    raise ConvertError(f"writing the torch file {path} needs torch; use a .npz path.") from None
  torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, tmp)
