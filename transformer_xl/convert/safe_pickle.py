"""Restricted unpickling: the released vocabularies, read without running code.

The released Transformer-XL models ship their vocabulary only as a pickle:

* the reference implementation's ``data/cache.pkl`` (Dai et al. 2019,
  ``tf/data_utils.py``, ``get_lm_corpus``: ``pickle.dump(corpus, fp,
  protocol=2)`` of a ``Corpus`` whose ``vocab`` is a ``vocabulary.Vocab``
  with ``idx2sym``, ``sym2idx``, ``counter``, ...; ``train``/``valid``/``test``
  are numpy arrays of the encoded corpus, or, for lm1b, ``train`` is a list of
  file names).  ``tf/data_utils.py`` is run as a script, so the corpus is
  usually pickled as ``__main__.Corpus``; it may have been written by Python
  2 (text as byte strings) or Python 3.
* HuggingFace's ``vocab.pkl`` (``transformers`` 4.35 ``TransfoXLTokenizer``:
  ``save_vocabulary`` pickles the tokenizer's ``__dict__``, and
  ``__init__(pretrained_vocab_file=...)`` reads it back, or reads the older
  files that are a legacy ``torch.save`` of that dict).

``pickle.load`` calls whatever the file names, so a tampered file runs code.
``load_restricted`` instead uses ``RestrictedUnpickler``, whose
``find_class`` admits only the globals of ``ALLOWED_GLOBALS``:

* ``collections.OrderedDict`` and ``collections.Counter``, ``set`` and
  ``frozenset``, and safe stand-ins for ``bytes``, ``bytearray``,
  ``_codecs.encode`` (latin-1 only: how Python 3 pickles bytes with protocol
  2) and ``copyreg._reconstructor`` (protocols 0 and 1; placeholders only);
  plain lists, dicts, tuples, strings, numbers, booleans and ``None`` need no
  global.
* The reference's classes (``data_utils.Corpus``, ``__main__.Corpus``,
  ``vocabulary.Vocab``, the PyTorch code's ``utils.vocabulary.Vocab``) and
  HuggingFace's (``TransfoXLTokenizer`` and ``TransfoXLCorpus`` under their
  module names since ``pytorch_pretrained_bert``, and what a 4.35 tokenizer's
  ``__dict__`` holds: ``tokenization_utils.Trie``, ``AddedToken``, the
  ``sacremoses`` tokenizers and ``re._compile``) become ``Inert``
  placeholders: they record the arguments and the pickled state, and no
  method of the original class (or the original function) runs.
* numpy's array, dtype and scalar reconstruction (``numpy.core`` and numpy
  2's ``numpy._core`` module names) becomes ``InertArray``,
  ``InertDtype`` and ``InertScalar``, which drop the data (only
  the vocabulary is needed); numpy is never called.

Every other global (``os.system``, ``builtins.eval``, ``subprocess.Popen``,
``builtins.getattr``, ``torch._utils._rebuild_tensor_v2``, ...) and every
persistent id (a tensor of a ``torch.save`` file) is refused with a
``ConvertError`` naming the file and the global; nothing from the file
has run by then.  Python 2 byte strings stay ``bytes`` in the tree
(``encoding="bytes"``); ``attributes``, ``reference_corpus_vocab``
and ``hf_vocab`` decode names and symbols as UTF-8.
"""

from __future__ import annotations

import collections
import os
import pickle
from typing import Any

from transformer_xl.convert.errors import ConvertError, describe, one_line

# torch.save's legacy (non-zip) format: pickles of this number, the protocol
# version 1001 and a dict of system information, then the object.
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_TORCH_LEGACY_PROTOCOL = 1001

# Python 2 module names of the builtins (pickles of protocol < 3 use them).
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}

_FIX = "download it again, or pass the release's own file"


class _Refused(Exception):
  """A global or persistent id the restricted unpickler does not admit;
  ``load_restricted`` turns it into a ConvertError naming the file."""

  def __init__(self, what: str, why: str):
    super().__init__(what)
    self.what, self.why = what, why


