"""The package's layout is its map: the import rules between the wings hold.

Rules (docs/architecture.md):
- ``model/`` imports nothing of the package outside ``model/`` (the mesh
  axis names live in ``model/axes.py``), so the model can be used, read and
  extended without the data, training or run code;
- ``import transformer_xl.model`` loads only ``model/`` modules;
- ``util/`` (the package's reports and atomic writes) imports nothing of the
  package outside ``util/``, so every wing may use it;
- ``data/`` reaches nothing of ``run/`` (its reports and files go through
  ``util/``);
- ``inference/`` and ``analysis/`` reach nothing of ``training/`` and no
  optax (evaluation, generation and the analyses run without the training
  code), and ``import transformer_xl.inference.language_model`` loads none;
- ``run/`` reaches nothing of ``training/`` (restoring parameters for
  evaluation needs no optimizer);
- nothing in the library imports ``cli/`` (the command line sits on top);
- no import cycles between modules;
- the top level holds at most 6 modules beside the subpackages;
- in ``tests/``, no module imports a test module (``test_*.py``): what test
  modules share lives in plain modules (``helpers.py``, ``data_samples.py``,
  ``hf_reference.py``, ...) and fixtures in ``conftest.py``.

The imports are read from the source (``ast``), every import statement of
every module (inside functions too), so a lazy import breaks a rule as well;
only imports under ``if TYPE_CHECKING:`` (annotations, never run) are not
counted.  The rules hold over the transitive closure of that graph: a
module breaks a rule through any chain of imports (a module also reaches
the ``__init__`` of each subpackage it is in, which runs before it), and
the message gives the chain.  One edge is not followed (``NOT_FOLLOWED``,
with why).  In ``tests/``, the code in string constants (run by a test in
a subprocess) is read too.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_xl"

# Imports not followed when the rules are checked, each with why.  The converter writes a
# model into a workdir as a training checkpoint, the optimizer state included, so that
# --mode=train fine-tunes it: it needs the training state.  ``LanguageModel.from_pretrained``
# converts a released model on first use (a lazy import of ``convert.pretrained``), so the
# inference wing reaches the converter; the converter's lazy import of the training state,
# inside ``write_workdir``, is the one edge into ``training/`` that the rules let pass.
NOT_FOLLOWED = {
    ("transformer_xl.convert.workdir_io", "transformer_xl.training.train_state"): (
        "write_workdir saves a converted model with a fresh optimizer state (a training "
        "checkpoint); LanguageModel.from_pretrained reaches it when it converts a release"
    ),
}


def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
  """transformer_xl/model/models.py -> transformer_xl.model.models."""
  rel = path.relative_to(root.parent).with_suffix("")
  parts = list(rel.parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def package_imports(path: pathlib.Path, known: set[str], root: pathlib.Path = PACKAGE) -> set[str]:
  """The package modules that ``path`` imports (every import statement), and
  the top-level names of the other modules it imports (``optax``, ``jax``).

  ``from transformer_xl.x import y`` counts as importing ``transformer_xl.x.y``
  when that is a module, else ``transformer_xl.x``.
  """
  tree = ast.parse(path.read_text(), filename=str(path))
  this = module_name(path, root)
  is_pkg = path.name == "__init__.py"
  found = set()
  typing_only = {  # `if TYPE_CHECKING:` imports (annotations only) are not run
      id(n)
      for block in ast.walk(tree)
      if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
      for stmt in block.body
      for n in ast.walk(stmt)
  }
  for node in ast.walk(tree):
    if id(node) in typing_only:
      continue
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        anchor = this.split(".") if is_pkg else this.split(".")[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for name in names:
      if name.split(".")[0] != "transformer_xl":
        found.add(name.split(".")[0])  # another distribution: its top-level name
        continue
      while name and name not in known:
        name = name.rpartition(".")[0]
      if name and name != this:
        found.add(name)
  return found


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
  """{module: what it imports (``package_imports``)} over every .py file of ``root``."""
  files = sorted(root.rglob("*.py"))
  known = {module_name(f, root) for f in files}
  return {module_name(f, root): package_imports(f, known, root) for f in files}


def in_wing(module: str, wing: str) -> bool:
  return module == f"transformer_xl.{wing}" or module.startswith(f"transformer_xl.{wing}.")


def import_chains(
    graph: dict[str, set[str]], start: str, not_followed=NOT_FOLLOWED
) -> dict[str, list[str]]:
  """{every module ``start`` reaches: the shortest chain of imports to it,
  ``[start, ..., module]``} (breadth first, in sorted order).

  A package module also reaches the ``__init__`` of each subpackage that
  holds it (importing it runs them first; the root package's runs no
  import: its ``LanguageModel`` attribute is imported when a user reads it).
  The edges of ``not_followed`` are left out.
  """
  chains = {start: [start]}
  queue = collections.deque([start])
  while queue:
    mod = queue.popleft()
    parts = mod.split(".")
    packages = {".".join(parts[:i]) for i in range(2, len(parts))} if mod in graph else set()
    for nxt in sorted(graph.get(mod, set()) | {p for p in packages if p in graph}):
      if nxt not in chains and (mod, nxt) not in not_followed:
        chains[nxt] = chains[mod] + [nxt]
        queue.append(nxt)
  return chains


def _is_entry_point(mod: str) -> bool:
  return mod == "transformer_xl.main" or mod.endswith("__main__")


# (who, the wing as named in messages, what they may not reach, its name in messages).
RULES = [
    (
        lambda m: in_wing(m, "model"),
        "model/",
        lambda i: i.startswith("transformer_xl.") and not in_wing(i, "model"),
        "outside model/",
    ),
    *(
        (lambda m, w=wing: in_wing(m, w), f"{wing}/", lambda i: in_wing(i, "training"), "training/")
        for wing in ("inference", "analysis", "run")
    ),
    *(
        (
            lambda m, w=wing: in_wing(m, w),
            f"{wing}/",
            lambda i: i == "optax",
            "optax, the optimizer",
        )
        for wing in ("inference", "analysis")
    ),
    (
        lambda m: in_wing(m, "util"),
        "util/",
        lambda i: i.startswith("transformer_xl") and not in_wing(i, "util"),
        "outside util/",
    ),
    (lambda m: in_wing(m, "data"), "data/", lambda i: in_wing(i, "run"), "run/"),
    (
        lambda m: not in_wing(m, "cli") and not _is_entry_point(m),
        "library",
        lambda i: in_wing(i, "cli"),
        "cli/",
    ),
]


def rule_violations(graph: dict[str, set[str]], not_followed=NOT_FOLLOWED) -> list[str]:
  """Every broken import rule of the module docstring, one line per module
  and rule: the nearest module it may not reach, and how it gets there."""
  problems = []
  for mod in sorted(graph):
    chains = None
    for who, wing, forbidden, what in RULES:
      if not who(mod):
        continue
      chains = chains or import_chains(graph, mod, not_followed)
      bad = sorted((len(c), c[-1]) for c in chains.values() if forbidden(c[-1]))
      if not bad:
        continue
      chain = chains[bad[0][1]]
      if len(chain) == 2:
        problems.append(f"{mod} ({wing}) imports {chain[-1]} ({what})")
      else:
        problems.append(f"{mod} ({wing}) reaches {chain[-1]} ({what}) through {' -> '.join(chain)}")
  return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The import cycles between modules (one path per strongly connected part).

  A package's ``__init__`` importing its own submodules while they import
  the package is the usual re-export pattern, so the edges from a module to
  a package that contains it are left out.
  """
  edges = {
      m: {i for i in imps if i in graph and not m.startswith(i + ".")} for m, imps in graph.items()
  }
  index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

  def strongconnect(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges[v]):
      if w not in index:
        strongconnect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      part = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        part.append(w)
        if w == v:
          break
      if len(part) > 1:
        found.append(sorted(part))

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
  for v in sorted(edges):
    if v not in index:
      strongconnect(v)
  return found


