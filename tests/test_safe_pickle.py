"""transformer_xl.convert.safe_pickle: the released vocabularies read without
running code.

Realistic files are built here: a reference ``cache.pkl`` (``Corpus`` and
``Vocab`` classes in throwaway ``data_utils``/``vocabulary`` modules, pickled
with protocol 2 as ``tf/data_utils.py``'s ``get_lm_corpus`` does, and a
hand-made Python 2 pickle with byte strings), HuggingFace's ``vocab.pkl``
written by transformers' own ``TransfoXLTokenizer.save_vocabulary``, and
malicious, truncated and foreign files.  A repository-wide check keeps
``pickle.load`` and unrestricted ``torch.load`` out of the package.
"""

from __future__ import annotations

import ast
import collections
import io
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.convert import safe_pickle
from transformer_xl.convert.errors import ConvertError

REPO = Path(__file__).resolve().parents[1]
TEXT = {
    "train": "the Fürth team won\nthe match in Fürth\nthe end\n",
    "valid": "the team won\n",
    "test": "the match\n",
}


# ---------------------------------------------------------------------------
# A reference-like cache.pkl (Python 3)
# ---------------------------------------------------------------------------


class Vocab:
  """The reference's ``tf/vocabulary.py`` ``Vocab``, cut to what a cache holds."""

  def __init__(
      self, special=(), min_freq=0, max_size=None, lower_case=True, delimiter=None, vocab_file=None
  ):
    self.counter = collections.Counter()
    self.special = list(special)
    self.min_freq, self.max_size = min_freq, max_size
    self.lower_case, self.delimiter, self.vocab_file = lower_case, delimiter, vocab_file

  def tokenize(self, line, add_eos=True):
    line = line.strip()
    if self.lower_case:
      line = line.lower()
    return line.split(self.delimiter) + (["<eos>"] if add_eos else [])

  def count(self, text):
    for line in text.splitlines():
      self.counter.update(self.tokenize(line))

  def build_vocab(self):
    self.idx2sym, self.sym2idx = [], collections.OrderedDict()
    for sym in self.special:
      self.idx2sym.append(sym)
      self.sym2idx[sym] = len(self.idx2sym) - 1
      setattr(self, f"{sym.strip('<>')}_idx", self.sym2idx[sym])
    for sym, cnt in self.counter.most_common(self.max_size):
      if cnt < self.min_freq:
        break
      if sym not in self.sym2idx:
        self.idx2sym.append(sym)
        self.sym2idx[sym] = len(self.idx2sym) - 1

  def encode(self, text):
    return np.concatenate(
        [
            np.array([self.sym2idx[s] for s in self.tokenize(line)], np.int64)
            for line in text.splitlines()
        ]
    )

  def __setstate__(self, state):  # the restricted unpickler must never get here
    raise AssertionError("the original class's code ran")


class Corpus:
  """The reference's ``Corpus`` (``tf/data_utils.py``) over TEXT."""

  def __init__(self, dataset, **kwargs):
    self.dataset = dataset
    self.vocab = Vocab(**kwargs)
    self.vocab.count(TEXT["train"])
    self.vocab.build_vocab()
    if dataset == "lm1b":
      self.train = ["/data/news.en-00001-of-00100", "/data/news.en-00002-of-00100"]
    else:
      self.train = self.vocab.encode(TEXT["train"])
    self.valid = self.vocab.encode(TEXT["valid"])
    self.test = self.vocab.encode(TEXT["test"])
    n = len(self.vocab.idx2sym)
    self.cutoffs = [0, 20000, 40000, 200000, n] if dataset in ("wt103", "lm1b") else []

  def __setstate__(self, state):
    raise AssertionError("the original class's code ran")