class Inert:
  """A placeholder for an object of a class the pickle names.

  Building one runs no code of the original class: ``args`` and ``kwargs``
  are what the pickle passed to the constructor, ``state`` what it passed to
  ``__setstate__`` (for the reference's classes, the instance ``__dict__``;
  its keys are ``bytes`` in Python 2 pickles, see ``attributes``).
  ``pickled_global`` is the original class's ``"module.name"``.
  """

  pickled_global = ""

  def __new__(cls, *args, **kwargs):
    self = object.__new__(cls)
    self.args, self.kwargs, self.state = args, kwargs, None
    return self

  def __init__(self, *args, **kwargs):  # the arguments are recorded by __new__
    pass

  def __setstate__(self, state):
    self.state = state

  def __repr__(self):
    return f"<inert {self.pickled_global}>"


class InertArray(Inert):
  """A numpy array whose data was dropped: ``shape`` (a tuple of ints, or
  None when the pickle did not give one) and ``dtype`` (usually an
  ``InertDtype``) are kept; ``state`` stays None."""

  pickled_global = "numpy.ndarray"

  def __new__(cls, *args, **kwargs):
    self = super().__new__(cls)  # the constructor's arguments are not kept either
    self.shape, self.dtype = None, None
    return self

  def __setstate__(self, state):
    # ndarray.__reduce__'s state: (version, shape, dtype, is_fortran, data);
    # numpy < 1.0: (shape, dtype, is_fortran, data).
    if isinstance(state, tuple) and len(state) in (4, 5):
      shape, self.dtype = state[-4], state[-3]
      if isinstance(shape, tuple) and all(type(n) is int for n in shape):
        self.shape = shape


class InertDtype(Inert):
  """A numpy dtype: ``args`` is e.g. ``("i8", False, True)`` (``b"i8"`` from
  Python 2), ``state`` its byte order and field information."""

  pickled_global = "numpy.dtype"


class InertScalar(Inert):
  """A numpy scalar whose value was dropped; ``dtype`` is kept."""

  pickled_global = "numpy.core.multiarray.scalar"


class InertCall(Inert):
  """The result of a function the pickle calls that is recorded instead
  (``re._compile``: ``args`` is the pattern and its flags; nothing is
  compiled)."""


def _inert_reconstruct(subtype=None, shape=None, dtype=None):
  """numpy's ``_reconstruct(ndarray, (0,), b"b")``: an empty InertArray (the
  data comes with the BUILD that follows, and is dropped there)."""
  return InertArray()


def _inert_frombuffer(buf=None, dtype=None, shape=None, order=None):
  """numpy's ``_frombuffer`` (pickle protocol 5): the buffer is dropped."""
  array = InertArray()
  array.dtype = dtype
  if isinstance(shape, tuple) and all(type(n) is int for n in shape):
    array.shape = shape
  return array


def _inert_scalar(dtype=None, data=None):
  """numpy's ``scalar(dtype, data)``: the value is dropped."""
  scalar = InertScalar()
  scalar.dtype = dtype
  return scalar


def _placeholder(name: str, base: type = Inert) -> type:
  return type(name.rsplit(".", 1)[-1], (base,), {"pickled_global": name, "__module__": __name__})


# Sentinel for ``builtins.object``: only copyreg._reconstructor's base.
_OBJECT = type(
    "object_base", (), {"__module__": __name__, "__repr__": lambda self: "<builtins.object>"}
)()


def _reconstructor(cls, base, state=None):
  """``copyreg._reconstructor`` (protocols 0 and 1) for placeholders only."""
  if isinstance(cls, type) and issubclass(cls, Inert) and base is _OBJECT and state is None:
    return cls()
  raise _Refused("copyreg._reconstructor", f"with arguments {_kind(cls)}, {_kind(base)}")


def _codecs_encode(text=None, encoding="utf-8", errors="strict"):
  """``_codecs.encode(text, "latin1")``: how Python 3 pickles bytes with
  protocol < 3.  Other encodings are refused."""
  if (
      isinstance(text, str)
      and isinstance(encoding, str)
      and encoding.lower().replace("_", "-") in ("latin1", "latin-1")
      and errors == "strict"
  ):
    return text.encode("latin-1")
  raise _Refused("_codecs.encode", f"with encoding {encoding!r}")


