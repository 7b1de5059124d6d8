"""transformer_xl.convert and ``.safetensors`` files: the round trip
workdir -> ``--to=safetensors`` -> ``--from=safetensors`` -> workdir, the
HuggingFace layout loaded by ``TransfoXLLMHeadModel``, the dtypes read, and
bad files and flags as one ``error:`` line of the command line.

The command line runs in process (``convert.__main__.main``): a user error is
a SystemExit whose message is the ``error: ...`` line.  The helpers (random
HuggingFace models, segment-by-segment NLL) are hf_reference.py's, the
workdir ones helpers.py's.
"""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import safetensors  # noqa: E402  (transformers' dependency, as the test extra installs it)
import safetensors.numpy  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402  (test extra: missing is an error, not a skip)

from transformer_xl import convert  # noqa: E402
from transformer_xl.convert.__main__ import main  # noqa: E402
from transformer_xl.run import run_dir  # noqa: E402
from transformer_xl.run import workdir as wd  # noqa: E402

from helpers import restored, write_json  # noqa: E402
from hf_reference import BASE, hf_model, hf_segments, hparams, random_tokens, state_dict  # noqa: E402


def cli(*args: str) -> None:
  """``python -m transformer_xl.convert ARGS``, in process; it must succeed."""
  main(["transformer_xl.convert", *args])


def cli_error(*args: str) -> str:
  """The one ``error: ...`` line of a command that must fail."""
  with pytest.raises(SystemExit) as exc:
    main(["transformer_xl.convert", *args])
  message = exc.value.code
  assert isinstance(message, str), message  # a message, not a bare status
  assert message.startswith("error: ") and "\n" not in message, message
  return message


def ours_in_a_workdir(case: str, directory, seed: int, **extra):
  """(hp, cfg, the HF model, our params, a workdir written from them)."""
  hp = hparams(case, **extra)
  cfg = convert.model_config_from_hparams(hp)
  model = hf_model(hp, seed=seed)
  params = convert.params_from_state_dict(state_dict(model), cfg)  # float32 numpy
  convert.write_workdir(str(directory), params, cfg)
  return hp, cfg, model, params, directory


def read_safetensors(path) -> tuple[dict, dict, dict]:
  """(name -> array, name -> safetensors dtype code, metadata) of a file."""
  with safetensors.safe_open(str(path), framework="numpy") as f:
    return (
        {k: f.get_tensor(k) for k in f.keys()},
        {k: f.get_slice(k).get_dtype() for k in f.keys()},
        f.metadata(),
    )


# ---------------------------------------------------------------------------
# Round trip and the files written
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,extra",
    [
        ("adaptive_div4_tied", {}),  # adaptive softmax, div_val 4, tied
        ("adaptive_div1_untied", {"untie_r": True}),  # per-layer u, v
    ],
)
def test_round_trip_through_safetensors_is_bit_exact(case, extra, tmp_path):
  _, cfg, _, params, ours = ours_in_a_workdir(case, tmp_path / "ours", seed=61, **extra)
  out = tmp_path / "model.safetensors"
  cli("--to=safetensors", f"--workdir={ours}", f"--checkpoint={out}")
  assert (tmp_path / "model.hparams.json").is_file()
  # The file: float32 tensors with the reference names, HF's metadata, the .npz export's tensors.
  tensors, dtypes, metadata = read_safetensors(out)
  assert metadata == {"format": "pt"}
  assert set(dtypes.values()) == {"F32"}
  assert not any(k.startswith("transformer.") for k in tensors)
  cli("--to=pytorch", f"--workdir={ours}", f"--checkpoint={tmp_path / 'model.npz'}")
  with np.load(tmp_path / "model.npz") as npz:
    exported = {k: npz[k] for k in npz.files}
  assert set(tensors) == set(exported)
  for k, v in exported.items():
    assert tensors[k].dtype == v.dtype == np.float32, k
    np.testing.assert_array_equal(tensors[k], v, err_msg=k)
  # --to=pytorch writes a .safetensors name as safetensors: the same bytes.
  cli("--to=pytorch", f"--workdir={ours}", f"--checkpoint={tmp_path / 'same.safetensors'}")
  assert (tmp_path / "same.safetensors").read_bytes() == out.read_bytes()
  # Back into a workdir: every parameter bit-identical, the same model config.
  back = tmp_path / "back"
  cli(
      "--from=safetensors",
      f"--checkpoint={out}",
      f"--hparams={tmp_path / 'model.hparams.json'}",
      f"--workdir={back}",
  )
  _, cfg_back, _, step, got = restored(back)
  assert step == 0 and cfg_back == restored(ours)[1]
  assert set(convert.flatten_params(got)) == set(convert.flatten_params(params))
  for k, v in convert.flatten_params(params).items():
    assert convert.flatten_params(got)[k].dtype == np.float32, k
    np.testing.assert_array_equal(convert.flatten_params(got)[k], v, err_msg=k)