@pytest.fixture
def reference_modules(monkeypatch):
  """Registers Corpus and Vocab as ``<corpus_module>.Corpus`` and
  ``vocabulary.Vocab`` while the test runs (pickle looks them up there)."""

  def register(corpus_module="data_utils"):
    vocabulary = types.ModuleType("vocabulary")
    monkeypatch.setattr(Vocab, "__module__", "vocabulary")
    vocabulary.Vocab = Vocab
    monkeypatch.setitem(sys.modules, "vocabulary", vocabulary)
    monkeypatch.setattr(Corpus, "__module__", corpus_module)
    if corpus_module == "__main__":
      monkeypatch.setattr(sys.modules["__main__"], "Corpus", Corpus, raising=False)
    else:
      data_utils = types.ModuleType(corpus_module)
      data_utils.Corpus = Corpus
      monkeypatch.setitem(sys.modules, corpus_module, data_utils)

  return register


def write_reference_cache(path, corpus, protocol=2):
  with open(path, "wb") as fp:
    pickle.dump(corpus, fp, protocol=protocol)  # as get_lm_corpus does
  return path


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_reference_cache_python3(tmp_path, reference_modules, protocol):
  reference_modules()
  corpus = Corpus("wt103", special=["<eos>"], lower_case=False)
  path = write_reference_cache(tmp_path / "cache.pkl", corpus, protocol)
  symbols, info = safe_pickle.reference_corpus_vocab(str(path))
  assert symbols == corpus.vocab.idx2sym and "Fürth" in symbols and symbols[0] == "<eos>"
  assert info == {
      "dataset": "wt103",
      "cutoffs": [0, 20000, 40000, 200000, len(symbols)],
      "lower_case": False,
  }

  root = safe_pickle.load_restricted(str(path))
  assert isinstance(root, safe_pickle.Inert) and root.pickled_global == "data_utils.Corpus"
  attrs = safe_pickle.attributes(root)
  train = attrs["train"]
  assert isinstance(train, safe_pickle.InertArray) and train.state is None
  assert train.shape == corpus.train.shape
  vocab = safe_pickle.attributes(attrs["vocab"])
  assert attrs["vocab"].pickled_global == "vocabulary.Vocab"
  assert type(vocab["sym2idx"]) is collections.OrderedDict
  assert type(vocab["counter"]) is collections.Counter and vocab["counter"] == corpus.vocab.counter
  assert vocab["eos_idx"] == 0


@pytest.mark.parametrize(
    "dataset,corpus_module,kwargs",
    [
        ("ptb", "data_utils", dict(special=["<eos>"], lower_case=True)),
        (
            "lm1b",
            "__main__",
            dict(special=[], lower_case=False, vocab_file="/data/1b_word_vocab.txt"),
        ),
        ("enwik8", "__main__", {}),
    ],
)
def test_reference_cache_variants(tmp_path, reference_modules, dataset, corpus_module, kwargs):
  """ptb (no cutoffs), lm1b (train is a list of file names) and enwik8 (default
  Vocab); ``python data_utils.py`` pickles the corpus as ``__main__.Corpus``."""
  reference_modules(corpus_module)
  corpus = Corpus(dataset, **kwargs)
  path = write_reference_cache(tmp_path / "cache.pkl", corpus)
  assert f"c{corpus_module}\nCorpus\n".encode() in path.read_bytes()
  symbols, info = safe_pickle.reference_corpus_vocab(str(path))
  assert symbols == corpus.vocab.idx2sym
  assert info == {
      "dataset": dataset,
      "cutoffs": corpus.cutoffs,
      "lower_case": kwargs.get("lower_case", True),
  }


# ---------------------------------------------------------------------------
# A Python 2 cache.pkl, made by hand
# ---------------------------------------------------------------------------


class G:
  """A global as Python 2 names it."""

  def __init__(self, module, name):
    self.module, self.name = module, name


class Obj:
  """An instance Python 2 pickles with protocol 2: cls, (), NEWOBJ, state, BUILD."""

  def __init__(self, cls, state):
    self.cls, self.state = cls, state


class Reduce:
  """func(*args), then BUILD state if given."""

  def __init__(self, func, args, state=None):
    self.func, self.args, self.state = func, args, state


