"""The package's layout is its map: the import rules between the wings hold.

Rules (docs/architecture.md):
- ``model/`` imports nothing of the package outside ``model/`` (the mesh
  axis names live in ``model/axes.py``), so the model can be used, read and
  extended without the data, training or run code;
- ``import transformer_xl.model`` loads only ``model/`` modules;
- ``inference/`` never imports ``training/``;
- nothing in the library imports ``cli/`` (the command line sits on top);
- no import cycles between modules;
- the top level holds at most 6 modules beside the subpackages;
- in ``tests/``, no module imports a test module (``test_*.py``): what test
  modules share lives in plain modules (``helpers.py``, ``data_samples.py``,
  ``hf_reference.py``, ...) and fixtures in ``conftest.py``.

The imports are read from the source (``ast``), every import statement of
every module (inside functions too), so a lazy import breaks a rule as well;
only imports under ``if TYPE_CHECKING:`` (annotations, never run) are not
counted.  In ``tests/``, the code in string constants (run by a test in a
subprocess) is read too.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer_xl"


def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
  """transformer_xl/model/models.py -> transformer_xl.model.models."""
  rel = path.relative_to(root.parent).with_suffix("")
  parts = list(rel.parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def package_imports(path: pathlib.Path, known: set[str], root: pathlib.Path = PACKAGE) -> set[str]:
  """The package modules that ``path`` imports (every import statement).

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
      while name and name not in known:
        name = name.rpartition(".")[0]
      if name.startswith("transformer_xl") and name != this:
        found.add(name)
  return found


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
  """{module: the package modules it imports} over every .py file of ``root``."""
  files = sorted(root.rglob("*.py"))
  known = {module_name(f, root) for f in files}
  return {module_name(f, root): package_imports(f, known, root) for f in files}


def in_wing(module: str, wing: str) -> bool:
  return module == f"transformer_xl.{wing}" or module.startswith(f"transformer_xl.{wing}.")


def rule_violations(graph: dict[str, set[str]]) -> list[str]:
  """Every broken import rule of the module docstring, one line each."""
  problems = []
  for mod, imports in sorted(graph.items()):
    for imp in sorted(imports):
      if in_wing(mod, "model") and not in_wing(imp, "model"):
        problems.append(f"{mod} (model/) imports {imp} (outside model/)")
      if in_wing(mod, "inference") and in_wing(imp, "training"):
        problems.append(f"{mod} (inference/) imports {imp} (training/)")
      if in_wing(imp, "cli") and not (
          in_wing(mod, "cli")
          or mod == "transformer_xl.main"
          or mod == "transformer_xl.convert.__main__"
          or mod.endswith("__main__")
      ):
        problems.append(f"{mod} (library) imports {imp} (cli/)")
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
  assert rule_violations(import_graph()) == []


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