def test_the_wings_import_only_what_the_rules_allow():
  problems = rule_violations(import_graph())
  assert not problems, "\n".join(problems)


def test_no_import_cycles():
  assert cycles(import_graph()) == []


def test_the_top_level_holds_at_most_six_modules():
  top = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert len(top) <= 6, top
  assert "main.py" in top


def test_importing_the_model_loads_only_model_modules():
  code = (
      "import sys, transformer_xl.model.models, transformer_xl.model.config; "
      "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('transformer_xl'))))"
  )
  out = subprocess.run(
      [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=PACKAGE.parent
  ).stdout.split()
  assert out and all(m == "transformer_xl" or in_wing(m, "model") for m in out), out


def test_importing_the_package_starts_no_jax_backend():
  """Every module imports without computing anything on a device: the
  multi-host launch calls ``jax.distributed.initialize()`` after its imports,
  which refuses once a backend exists (a module-level ``jnp.asarray`` did)."""
  code = (
      "import importlib, pkgutil, transformer_xl; "
      "from jax._src import xla_bridge; "
      "[importlib.import_module(m.name) for m in pkgutil.walk_packages("
      "transformer_xl.__path__, 'transformer_xl.') if not m.name.endswith('__main__')]; "
      "assert not xla_bridge.backends_are_initialized(), 'a module started a backend'"
  )
  subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_importing_the_language_model_loads_no_training_code():
  """The Python API (and so evaluation and generation) loads neither
  ``training/`` nor optax: restoring parameters needs no optimizer."""
  code = (
      "import sys, transformer_xl.inference.language_model; "
      "assert not [m for m in sys.modules if m.startswith(('transformer_xl.training', 'optax'))]"
  )
  subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_the_edges_not_followed_are_lazy_imports_of_the_package():
  """Each exception is an import the package has, inside a function (so that
  importing the module does not run it)."""
  graph = import_graph()
  for (mod, imp), why in NOT_FOLLOWED.items():
    assert imp in graph[mod], (mod, imp, why)
    path = PACKAGE.parent / (mod.replace(".", "/") + ".py")
    top = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(imp == t or imp.startswith(f"{t}.") for t in top if t), (mod, imp, top)


@pytest.mark.parametrize(
    "source, expected",
    [
        # model/ reaching into data/: the rule that keeps the model usable alone.
        (
            {"model/models.py": "from transformer_xl import data\n", "data/__init__.py": ""},
            ["transformer_xl.model.models (model/) imports transformer_xl.data (outside model/)"],
        ),
        # a lazy import inside a function counts too.
        (
            {
                "model/models.py": "def f():\n  from transformer_xl.data import corpus\n",
                "data/__init__.py": "",
                "data/corpus.py": "",
            },
            [
                "transformer_xl.model.models (model/) imports transformer_xl.data.corpus (outside model/)"
            ],
        ),
        (
            {
                "inference/evaluate.py": "from transformer_xl.training import train\n",
                "training/__init__.py": "",
                "training/train.py": "",
                "inference/__init__.py": "",
            },
            [
                "transformer_xl.inference.evaluate (inference/) imports transformer_xl.training.train "
                "(training/)"
            ],
        ),
        # util/ is the bottom floor: not even the package's top-level modules.
        (
            {
                "util/__init__.py": "",
                "util/report.py": "from transformer_xl import errors\nfrom transformer_xl.util import files\n",
                "util/files.py": "",
                "errors.py": "",
            },
            ["transformer_xl.util.report (util/) imports transformer_xl.errors (outside util/)"],
        ),
        # data/ reports through util/, never through run/ (a lazy import counts too).
        (
            {
                "data/__init__.py": "",
                "data/storage.py": (
                    "from transformer_xl.util import report\n"
                    "def f():\n  from transformer_xl.run import metrics\n"
                ),
                "run/__init__.py": "",
                "run/metrics.py": "",
                "util/__init__.py": "",
                "util/report.py": "",
            },
            ["transformer_xl.data.storage (data/) imports transformer_xl.run.metrics (run/)"],
        ),
        # A imports B, B imports training/: A breaks the rule through B.
        (
            {
                "inference/__init__.py": "",
                "inference/evaluate.py": "from transformer_xl.run import run_dir\n",
                "run/__init__.py": "",
                "run/run_dir.py": "def f():\n  from transformer_xl.training import train_state\n",
                "training/__init__.py": "",
                "training/train_state.py": "import optax\n",
            },
            [
                "transformer_xl.inference.evaluate (inference/) reaches "
                "transformer_xl.training.train_state (training/) through "
                "transformer_xl.inference.evaluate -> transformer_xl.run.run_dir -> "
                "transformer_xl.training.train_state",
                "transformer_xl.inference.evaluate (inference/) reaches optax (optax, the "
                "optimizer) through transformer_xl.inference.evaluate -> transformer_xl.run.run_dir "
                "-> transformer_xl.training.train_state -> optax",
                "transformer_xl.run.run_dir (run/) imports transformer_xl.training.train_state "
                "(training/)",
            ],
        ),
        # a subpackage's __init__ runs before its modules: analysis/ reaches what it imports.
        (
            {
                "analysis/__init__.py": "",
                "analysis/recl.py": "from transformer_xl.data import corpus\n",
                "data/__init__.py": "from transformer_xl.training import train\n",
                "data/corpus.py": "",
                "training/__init__.py": "",
                "training/train.py": "",
            },
            [
                "transformer_xl.analysis.recl (analysis/) reaches transformer_xl.training.train "
                "(training/) through transformer_xl.analysis.recl -> transformer_xl.data.corpus "
                "-> transformer_xl.data -> transformer_xl.training.train"
            ],
        ),
        (
            {
                "run/workdir.py": "from transformer_xl.cli import user_errors\n",
                "run/__init__.py": "",
                "cli/__init__.py": "",
                "cli/user_errors.py": "",
            },
            ["transformer_xl.run.workdir (library) imports transformer_xl.cli.user_errors (cli/)"],
        ),
        (
            {
                "model/models.py": "from transformer_xl.model import attention\n",
                "model/attention.py": "import jax\n",
                "main.py": "from transformer_xl.cli import modes\n",
                "cli/__init__.py": "",
                "cli/modes.py": "",
            },
            [],
        ),
    ],
)
def test_the_rule_checker_catches_a_broken_rule(tmp_path, source, expected):
  """The checker itself: each broken rule is found (and the allowed ones are not)."""
  root = tmp_path / "transformer_xl"
  for rel, text in {"__init__.py": "", "model/__init__.py": "", **source}.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
  assert rule_violations(import_graph(root)) == expected


def test_the_cycle_finder_finds_a_cycle(tmp_path):
  root = tmp_path / "transformer_xl"
  root.mkdir()
  (root / "__init__.py").write_text("")
  (root / "a.py").write_text("from transformer_xl import b\n")
  (root / "b.py").write_text("import transformer_xl.c\n")
  (root / "c.py").write_text("def f():\n  from transformer_xl import a\n")
  assert cycles(import_graph(root)) == [
      ["transformer_xl.a", "transformer_xl.b", "transformer_xl.c"]
  ]
  # An import for annotations only (`if TYPE_CHECKING:`) is not run: no cycle.
  (root / "c.py").write_text(
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from transformer_xl import a\n"
  )
  assert cycles(import_graph(root)) == []


# --------------------------------------------------------------------------- #
# The test suite: no test module imports another.

TESTS = pathlib.Path(__file__).resolve().parent


def _import_names(tree: ast.AST) -> set[str]:
  """The dotted module names of every import statement in ``tree``; for
  ``from a import b`` both ``a`` and ``a.b`` (b may be a module)."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
  return names


def imports_of_test_modules(root: pathlib.Path = TESTS) -> list[str]:
  """``"<file> imports <name>"`` for each import of a test module by a Python
  file under ``root``.

  A test module is a ``test_*.py`` file under ``root``; an import names it
  when a part of its dotted name is the module's (``test_train``,
  ``tests.test_train``, ``harness.test_harness``).  Every import statement
  counts (inside functions too), and those of the code in string constants
  (run in a subprocess with ``tests/`` on ``PYTHONPATH``).
  """
  test_modules = {p.stem for p in root.rglob("test_*.py")}
  found = []
  for path in sorted(root.rglob("*.py")):
    tree = ast.parse(path.read_text(), filename=str(path))
    names = _import_names(tree)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
        try:
          names |= _import_names(ast.parse(node.value))
        except SyntaxError:  # text, not code
          pass
    bad = {name for name in names if any(part in test_modules for part in name.split("."))}
    for name in sorted(bad):
      parts = name.split(".")
      prefixes = {".".join(parts[:k]) for k in range(1, len(parts))}
      if not prefixes & bad:  # named once: test_b, not also test_b.x
        found.append(f"{path.relative_to(root)} imports {name}")
  return found


def test_no_test_module_imports_another():
  """Shared test code lives in plain modules (helpers.py, ...), never in a test module."""
  assert imports_of_test_modules() == []


def test_the_test_import_checker_finds_each_kind_of_import(tmp_path):
  """A plain import, a lazy ``from tests import``, code in a string (once for
  ``harness.test_h.y``); not another package's test_* module, nor prose."""
  (tmp_path / "harness").mkdir()
  files = {
      "test_a.py": "import test_b\n",
      "test_b.py": "def f():\n  from tests import test_a\n",
      "helpers.py": "CODE = 'import json\\nfrom harness.test_h import y'\n",  # run elsewhere
      "harness/__init__.py": "",
      "harness/test_h.py": "from helpers import CODE\nfrom jax._src import test_util\n",
      "test_c.py": "import helpers\nTEXT = 'not code: import it'\n",
  }
  for rel, text in files.items():
    (tmp_path / rel).write_text(text)
  assert imports_of_test_modules(tmp_path) == [
      "helpers.py imports harness.test_h",
      "test_a.py imports test_b",
      "test_b.py imports tests.test_a",
  ]