class Py2Pickler(pickle._Pickler):
  """Writes the opcodes Python 2.7's pickle.dump(..., protocol=2) writes:
  ``bytes`` are Python 2 ``str`` (SHORT_BINSTRING/BINSTRING, never
  ``_codecs.encode``), globals are written by their Python 2 names."""

  dispatch = dict(pickle._Pickler.dispatch)

  def save_py2_str(self, obj):
    if len(obj) < 256:
      self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
    else:
      self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
    self.memoize(obj)

  def save_g(self, obj):
    self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
    self.memoize(obj)

  def save_obj(self, obj):
    self.save(obj.cls)
    self.write(pickle.EMPTY_TUPLE + pickle.NEWOBJ)
    self.memoize(obj)
    self.save(obj.state)
    self.write(pickle.BUILD)

  def save_reduce_obj(self, obj):
    self.save(obj.func)
    self.save(obj.args)
    self.write(pickle.REDUCE)
    self.memoize(obj)
    if obj.state is not None:
      self.save(obj.state)
      self.write(pickle.BUILD)

  dispatch[bytes] = save_py2_str
  dispatch[G] = save_g
  dispatch[Obj] = save_obj
  dispatch[Reduce] = save_reduce_obj


def py2_array(values):
  """A numpy int64 array as Python 2's numpy pickles it."""
  dtype = Reduce(G("numpy", "dtype"), (b"i8", 0, 1), (3, b"<", None, None, None, -1, -1, 0))
  raw = np.asarray(values, "<i8").tobytes()
  return Reduce(
      G("numpy.core.multiarray", "_reconstruct"),
      (G("numpy", "ndarray"), (0,), b"b"),
      (1, (len(values),), dtype, False, raw),
  )


PY2_SYMBOLS = ["<eos>", "the", "Fürth", "team", "naïve", "€", "end"]


def write_py2_cache(path, symbols=PY2_SYMBOLS, sym2idx=None, extra=None, first=None):
  """A wt103 ``cache.pkl`` as the reference's TF code writes it under Python
  2: symbols are UTF-8 byte strings (one, "naïve", a unicode object), names
  are byte strings, OrderedDict and Counter are reduced as Python 2 does."""

  def py2(s):
    return s if s == "naïve" else s.encode("utf-8")

  idx2sym = [py2(s) for s in symbols]
  if sym2idx is None:
    sym2idx = [[s, i] for i, s in enumerate(idx2sym)]
  vocab = Obj(
      G("vocabulary", "Vocab"),
      {
          b"counter": Reduce(G("collections", "Counter"), ({s: 3 for s in idx2sym[1:]},)),
          b"special": [b"<eos>"],
          b"min_freq": 0,
          b"max_size": None,
          b"lower_case": False,
          b"delimiter": None,
          b"vocab_file": None,
          b"idx2sym": idx2sym,
          b"sym2idx": Reduce(G("collections", "OrderedDict"), (sym2idx,)),
          b"eos_idx": 0,
      },
  )
  corpus = {
      **(first or {}),
      b"dataset": b"wt103",
      b"vocab": vocab,
      b"train": py2_array(range(300)),
      b"valid": py2_array([1, 2, 3]),
      b"test": py2_array([3, 2, 1]),
      b"cutoffs": [0, 20000, 40000, 200000, len(symbols)],
  }
  corpus.update(extra or {})
  buf = io.BytesIO()
  Py2Pickler(buf, protocol=2).dump(Obj(G("__main__", "Corpus"), corpus))
  path.write_bytes(buf.getvalue())
  return path