def _from_bytes(kind: type):
  def make(*args):
    if not args:
      return kind()
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray)):
      return kind(args[0])
    if len(args) == 2 and isinstance(args[0], str):
      return kind(_codecs_encode(*args))
    raise _Refused(f"builtins.{kind.__name__}", "with arguments other than bytes")

  make.__name__ = kind.__name__
  return make


_REFERENCE_CLASSES = (
    "data_utils.Corpus",
    "__main__.Corpus",
    "vocabulary.Vocab",
    "utils.vocabulary.Vocab",
)
_HF_MODULES = (
    "pytorch_pretrained_bert.tokenization_transfo_xl",
    "pytorch_transformers.tokenization_transfo_xl",
    "transformers.tokenization_transfo_xl",
    "transformers.models.transfo_xl.tokenization_transfo_xl",
    "transformers.models.deprecated.transfo_xl.tokenization_transfo_xl",
)
_HF_CLASSES = tuple(
    f"{m}.{c}" for m in _HF_MODULES for c in ("TransfoXLTokenizer", "TransfoXLCorpus")
) + (
    "transformers.tokenization_utils.Trie",
    "transformers.tokenization_utils_base.AddedToken",
    "transformers.tokenization_utils.AddedToken",
    "tokenizers.AddedToken",
    "sacremoses.tokenize.MosesTokenizer",
    "sacremoses.tokenize.MosesDetokenizer",
    "sacremoses.normalize.MosesPunctNormalizer",
)

ALLOWED_GLOBALS: dict[str, Any] = {
    "collections.OrderedDict": collections.OrderedDict,
    "collections.Counter": collections.Counter,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.bytes": _from_bytes(bytes),
    "builtins.bytearray": _from_bytes(bytearray),
    "builtins.object": _OBJECT,
    "copyreg._reconstructor": _reconstructor,
    "_codecs.encode": _codecs_encode,
    "re._compile": _placeholder("re._compile", InertCall),
    "numpy.ndarray": InertArray,
    "numpy.dtype": InertDtype,
    **{f"{m}.multiarray._reconstruct": _inert_reconstruct for m in ("numpy.core", "numpy._core")},
    **{f"{m}.multiarray.scalar": _inert_scalar for m in ("numpy.core", "numpy._core")},
    **{f"{m}.numeric._frombuffer": _inert_frombuffer for m in ("numpy.core", "numpy._core")},
    **{name: _placeholder(name) for name in _REFERENCE_CLASSES + _HF_CLASSES},
}
"""What ``RestrictedUnpickler`` admits: ``"module.name"`` (Python 3
names; Python 2's ``__builtin__`` and ``copy_reg`` are mapped onto them) ->
the object the pickle gets instead.  Everything else is refused."""


class RestrictedUnpickler(pickle.Unpickler):
  """A ``pickle.Unpickler`` that admits only ``ALLOWED_GLOBALS`` and no
  persistent ids; byte strings of Python 2 pickles stay ``bytes``.

  Args:
    file: a binary file object positioned at a pickle.
  """

  def __init__(self, file):
    super().__init__(file, encoding="bytes")

  def find_class(self, module, name):
    """The allowed stand-in of ``module.name``; anything else is refused
    before it is imported or looked up."""
    key = f"{_PY2_MODULES.get(module, module)}.{name}"
    if key in ALLOWED_GLOBALS:
      return ALLOWED_GLOBALS[key]
    raise _Refused(f"{module}.{name}", "")

  def persistent_load(self, pid):
    """Refused: a vocabulary holds no tensors or storages."""
    raise _Refused("a persistent id", "(a tensor or storage of a torch.save file)")


def _kind(obj: Any) -> str:
  """A short description of an unpickled object, for messages."""
  if isinstance(obj, Inert):
    return f"a {obj.pickled_global} object"
  if obj is _OBJECT:
    return "builtins.object"
  if isinstance(obj, type):
    return f"the class {obj.__module__}.{obj.__qualname__}"
  return f"a {type(obj).__name__}"


