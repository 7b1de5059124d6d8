"""The memory interface changed no bit of what the memories compute.

``tests/fixtures/memory_bitwise.npz`` was written by
``scripts/make_memory_fixtures.py`` running the code of commit 3ea4d5c, the
last before the memory variants owned their settings, state and hooks
(``model/memory/variant.py``): per case (the XL memory with each attention
type, pre-LayerNorm with same_length, documents, front padding and the
decoding cache; the compressive memory with each compression function and
with no compressed slot; the memory tokens with and without the XL cache,
not at the end, reading the cache, same_length; dropout in some), the
initial parameters, each segment's NLLs and memory (every leaf by name: the
checkpoints' names), the auxiliary losses and the gradient of the summed
loss, which for the memory tokens flows back through the written tokens
(backpropagation through segments).  This test runs the same script on
today's code and compares every array: equal bit for bit on the machine
that wrote the fixture (the CPU model and XLA's backend optimisation level,
the suite's ``--xla_backend_optimization_level=0``), else to float32
rounding (another CPU or level sums in another order).

The script itself is checked once: a planted change of one array (the
tokens' written state) makes it report a difference (test below).
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "memory_bitwise.npz"


def _script():
  spec = importlib.util.spec_from_file_location(
      "make_memory_fixtures", REPO / "scripts" / "make_memory_fixtures.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


SCRIPT = _script()


def differences(name: str, got: dict, saved, exact: bool) -> list[str]:
  """The arrays of case ``name`` that differ from the fixture (names)."""
  want = {k.split(":", 1)[1]: saved[k] for k in saved.files if k.startswith(name + ":")}
  bad = sorted(set(got) ^ set(want))
  for key in sorted(set(got) & set(want)):
    a, b = got[key], want[key]
    same = a.shape == b.shape and a.dtype == b.dtype
    if same and exact:
      same = np.array_equal(a, b)
    elif same:
      same = np.allclose(a, b, rtol=1e-5, atol=1e-6)
    if not same:
      bad.append(key)
  return bad


@pytest.mark.slow  # 19 cases, each compiled: ~2 min on 2 cores
@pytest.mark.parametrize("name", list(SCRIPT.CASES))
def test_each_case_equals_what_the_code_before_the_interface_computed(name):
  saved = np.load(FIXTURE)
  exact = str(saved["machine"]) == SCRIPT.machine()
  fields, kinds = SCRIPT.CASES[name]
  got = SCRIPT.run_case(fields, kinds)
  assert any(k.startswith("params/") for k in got) and len(got) > 10
  assert differences(name, got, saved, exact) == []


def test_a_changed_array_is_reported():
  saved = np.load(FIXTURE)
  name = "tokens_no_cache"
  got = {k.split(":", 1)[1]: np.array(saved[k]) for k in saved.files if k.startswith(name + ":")}
  assert differences(name, got, saved, exact=True) == []
  key = "memory_1/.mem_tokens_BxNxD"
  got[key] = got[key] + np.float32(1e-3)
  assert differences(name, got, saved, exact=True) == [key]
  del got[key]
  assert differences(name, got, saved, exact=False) == [key]