def test_reference_cache_python2(tmp_path):
  path = write_py2_cache(tmp_path / "cache.pkl")
  data = path.read_bytes()
  ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
  # What makes it a Python 2 pickle: byte-string symbols and names, py2 globals.
  assert ("SHORT_BINSTRING", "Fürth".encode()) not in ops  # genops shows latin-1 text
  assert ("SHORT_BINSTRING", "Fürth".encode().decode("latin-1")) in ops
  assert ("SHORT_BINSTRING", "idx2sym") in ops and ("BINUNICODE", "naïve") in ops
  assert ("GLOBAL", "numpy.core.multiarray _reconstruct") in ops
  assert not any(name == "GLOBAL" and arg.startswith("_codecs") for name, arg in ops)
  assert any(name == "BINSTRING" for name, _ in ops)  # the train array's raw bytes
  with pytest.raises(UnicodeDecodeError):
    np.arange(300, dtype="<i8").tobytes().decode("utf-8")  # the data is not text

  before = set(sys.modules)
  symbols, info = safe_pickle.reference_corpus_vocab(str(path))
  assert set(sys.modules) == before  # nothing was imported
  assert symbols == PY2_SYMBOLS
  assert info == {"dataset": "wt103", "cutoffs": [0, 20000, 40000, 200000, 7], "lower_case": False}
  root = safe_pickle.load_restricted(str(path))
  assert root.pickled_global == "__main__.Corpus" and isinstance(root.state, dict)
  assert b"vocab" in root.state  # the tree keeps Python 2's byte strings
  train = safe_pickle.attributes(root)["train"]
  assert isinstance(train, safe_pickle.InertArray) and train.shape == (300,)
  assert isinstance(train.dtype, safe_pickle.InertDtype) and train.dtype.args == (b"i8", 0, 1)


@pytest.mark.parametrize(
    "change,expected",
    [
        (dict(symbols=["a", "b", "a"]), "'a' twice (ids 0 and 2)"),
        (dict(sym2idx=[[b"<eos>", 0], [b"the", 2]]), "maps 'the' to 2"),
        (dict(symbols=["a", "b"], sym2idx=[[b"a", 0]]), "vocab.idx2sym[1] = 'b' is missing"),
        (dict(symbols=["a"], sym2idx=[[b"a", 0], [b"z", 1]]), "'z' is only in vocab.sym2idx"),
        (dict(extra={b"cutoffs": b"0,1"}), "cutoffs is a bytes"),
    ],
)
def test_reference_cache_inconsistent(tmp_path, change, expected):
  path = write_py2_cache(tmp_path / "cache.pkl", **change)
  with pytest.raises(ConvertError) as err:
    safe_pickle.reference_corpus_vocab(str(path))
  msg = str(err.value)
  assert expected in msg and str(path) in msg and "\n" not in msg


def test_reference_cache_non_utf8_symbol(tmp_path):
  path = tmp_path / "cache.pkl"
  write_py2_cache(path)
  data = path.read_bytes().replace("Fürth".encode(), "Fürth".encode("latin-1") + b"!")
  path.write_bytes(data)
  with pytest.raises(ConvertError, match=r"vocab.idx2sym\[2\] b'F\\xfcrth!' is not UTF-8"):
    safe_pickle.reference_corpus_vocab(str(path))


def test_not_a_corpus(tmp_path):
  path = tmp_path / "cache.pkl"
  path.write_bytes(pickle.dumps({"idx2sym": ["a"], "sym2idx": {"a": 0}}))
  with pytest.raises(ConvertError, match="holds a dict without a vocab.idx2sym list"):
    safe_pickle.reference_corpus_vocab(str(path))
  path.write_bytes(pickle.dumps([1, 2, 3]))
  with pytest.raises(ConvertError, match="holds a list without"):
    safe_pickle.hf_vocab(str(path))


# ---------------------------------------------------------------------------
# HuggingFace's vocab.pkl
# ---------------------------------------------------------------------------


def test_hf_vocab_written_by_transformers(tmp_path, hf_tokenization):
  vocab_file = tmp_path / "vocab.txt"
  vocab_file.write_text("<eos>\nthe\nFürth\n,\n<unk>\nnaïve\n", encoding="utf-8")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tokenizer = hf_tokenization.TransfoXLTokenizer(special=["<eos>"], vocab_file=str(vocab_file))
    (saved,) = tokenizer.save_vocabulary(str(tmp_path))
    reread = hf_tokenization.TransfoXLTokenizer(pretrained_vocab_file=saved)
  assert Path(saved).name == "vocab.pkl"

  symbols, info = safe_pickle.hf_vocab(saved)
  assert symbols == tokenizer.idx2sym == ["<eos>", "the", "Fürth", ",", "<unk>", "naïve"]
  ids = list(range(len(symbols)))
  assert tokenizer.convert_tokens_to_ids(symbols) == ids
  assert reread.convert_tokens_to_ids(symbols) == ids  # 4.35 reads the ids from sym2idx
  assert info == {
      "special": ["<eos>"],
      "lower_case": False,
      "delimiter": None,
      "min_freq": 0,
      "max_size": None,
      "vocab_file": str(vocab_file),
      "unk_idx": 4,
      "never_split": tokenizer.never_split,
      "language": "en",
  }
  root = safe_pickle.load_restricted(saved)
  assert type(root) is dict and isinstance(root["moses_tokenizer"], safe_pickle.Inert)
  assert root["moses_tokenizer"].pickled_global == "sacremoses.tokenize.MosesTokenizer"
  pattern = root["punction_without_space_before_pattern"]
  assert pattern.pickled_global == "re._compile" and isinstance(pattern.args[0], str)