def _load_one(f, path: str) -> Any:
  try:
    return RestrictedUnpickler(f).load()
  except _Refused as refused:
    if refused.what == "a persistent id":
      what = "refused a persistent id (a tensor or storage of a torch.save file)"
    else:
      why = f" {refused.why}" if refused.why else ""
      what = f"refused the pickled global {refused.what}{why}"
    raise ConvertError(
        one_line(
            f"{path}: {what}: this file is not a vocabulary cache of the release, and nothing "
            f"in it was run; {_FIX}."
        )
    ) from None
  except RecursionError:
    raise ConvertError(
        f"{path} is nested too deeply to be a vocabulary cache of the release "
        f"(RecursionError); nothing in it was run; {_FIX}."
    ) from None
  except Exception as err:  # EOFError, UnpicklingError, and what damaged opcodes raise
    raise ConvertError(
        f"{path} is not a readable pickle ({describe(err)}): it is truncated or "
        f"damaged, or not a vocabulary cache of the release; {_FIX}."
    ) from None


def load_restricted(path: str) -> Any:
  """The object pickled in ``path``, built by ``RestrictedUnpickler``.

  Plain containers, strings (``bytes`` where a Python 2 pickle has byte
  strings), numbers, booleans and None come back as themselves,
  ``OrderedDict``/``Counter``/sets too; the reference's and HuggingFace's
  objects come back as ``Inert`` placeholders and numpy arrays as
  ``InertArray`` without their data.  A legacy ``torch.save`` file
  (what ``TransfoXLTokenizer`` also reads as ``vocab.pkl``) gives the object
  after its header; its tensors, if any, are refused.

  Args:
    path: the pickle file.

  Returns:
    The placeholder-filled object tree.

  Raises:
    ConvertError: a missing or unreadable file, an empty one, a zip archive
      (the current ``torch.save`` format), a refused global (the message names
      it, e.g. ``posix.system``), a persistent id, or a truncated, damaged or
      non-pickle file.  Each message is one line naming ``path``.
  """
  path = os.fspath(path)
  try:
    f = open(path, "rb")
  except OSError as err:
    raise ConvertError(f"cannot read {path} ({describe(err)}); {_FIX}.") from None
  with f:
    try:
      head = f.read(4)
      f.seek(0)
    except OSError as err:
      raise ConvertError(f"cannot read {path} ({describe(err)}); {_FIX}.") from None
    if not head:
      raise ConvertError(f"{path} is empty, not a vocabulary cache of the release; {_FIX}.")
    if head.startswith(b"PK\x03\x04"):
      raise ConvertError(
          f"{path} is a zip archive (e.g. torch.save's current format), not the "
          f"release's pickled vocabulary; nothing in it was run; {_FIX}."
      )
    obj = _load_one(f, path)
    if type(obj) is int and obj == _TORCH_LEGACY_MAGIC:
      version = _load_one(f, path)
      if version != _TORCH_LEGACY_PROTOCOL:
        raise ConvertError(
            f"{path}: a torch.save file of protocol {version!r} (expected "
            f"{_TORCH_LEGACY_PROTOCOL}); {_FIX}."
        )
      _load_one(f, path)  # sys_info: byte order and type sizes
      obj = _load_one(f, path)
  return obj


class _Bad(Exception):
  """A vocabulary check that failed; the vocab functions add the file."""


def _text(value: Any, what: str) -> str:
  """``value`` as str: str as it is, bytes (Python 2 pickles) decoded as UTF-8."""
  if isinstance(value, str):
    return value
  if isinstance(value, (bytes, bytearray)):
    try:
      return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
      raise _Bad(f"{what} {bytes(value)[:40]!r} is not UTF-8 ({err.reason})") from None
  raise _Bad(f"{what} is {_kind(value)}, not a string")


