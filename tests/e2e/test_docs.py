"""The documentation: the site builds, and every example in it runs.

* ``mkdocs build --strict`` (mkdocs.yml: the user guide, the REPORT.md files
  and the API reference from the docstrings) succeeds; its output is the
  failure message.  The README's relative links point at files that exist.
* Every ```python block of README.md and of docs/**/*.md runs: the blocks of
  one file in order, in one namespace, in a fresh process, in a temporary
  working directory where ``workdirs/quickstart`` was trained by the README's
  quick-start commands themselves (``pip install -e .`` left out, a small
  PTB sample given as ``--config.data.manual_dir`` instead of the download,
  and overrides that make it take seconds).  A
  block that cannot run here (a TPU, gcloud, hours of compute) is preceded
  by ``<!-- docs-test: skip (<reason>) -->``; any other Python block that
  fails fails this test.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, tiny_flags, write_ptb_sample

pytestmark = pytest.mark.slow  # tooling: the documentation site and its examples

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SKIP = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)].*)\) -->")
PYTHON = ("python", "py", "python3")
QUICK_START_INSTALL = "pip install -e ."  # the quick start's first command
PTB = "data/ptb"  # the sample the quick start reads here instead of the download
# Appended to every `python -m transformer_xl.main` of the quick start: seconds, not minutes.
TINY = tiny_flags(
    model__n_layer=1,
    model__tgt_len=None,
    model__mem_len=None,
    train__global_batch=4,
    train__warmup_steps=0,
    train__num_steps=4,
    checkpoint__every_steps=4,
    eval__global_batch=4,
    data__verify_checksums=False,
)

_RUNNER = r"""
import json, sys, traceback
failed, ran = [], []
for doc in json.load(open(sys.argv[1])):
  namespace = {"__name__": "__docs__"}
  for block in doc["blocks"]:
    where = f"{doc['file']}:{block['line']}"
    # Padded so that tracebacks give the line numbers of the markdown file.
    code = compile("\n" * block["line"] + block["code"], doc["file"], "exec")
    try:
      exec(code, namespace)
    except BaseException:
      print(f"\n=== FAILED: the python block at {where}", file=sys.stderr, flush=True)
      traceback.print_exc()
      failed.append(where)
      break  # the file's later blocks build on this one
    ran.append(where)
    print(f"\nok: {where}", flush=True)
    json.dump(ran, open("blocks_ran.json", "w"))
if failed:
  sys.exit("failed: " + ", ".join(failed))
"""


def code_blocks(path: Path) -> list[dict]:
  """The fenced code blocks of a markdown file: language, first code line
  (0-based), code, and the skip reason of a marker right before the fence."""
  lines = path.read_text().splitlines()
  blocks, i = [], 0
  while i < len(lines):
    m = re.match(r"^```(\S*)\s*$", lines[i])
    if not m:
      i += 1
      continue
    j = i + 1
    while j < len(lines) and lines[j].rstrip() != "```":
      j += 1
    assert j < len(lines), f"{path}:{i + 1}: a code block is not closed"
    before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
    skip = SKIP.fullmatch(before.strip())
    blocks.append(
        {
            "lang": m.group(1),
            "line": i + 1,
            "code": "\n".join(lines[i + 1 : j]) + "\n",
            "skip": skip.group("reason") if skip else None,
        }
    )
    i = j + 1
  return blocks


def _rel(path: Path) -> str:
  return str(path.relative_to(REPO))


def test_skip_markers_are_well_formed_and_precede_a_block():
  for path in DOCS:
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
      if "docs-test" not in line:
        continue
      assert SKIP.fullmatch(
          line.strip()
      ), f"{_rel(path)}:{n + 1}: write the marker as <!-- docs-test: skip (<reason>) -->"
      rest = [l for l in lines[n + 1 :] if l.strip()]
      assert rest and rest[0].startswith(
          "```"
      ), f"{_rel(path)}:{n + 1}: a skip marker must come right before a code block"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site built by ``mkdocs build --strict``: its output directory."""
  out = tmp_path_factory.mktemp("site") / "site"
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  r = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, "mkdocs build --strict failed:\n" + r.stdout + r.stderr
  return out