def test_hf_layout_loads_strictly_into_huggingface(tmp_path):
  """``--to=safetensors --layout=hf``: ``TransfoXLLMHeadModel`` loads the file
  with ``strict=True`` (and with ``from_pretrained``, which needs the
  metadata's format) and computes the NLL of the model it came from."""
  from transformers import TransfoXLLMHeadModel

  hp, _, source, _, ours = ours_in_a_workdir("adaptive_div4_tied", tmp_path / "ours", seed=62)
  out = tmp_path / "model.safetensors"
  cli("--to=safetensors", f"--workdir={ours}", f"--checkpoint={out}", "--layout=hf")
  loaded = safetensors.torch.load_file(str(out))
  assert set(loaded) == set(source.state_dict())
  assert all(v.dtype == torch.float32 for v in loaded.values())
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fresh = TransfoXLLMHeadModel(source.config).eval()
  fresh.load_state_dict(loaded, strict=True)
  tokens = random_tokens(hp["n_token"], 2 * hp["tgt_len"] + 1, seed=63)
  want = hf_segments(source, hp, tokens, hp["tgt_len"])[0]
  np.testing.assert_array_equal(hf_segments(fresh, hp, tokens, hp["tgt_len"])[0], want)
  # The file as HuggingFace shares models: model.safetensors beside config.json.
  source.config.save_pretrained(str(tmp_path / "hf"))
  shutil.copy(out, tmp_path / "hf" / "model.safetensors")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    shared = TransfoXLLMHeadModel.from_pretrained(
        str(tmp_path / "hf"), local_files_only=True
    ).eval()
  np.testing.assert_array_equal(hf_segments(shared, hp, tokens, hp["tgt_len"])[0], want)


def test_reading_widens_floats_to_float32_and_refuses_other_types(tmp_path):
  values = torch.tensor([1.5, -2.25, 3.0])
  path = tmp_path / "mixed.safetensors"
  safetensors.torch.save_file(
      {
          "bf16": values.bfloat16(),
          "f16": values.half(),
          "f64": values.double(),
          "i64": torch.arange(3),
      },
      str(path),
  )
  got = convert.read_state_dict(str(path))
  assert {k: v.dtype for k, v in got.items()} == {
      "bf16": np.float32,
      "f16": np.float32,
      "f64": np.float32,
      "i64": np.int64,
  }
  for k in ("bf16", "f16", "f64"):  # exact in every one of these types
    np.testing.assert_array_equal(got[k], values.numpy(), err_msg=k)
  for name, tensor, expected in [
      (
          "complex",
          values.to(torch.complex64),
          "tensor 'w' has dtype complex64, not a real number type",
      ),
      ("bool", values > 0, "tensor 'w' has dtype bool, not a real number type"),
      (
          "float8",
          values.to(torch.float8_e4m3fn),
          "tensor 'w' has dtype F8_E4M3, which numpy cannot hold",
      ),
  ]:
    bad = tmp_path / f"{name}.safetensors"
    safetensors.torch.save_file({"w": tensor}, str(bad))
    with pytest.raises(convert.ConvertError) as err:
      convert.read_state_dict(str(bad))
    assert str(bad) in str(err.value) and expected in str(err.value), str(err.value)
  safetensors.numpy.save_file({}, str(tmp_path / "none.safetensors"))
  with pytest.raises(convert.ConvertError, match="holds no tensors"):
    convert.read_state_dict(str(tmp_path / "none.safetensors"))
  with pytest.raises(convert.ConvertError, match="cannot write .*as safetensors"):
    convert.save_state_dict({"w": np.array(["0.5"])}, str(tmp_path / "text.safetensors"))


# ---------------------------------------------------------------------------
# Bad files and flags: one "error:" line, nothing written
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_safetensors(tmp_path_factory):
  """(directory, BASE's hparams.json, a matching .safetensors file, its bytes):
  zero tensors from the expected shapes (no HuggingFace model)."""
  root = tmp_path_factory.mktemp("safetensors_inputs")
  cfg = convert.model_config_from_hparams(convert.load_hparams(BASE))
  params = convert.unflatten_params(
      {p: np.zeros(s, np.float32) for p, s in convert.expected_param_shapes(cfg).items()}
  )
  good = root / "good.safetensors"
  convert.save_state_dict(convert.state_dict_from_params(params, cfg), str(good))
  return root, write_json(root / "hparams.json", BASE), good, good.read_bytes()