def attributes(obj: Any) -> dict[str, Any] | None:
  """The pickled attributes of a placeholder (its ``state``: a ``__dict__``,
  or ``(__dict__, slots)``), or the items of a dict, with ``bytes`` names
  (Python 2) decoded as UTF-8; None for anything else.

  Raises:
    ConvertError: a name that is neither str nor UTF-8 bytes (message
      without a file name; the vocab functions add it).
  """
  if isinstance(obj, Inert):
    state = obj.state
    if (
        isinstance(state, tuple)
        and len(state) == 2
        and all(s is None or isinstance(s, dict) for s in state)
    ):
      merged: dict = {}
      for part in state:
        merged.update(part or {})
      state = merged
  else:
    state = obj
  if not isinstance(state, dict):
    return None
  out = {}
  for key, value in state.items():
    try:
      out[_text(key, "attribute name")] = value
    except _Bad as bad:
      raise ConvertError(str(bad)) from None
  return out


def _symbols(idx2sym: Any, where: str) -> list[str]:
  if not isinstance(idx2sym, list):
    raise _Bad(f"{where} is {_kind(idx2sym)}, not a list of symbols")
  if not idx2sym:
    raise _Bad(f"{where} is empty")
  symbols = [_text(s, f"{where}[{i}]") for i, s in enumerate(idx2sym)]
  seen: dict[str, int] = {}
  for i, s in enumerate(symbols):
    if s in seen:
      raise _Bad(f"{where} has the symbol {s!r} twice (ids {seen[s]} and {i})")
    seen[s] = i
  return symbols


def _check_sym2idx(symbols: list[str], sym2idx: Any, where: str, list_where: str) -> None:
  if not isinstance(sym2idx, dict):
    raise _Bad(f"{where} is {_kind(sym2idx)}, not a dict of symbol ids")
  ids = {_text(k, f"a key of {where}"): v for k, v in sym2idx.items()}
  if len(ids) != len(sym2idx):
    raise _Bad(f"{where} has a symbol twice (as str and as bytes)")
  for i, s in enumerate(symbols):
    if s not in ids:
      raise _Bad(f"{list_where}[{i}] = {s!r} is missing from {where}")
    if type(ids[s]) is not int or ids[s] != i:
      raise _Bad(f"{where} maps {s!r} to {ids[s]!r}, {list_where} has it at {i}")
  if len(ids) != len(symbols):
    extra = next(s for s in ids if s not in set(symbols))
    raise _Bad(
        f"{where} has {len(ids):,} symbols, {list_where} {len(symbols):,} "
        f"(e.g. {extra!r} is only in {where})"
    )


def _info_value(value: Any, what: str, kinds: tuple) -> Any:
  if value is None:
    return None
  if isinstance(value, (bytes, bytearray)) and str in kinds:
    return _text(value, what)
  if list in kinds and isinstance(value, (list, tuple)):
    if all(type(v) is int for v in value):
      return list(value)
    if all(isinstance(v, (str, bytes)) for v in value):
      return [_text(v, what) for v in value]
  elif any(type(value) is k for k in kinds):
    return value
  raise _Bad(f"{what} is {_kind(value)} {value!r:.60}")


def reference_corpus_vocab(path: str) -> tuple[list[str], dict]:
  """The vocabulary of a reference ``data/cache.pkl``, read with
  ``load_restricted``.

  Source: the reference's ``tf/data_utils.py`` ``get_lm_corpus`` pickles its
  ``Corpus`` (``pytorch/data_utils.py`` has the same classes);
  ``corpus.vocab.idx2sym`` is the model's vocabulary, id = index, and
  ``corpus.vocab.sym2idx`` its inverse.  Python 2 byte strings are decoded
  as UTF-8.

  Args:
    path: the cache.pkl file.

  Returns:
    ``(symbols, info)``: ``symbols`` is ``vocab.idx2sym`` as a list of str;
    ``info`` is ``{"dataset": str or None, "cutoffs": list of int or None,
    "lower_case": bool or None}`` (None where the cache lacks it; the
    reference's cutoffs include 0 and the vocabulary size, or are [] for
    corpora without adaptive softmax).

  Raises:
    ConvertError: whatever ``load_restricted`` raises; a file without a
      ``vocab`` whose ``idx2sym`` is a list of strings, with ``sym2idx``; a
      symbol that is not UTF-8 or appears twice; ``idx2sym`` and ``sym2idx``
      disagreeing; a malformed ``dataset``, ``cutoffs`` or ``lower_case``.
  """
  root = load_restricted(path)
  fix = (
      "this is not a vocabulary cache of the release; pass the release's data/cache.pkl "
      "(download it again)"
  )
  try:
    corpus = attributes(root)
    vocab = attributes(corpus.get("vocab")) if corpus is not None else None
    if vocab is None or "idx2sym" not in vocab:
      raise _Bad(f"holds {_kind(root)} without a vocab.idx2sym list")
    if "sym2idx" not in vocab:
      raise _Bad("has a vocab.idx2sym but no vocab.sym2idx")
    symbols = _symbols(vocab["idx2sym"], "vocab.idx2sym")
    _check_sym2idx(symbols, vocab["sym2idx"], "vocab.sym2idx", "vocab.idx2sym")
    info = {
        "dataset": _info_value(corpus.get("dataset"), "dataset", (str,)),
        "cutoffs": _info_value(corpus.get("cutoffs"), "cutoffs", (list,)),
        "lower_case": _info_value(vocab.get("lower_case"), "vocab.lower_case", (bool,)),
    }
    if info["cutoffs"] and not all(type(c) is int for c in info["cutoffs"]):
      raise _Bad(f"cutoffs {info['cutoffs']!r:.60} are not integers")
  except (_Bad, ConvertError) as bad:
    raise ConvertError(one_line(f"{path}: {bad}; {fix}.")) from None
  return symbols, info


