"""docs/architecture.md is true to the code: every code reference in it exists.

The page names files (``transformer_xl/model/models.py``,
``tests/test_memory_conformance.py``), modules and their names
(``memory.layer_update``, ``attention_ops.attention_mask``), classes and
their methods and attributes (``Memory.reset``, ``Plan.extend``,
``MemoryVariant.reset``, ``LayerHooks.combine``) in backticks.  This test
reads the package's source (``ast``: every module's top-level names, every
class's names, its bases' included) and checks each reference whose first
part is a file path, a module of the package or one of its classes; a
reference to something else (``jax.lax``, a key of the run config) is not
checked.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
CODE = re.compile(r"`([^`\n]+)`")
REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+(\(\))?$")


def _index() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
  """({module basename or dotted tail: its top-level names and submodules},
  {class name: its names, its package bases' included})."""
  modules: dict[str, set[str]] = {}
  classes: dict[str, set[str]] = {}
  bases: dict[str, list[str]] = {}
  for path in (REPO / "transformer_xl").rglob("*.py"):
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
      elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
          names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
      elif isinstance(node, (ast.Import, ast.ImportFrom)):
        names |= {(a.asname or a.name).split(".")[0] for a in node.names}
      if isinstance(node, ast.ClassDef):
        own = set()
        for item in node.body:
          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(item.name)
          elif isinstance(item, ast.Assign):
            own |= {t.id for t in item.targets if isinstance(t, ast.Name)}
          elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            own.add(item.target.id)
        classes.setdefault(node.name, set()).update(own)
        bases.setdefault(node.name, []).extend(
            b.id if isinstance(b, ast.Name) else b.attr
            for b in node.bases
            if isinstance(b, (ast.Name, ast.Attribute))
        )
    parts = path.relative_to(REPO).with_suffix("").parts
    key = parts[-2] if parts[-1] == "__init__" else parts[-1]
    modules.setdefault(key, set()).update(names)
    if parts[-1] == "__init__":  # a package also holds its submodules
      modules[key] |= {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or p.is_dir()}

  def inherited(name: str, seen=()) -> set[str]:
    out = set(classes.get(name, ()))
    for base in bases.get(name, ()):
      if base in classes and base not in seen:
        out |= inherited(base, (*seen, name))
    return out

  return modules, {name: inherited(name) for name in classes}


def references(text: str) -> list[str]:
  """The backticked code references of ``text`` (dotted names, file paths)."""
  out = []
  for code in CODE.findall(text):
    code = code.strip()
    if code.endswith(".py") or code.endswith("/") or REF.match(code):
      out.append(code)
  return out


def _config_key(ref: str) -> bool:
  """Whether ``ref`` is a key of the run config (``default_config``)."""
  from transformer_xl import default_config

  node = default_config.get_config()
  for part in ref.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def problems(refs: list[str]) -> list[str]:
  """The references that name what the code does not have."""
  modules, classes = _index()
  bad = []
  for ref in refs:
    if ref.endswith(".py") or ref.endswith("/"):
      found = (REPO / ref).exists() or any(
          any((REPO / top).rglob(ref.rstrip("/"))) for top in ("transformer_xl", "tests")
      )
      if not found:
        bad.append(f"{ref}: no such file")
      continue
    if _config_key(ref):  # e.g. train.mem_backprop_depth
      continue
    first, *rest = ref.removesuffix("()").split(".")
    if first in classes:
      if rest[0] not in classes[first]:
        bad.append(f"{ref}: class {first} has no {rest[0]}")
    elif first in modules:
      name = rest[0]
      if name not in modules[first]:
        bad.append(f"{ref}: module {first} has no {name}")
      elif len(rest) > 1 and name in classes and rest[1] not in classes[name]:
        bad.append(f"{ref}: class {name} has no {rest[1]}")
  return bad


def test_every_code_reference_of_the_page_exists():
  refs = references(PAGE.read_text())
  assert len(refs) > 60, refs  # the page is read
  assert problems(refs) == []


@pytest.mark.parametrize(
    "ref",
    [
        "Memory.no_such_method",
        "memory.no_such_function",
        "attention_ops.MaskParts.mlen_B",  # a field renamed away
        "transformer_xl/model/memory.py",  # a module that became a package
        "MemoryVariant.decode_cache",  # a name that changed spelling
    ],
)
def test_a_stale_reference_is_reported(ref):
  assert problems([ref]) != []