def test_hf_vocab_legacy_torch_save(tmp_path):
  """Older vocab.pkl files are a legacy torch.save of the tokenizer's dict."""
  torch = pytest.importorskip("torch")
  symbols = ["<eos>", "the", "Fürth"]
  vocab = {
      "special": ["<eos>"],
      "min_freq": 0,
      "max_size": None,
      "lower_case": False,
      "delimiter": None,
      "vocab_file": None,
      "never_split": ["<unk>", "<eos>"],
      "counter": collections.Counter({"the": 2, "Fürth": 1}),
      "idx2sym": symbols,
      "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(symbols)),
      "eos_idx": 0,
  }
  path = tmp_path / "vocab.pkl"
  torch.save(vocab, path, _use_new_zipfile_serialization=False)
  assert safe_pickle.hf_vocab(str(path)) == (
      symbols,
      {
          "special": ["<eos>"],
          "min_freq": 0,
          "max_size": None,
          "lower_case": False,
          "delimiter": None,
          "vocab_file": None,
          "never_split": ["<unk>", "<eos>"],
          "eos_idx": 0,
      },
  )
  torch.save(vocab, path)  # the zip format
  with pytest.raises(ConvertError, match="is a zip archive"):
    safe_pickle.hf_vocab(str(path))
  torch.save({**vocab, "t": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)
  with pytest.raises(ConvertError, match="refused the pickled global torch._utils._rebuild_"):
    safe_pickle.hf_vocab(str(path))


# ---------------------------------------------------------------------------
# Malicious files
# ---------------------------------------------------------------------------


class Evil:

  def __init__(self, func, *args):
    self.func, self.args = func, args

  def __reduce__(self):
    return self.func, self.args


def _eval_payload(marker):
  return f"open({str(marker)!r}, 'w').close()"


def malicious_files(tmp_path, marker):
  """name -> (pickle bytes, the global the message must name)."""
  touch = f"touch {marker}"
  system = f"{os.system.__module__}.system"  # posix.system
  files = {
      "os.system": (pickle.dumps(Evil(os.system, touch)), system),
      "os.system py2 protocol": (pickle.dumps(Evil(os.system, touch), protocol=2), system),
      "os.system by name": (f"cos\nsystem\n(S'{touch}'\ntR.".encode(), "os.system"),
      "builtins.eval": (pickle.dumps(Evil(eval, _eval_payload(marker))), "builtins.eval"),
      "__builtin__.eval": (
          pickle.dumps(Evil(eval, _eval_payload(marker)), protocol=2),
          "__builtin__.eval",
      ),
      "subprocess.Popen": (
          pickle.dumps(Evil(subprocess.Popen, ["touch", str(marker)])),
          "subprocess.Popen",
      ),
      "getattr chain": (
          (
              b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(Vos\ntRVsystem\ntR"
              + f"(V{touch}\ntR.".encode()
          ),
          "builtins.getattr",
      ),
      "torch rebuild": (
          b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n)R.",
          "torch._utils._rebuild_tensor_v2",
      ),
      "numpy gadget": (
          b"\x80\x02cnumpy.testing._private.utils\nrunstring\nX"
          + struct.pack("<I", len(_eval_payload(marker).encode()))
          + _eval_payload(marker).encode()
          + b"}\x86R.",
          "numpy.testing._private.utils.runstring",
      ),
  }
  return files


def test_malicious_files_are_refused(tmp_path):
  marker = tmp_path / "pwned"
  for what, (data, name) in malicious_files(tmp_path, marker).items():
    path = tmp_path / "cache.pkl"
    path.write_bytes(data)
    for read in (
        safe_pickle.load_restricted,
        safe_pickle.reference_corpus_vocab,
        safe_pickle.hf_vocab,
    ):
      with pytest.raises(ConvertError) as err:
        read(str(path))
      msg = str(err.value)
      assert f"refused the pickled global {name}" in msg, (what, msg)
      assert str(path) in msg and "\n" not in msg
      assert "not a vocabulary cache of the release" in msg and "nothing in it was run" in msg
      assert "download it again" in msg
    assert not marker.exists(), f"{what}: the payload ran"


@pytest.mark.parametrize("where", ["first", "in the vocab", "last"])
def test_payload_inside_a_valid_corpus(tmp_path, where):
  marker = tmp_path / "pwned"
  evil = Evil(os.system, f"touch {marker}")
  if where == "first":
    path = write_py2_cache(tmp_path / "cache.pkl", first={b"aaa": evil})
  else:
    path = write_py2_cache(tmp_path / "cache.pkl", extra={b"zzz": evil})
  if where == "in the vocab":
    # the payload in place of a symbol's first occurrence (vocab.counter's key)
    path = write_py2_cache(tmp_path / "cache.pkl")
    data = path.read_bytes()
    marker_op = pickle.SHORT_BINSTRING + bytes([len(b"team")]) + b"team"
    payload = pickle.dumps(evil, protocol=2)[2:-1]  # without PROTO and STOP
    assert data.count(marker_op) >= 1
    path.write_bytes(data.replace(marker_op, payload, 1))
  refused = f"refused the pickled global {os.system.__module__}.system"
  with pytest.raises(ConvertError, match=refused):
    safe_pickle.reference_corpus_vocab(str(path))
  assert not marker.exists()


def test_refused_arguments(tmp_path):
  """The admitted stand-ins refuse what their originals would do beyond the
  pickles of these files."""
  path = tmp_path / "x.pkl"
  cases = {
      b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R.": "_codecs.encode with encoding 'rot13'",
      (
          b"\x80\x02ccopy_reg\n_reconstructor\nccollections\nOrderedDict\n"
          b"c__builtin__\nobject\nN\x87R."
      ): "copyreg._reconstructor with arguments the class",
      b"\x80\x02c__builtin__\nbytes\nJ\x00\xe1\xf5\x05\x85R.": "builtins.bytes",
      b"\x80\x02X\x01\x00\x00\x00aQ.": "refused a persistent id",
  }
  for data, expected in cases.items():
    path.write_bytes(data)
    with pytest.raises(ConvertError, match=expected):
      safe_pickle.load_restricted(str(path))


# ---------------------------------------------------------------------------
# Damaged and foreign files
# ---------------------------------------------------------------------------


def test_truncated_empty_and_foreign_files(tmp_path):
  good = write_py2_cache(tmp_path / "good.pkl").read_bytes()
  path = tmp_path / "cache.pkl"
  for cut in sorted({1, 2, 10, len(good) // 3, len(good) // 2, len(good) - 2, len(good) - 1}):
    path.write_bytes(good[:cut])
    with pytest.raises(ConvertError) as err:
      safe_pickle.reference_corpus_vocab(str(path))
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg, (cut, msg)
  path.write_bytes(good[: len(good) // 2])
  with pytest.raises(ConvertError, match="not a readable pickle .*truncated or damaged"):
    safe_pickle.load_restricted(str(path))
  path.write_bytes(b"")
  with pytest.raises(ConvertError, match=r"cache.pkl is empty"):
    safe_pickle.load_restricted(str(path))
  path.write_text("hello world\nthis is not a pickle\n")
  with pytest.raises(ConvertError, match=r"not a readable pickle \(UnpicklingError"):
    safe_pickle.load_restricted(str(path))
  with pytest.raises(ConvertError, match="cannot read .*missing.pkl"):
    safe_pickle.load_restricted(str(tmp_path / "missing.pkl"))


def test_deeply_nested_pickle(tmp_path):
  """Deeply nested lists load (the unpickler does not recurse) and are
  then refused as not a corpus; nothing recurses over the tree."""
  path = tmp_path / "deep.pkl"
  depth = 300_000
  path.write_bytes(b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")
  with pytest.raises(ConvertError, match="holds a list without a vocab.idx2sym"):
    safe_pickle.reference_corpus_vocab(str(path))


# ---------------------------------------------------------------------------
# No unrestricted unpickling in the package
# ---------------------------------------------------------------------------

_PICKLE_MODULES = {
    "pickle": "pickle",
    "_pickle": "pickle",
    "cPickle": "pickle",
    "dill": "pickle",
    "torch": "torch",
    "numpy": "numpy",
}
_UNSAFE = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("pickle", "Unpickler"),
    ("pickle", "_load"),
    ("pickle", "_loads"),
    ("pickle", "_Unpickler"),
    ("torch", "load"),
    ("numpy", "load"),
}


def unsafe_loads(source: str, filename: str) -> list[str]:
  """``filename:line: call`` of each unpickling call in ``source``:
  pickle.load/loads/Unpickler (any alias of the module or the names),
  torch.load without ``weights_only=True``, numpy.load with
  ``allow_pickle=True``.  Comments, strings and docstrings do not count."""
  tree = ast.parse(source, filename)
  modules, names = {}, {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name in _PICKLE_MODULES:
          modules[alias.asname or alias.name] = _PICKLE_MODULES[alias.name]
    elif isinstance(node, ast.ImportFrom) and node.module in _PICKLE_MODULES:
      for alias in node.names:
        names[alias.asname or alias.name] = (_PICKLE_MODULES[node.module], alias.name)
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    func, target = node.func, None
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in modules
    ):
      target = (modules[func.value.id], func.attr)
    elif isinstance(func, ast.Name) and func.id in names:
      target = names[func.id]
    if target not in _UNSAFE:
      continue
    keywords = {k.arg: k.value for k in node.keywords}
    if target == ("torch", "load"):
      safe = (
          isinstance(keywords.get("weights_only"), ast.Constant)
          and keywords["weights_only"].value is True
      )
    elif target == ("numpy", "load"):
      flag = keywords.get("allow_pickle")
      safe = flag is None or (isinstance(flag, ast.Constant) and flag.value is False)
    else:
      safe = False
    if not safe:
      found.append((node.lineno, f"{filename}:{node.lineno}: {ast.unparse(node)[:80]}"))
  return [text for _, text in sorted(found)]


def test_unsafe_loads_finds_offenders():
  source = '''"""pickle.load(f) in a docstring does not count."""
import pickle, pickle as pk, torch, numpy as np
from pickle import loads as ld, Unpickler
# pickle.load(f) in a comment does not count
s = "torch.load(path)"
a = pickle.load(f)
b = pk.loads(data)
c = ld(data)
d = Unpickler(f).load()
e = torch.load(path)
g = torch.load(path, weights_only=False)
h = torch.load(path, map_location="cpu", weights_only=True)
i = np.load(path, allow_pickle=True)
j = np.load(path, allow_pickle=False)
k = np.load(path)
'''
  found = unsafe_loads(source, "m.py")
  assert [f.split(":")[1] for f in found] == ["6", "7", "8", "9", "10", "11", "13"], found


def test_no_unrestricted_unpickling_in_package():
  package = REPO / "transformer_xl"
  files = sorted(package.rglob("*.py"))
  assert len(files) > 20 and (package / "convert" / "safe_pickle.py") in files
  offenders = []
  for path in files:
    if path == package / "convert" / "safe_pickle.py":
      continue
    offenders += unsafe_loads(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
  assert not offenders, (
      "unrestricted unpickling (use transformer_xl.convert.safe_pickle, or "
      "torch.load(..., weights_only=True)):\n" + "\n".join(offenders)
  )