HF_INFO_KEYS = (
    "special",
    "lower_case",
    "delimiter",
    "min_freq",
    "max_size",
    "vocab_file",
    "unk_idx",
    "eos_idx",
    "never_split",
    "language",
)
"""The tokenizer attributes ``hf_vocab`` reports, where the file has them."""


def hf_vocab(path: str) -> tuple[list[str], dict]:
  """The vocabulary of HuggingFace's Transformer-XL ``vocab.pkl``, read with
  ``load_restricted``.

  Source: ``transformers`` 4.35 ``TransfoXLTokenizer``: ``save_vocabulary``
  pickles the tokenizer's ``__dict__``; ``__init__(pretrained_vocab_file=...)``
  reads that dict (or a legacy ``torch.save`` of it) and takes its
  ``sym2idx`` as the token ids (4.35 keeps its own empty ``idx2sym``; later
  versions take the file's).  Both are checked to agree here.

  Args:
    path: the vocab.pkl file.

  Returns:
    ``(symbols, info)``: ``symbols`` is ``idx2sym`` as a list of str (id =
    index); ``info`` holds those of ``HF_INFO_KEYS`` that the file has,
    e.g. ``{"special": ["<eos>"], "lower_case": False, "delimiter": None,
    ...}``.

  Raises:
    ConvertError: whatever ``load_restricted`` raises; a file that is not a
      dict (or tokenizer) with an ``idx2sym`` list of strings and a
      ``sym2idx``; a symbol that is not UTF-8 or appears twice; ``idx2sym`` and
      ``sym2idx`` disagreeing; a malformed attribute of ``HF_INFO_KEYS``.
  """
  root = load_restricted(path)
  fix = "this is not a Transformer-XL vocab.pkl; pass the release's file (download it again)"
  kinds = {
      "special": (list,),
      "never_split": (list,),
      "lower_case": (bool,),
      "delimiter": (str,),
      "vocab_file": (str,),
      "language": (str,),
      "min_freq": (int,),
      "max_size": (int,),
      "unk_idx": (int,),
      "eos_idx": (int,),
  }
  try:
    attrs = attributes(root)
    if attrs is None or "idx2sym" not in attrs:
      raise _Bad(f"holds {_kind(root)} without an idx2sym list")
    if "sym2idx" not in attrs:
      raise _Bad("has an idx2sym but no sym2idx")
    symbols = _symbols(attrs["idx2sym"], "idx2sym")
    _check_sym2idx(symbols, attrs["sym2idx"], "sym2idx", "idx2sym")
    info = {key: _info_value(attrs[key], key, kinds[key]) for key in HF_INFO_KEYS if key in attrs}
  except (_Bad, ConvertError) as bad:
    raise ConvertError(one_line(f"{path}: {bad}; {fix}.")) from None
  return symbols, info