def test_site_builds_strict(site):
  # The reports' images are in the site (docs/results and docs/benchmark-results link there).
  assert (site / "results" / "wt2" / "table6_attention_length.png").is_file()
  assert (site / "results" / "recl_wt2" / "fig3_relative_gains.png").is_file()
  # The README is not part of the site: its relative links are checked here.
  readme = (REPO / "README.md").read_text()
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
    if "://" not in target:
      assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


# A Sphinx role (:func:`x`) is not markup for mkdocstrings: it shows as typed.
SPHINX_ROLE = re.compile(r":(?:func|meth|class|data|attr|mod):(?:`|&#96;|<code>)")


def test_no_raw_sphinx_roles(site):
  """No built page shows a Sphinx role: docstrings write ``x``, not :func:`x`."""
  found = []
  for page in sorted(site.rglob("*.html")):
    for m in SPHINX_ROLE.finditer(page.read_text(errors="replace")):
      found.append(
          f"{page.relative_to(site)}: ...{m.string[max(0, m.start() - 60):m.end() + 40]}..."
      )
  assert not found, "raw Sphinx roles in the built site (write ``name`` instead):\n" + "\n".join(
      found[:20]
  )


def _quick_start(readme: Path) -> list[list[str]]:
  """The README's quick-start commands (after the install) as argv lists,
  made to run here: reading the PTB sample instead of downloading."""
  found = [
      b
      for b in code_blocks(readme)
      if b["lang"] == "bash"
      and b["code"].splitlines()[0].strip() == QUICK_START_INSTALL
      and "transformer_xl.main" in b["code"]
  ]
  assert (
      len(found) == 1
  ), f"README.md: expected one quick-start block whose first line is {QUICK_START_INSTALL!r}"
  runs = []
  for line in found[0]["code"].splitlines()[1:]:
    argv = shlex.split(line, comments=True)
    if not argv:
      continue
    assert argv[:3] == ["python", "-m", "transformer_xl.main"], line
    assert not any(
        a.startswith("--config.data.manual_dir") for a in argv
    ), f"the quick start downloads the data by default: {line}"
    runs.append([sys.executable, *argv[1:], f"--config.data.manual_dir={PTB}", *TINY])
  assert len(runs) == 2 and "--mode=eval" in runs[1], runs
  return runs


@pytest.fixture(scope="module")
def trained_here(tmp_path_factory):
  """A working directory with the repository's configs and results, PTB
  sample files in data/ptb, and workdirs/quickstart trained and evaluated by
  the README's quick-start command."""
  cwd = tmp_path_factory.mktemp("docs")
  write_ptb_sample(cwd / "data" / "ptb")
  (cwd / "configs").symlink_to(REPO / "configs")
  shutil.copytree(REPO / "results", cwd / "results")  # examples read the saved results
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
  env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", TFDS_DATA_DIR=str(cwd / "tfds"))
  for argv in _quick_start(REPO / "README.md"):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (
        f"the README's quick start failed here: {shlex.join(argv)}\n"
        + r.stdout[-3000:]
        + r.stderr[-5000:]
    )
  results = json.loads((cwd / "workdirs" / "quickstart" / "eval_results.json").read_text())
  assert results["step"] == 4 and results["valid"]["tokens"] > 0
  return cwd, env


def test_python_examples_run(trained_here):
  cwd, env = trained_here
  spec, skipped = [], []
  for path in DOCS:
    blocks = []
    for b in code_blocks(path):
      if b["lang"] not in PYTHON:
        continue
      if b["skip"]:
        skipped.append(f"{_rel(path)}:{b['line']} ({b['skip']})")
      else:
        blocks.append({"line": b["line"], "code": b["code"]})
    if blocks:
      spec.append({"file": _rel(path), "blocks": blocks})
  assert any(s["file"] == "README.md" for s in spec), "README.md has no Python example"
  (cwd / "blocks.json").write_text(json.dumps(spec))
  (cwd / "run_blocks.py").write_text(_RUNNER)
  r = subprocess.run(
      [sys.executable, "run_blocks.py", "blocks.json"],
      cwd=cwd,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-8000:]
  ran = json.loads((cwd / "blocks_ran.json").read_text())
  assert ran == [f"{s['file']}:{b['line']}" for s in spec for b in s["blocks"]], r.stdout
  print(f"{len(ran)} Python blocks ran; skipped: {skipped or 'none'}")