# name -> (writer of the bad file from the good bytes, what the message says).
BAD_FILES = {
    "empty": (lambda good: b"", "is empty (0 bytes)"),
    "cut in the header": (
        lambda good: good[:40],
        "is truncated, damaged or not a safetensors file (SafetensorError",
    ),
    "cut at half": (
        lambda good: good[: len(good) // 2],
        "is truncated, damaged or not a safetensors file (SafetensorError",
    ),
    "cut 3 bytes short": (
        lambda good: good[:-3],
        "is truncated, damaged or not a safetensors file (SafetensorError",
    ),
    "random bytes": (
        lambda good: np.random.default_rng(71).bytes(4096),
        "is truncated, damaged or not a safetensors file (SafetensorError",
    ),
}


@pytest.mark.parametrize("source", ["safetensors", "pytorch"])  # pytorch: by the extension
@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_safetensors_file_is_one_error_line(case, source, good_safetensors, tmp_path, capsys):
  _, hparams_json, _, good = good_safetensors
  make, expected = BAD_FILES[case]
  bad = tmp_path / "model.safetensors"
  bad.write_bytes(make(good))
  workdir = tmp_path / "wd"
  message = cli_error(
      f"--from={source}", f"--checkpoint={bad}", f"--hparams={hparams_json}", f"--workdir={workdir}"
  )
  assert str(bad) in message and expected in message, message
  assert "; " in message, message  # "<what is wrong>; <what to do>"
  assert "Traceback" not in capsys.readouterr().err
  assert not workdir.exists()


def test_a_misnamed_file_says_which_format_it_is(good_safetensors, tmp_path):
  root, hparams_json, good_path, good = good_safetensors
  np.savez(tmp_path / "an.npz", w=np.zeros(3, np.float32))
  shutil.copy(tmp_path / "an.npz", tmp_path / "npz.safetensors")
  for name, expected in [
      (
          "npz.safetensors",
          "is a zip archive (an .npz or torch file), not a "
          "safetensors file; give it a .npz or .pt name",
      ),
      ("st.pt", "is a safetensors file, not a torch file; give it a .safetensors name"),
      ("st.npz", "is a safetensors file, not an .npz archive; give it a .safetensors name"),
  ]:
    if not (tmp_path / name).exists():
      (tmp_path / name).write_bytes(good)
    message = cli_error(
        "--from=pytorch",
        f"--checkpoint={tmp_path / name}",
        f"--hparams={hparams_json}",
        f"--workdir={tmp_path / 'wd'}",
    )
    assert f"{tmp_path / name} {expected}" in message, message
  assert not (tmp_path / "wd").exists()


def test_mismatched_extensions_are_refused_before_any_work(tmp_path, monkeypatch):
  """--to=safetensors needs a .safetensors output, refused before the
  workdir is read (here a directory whose reading fails the test);
  --from=safetensors a .safetensors input, before the hparams are read."""

  def never(*args, **kwargs):
    raise AssertionError("the workdir was read before the extension was checked")

  for name in ("load_config", "load_model_config"):
    monkeypatch.setattr(wd, name, never)
  monkeypatch.setattr(run_dir, "restore_params", never)
  (tmp_path / "wd").mkdir()
  for out in ("out.pt", "out.npz", "out"):
    message = cli_error(
        "--to=safetensors", f"--workdir={tmp_path / 'wd'}", f"--checkpoint={tmp_path / out}"
    )
    assert (
        f"--to=safetensors writes a .safetensors file but --checkpoint={tmp_path / out} "
        f"has another extension; name it {tmp_path / 'out.safetensors'}"
    ) in message, message
    assert not (tmp_path / out).exists()
  assert not (tmp_path / "out.hparams.json").exists()
  message = cli_error(
      "--from=safetensors",
      f"--checkpoint={tmp_path / 'sd.npz'}",
      f"--hparams={tmp_path / 'missing.json'}",
      f"--workdir={tmp_path / 'new'}",
  )
  assert (
      f"--from=safetensors reads a .safetensors file but --checkpoint={tmp_path / 'sd.npz'} "
      "has another extension; pass the .safetensors file, or use --from=pytorch"
  ) in message
  assert not (tmp_path / "new").exists()
