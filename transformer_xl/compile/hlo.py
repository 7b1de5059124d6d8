"""What a compiled step does per device, read from its optimised HLO text.

``compiled.as_text()`` of a step compiled for a TPU (or any XLA backend) is
the partitioned per-device program after every XLA pass.  This module
parses it (computations, instructions, their result shapes, operands and
called computations) and counts, for **one execution of the step**:

* the collectives: all-reduce, all-gather, reduce-scatter, all-to-all and
  collective-permute (their asynchronous pairs counted once, at the
  ``-done``), with the bytes of each result per device;
* the FLOPs of the matrix products (``dot`` and ``convolution``: 2 x
  multiply-adds, a convolution's padding excluded);
* the bytes accessed: every top-level instruction's operands plus its
  result (a fusion as one instruction), the way XLA's cost analysis counts
  memory traffic.

Each loop body counts as many times as the loop runs.  XLA's own
``compiled.cost_analysis()`` counts a ``while`` body once, whatever its trip
count, so for the ``nn.scan`` over layers it reports about one layer's
FLOPs (seen with the TPU compiler of libtpu 0.0.42: doubling n_layer moved
its train-step FLOPs by 2%); this module multiplies by the trip count,
which the compiled program states in the loop's condition (``counter <
constant``) or in its ``known_trip_count``.  A loop whose trip count it
cannot read counts once and is listed in ``unknown_trip_counts``.  Both
branches of a conditional count (an upper bound).  Custom calls are
opaque: a Pallas TPU kernel's FLOPs are those its ``cost_estimate``
declares (``pallas_attention`` declares its own), any other's are not
counted; the operands and results of all of them are.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

# Bytes per element of HLO's primitive types.
_BYTES = {
    "pred": 1,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%[\w.\-]+)")
# Ops whose operands and result are not memory traffic of their own.
_NO_TRAFFIC = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "partition-id",
    "replica-id",
    "iota",
}


def element_bytes(dtype: str) -> float:
  """Bytes of one element of an HLO primitive type (f8 types: 1)."""
  if dtype.startswith("f8"):
    return 1
  return _BYTES.get(dtype, 0)


def arrays(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype, dims) of every array in an HLO shape (a tuple's in order)."""
  return [
      (dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(shape_text)
  ]


def shape_bytes(shape_text: str) -> float:
  """Bytes of an HLO shape (a tuple: the sum of its arrays)."""
  return sum(element_bytes(dt) * math.prod(dims) for dt, dims in arrays(shape_text))


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at ``text[start]``."""
  depth = 0
  pairs = {"(": ")", "{": "}", "[": "]"}
  closing = set(pairs.values())
  for i in range(start, len(text)):
    c = text[i]
    if c in pairs:
      depth += 1
    elif c in closing:
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


@dataclasses.dataclass
class Instruction:
  """One HLO instruction: ``%name = shape op(operands), attrs``."""

  name: str
  shape: str
  op: str
  operands: list[str]
  attrs: str
  args: str = ""  # the text between the op's parentheses (a constant's value)
  root: bool = False

  def callees(self) -> dict[str, list[str]]:
    """Called computations by role: calls, to_apply, body, condition, branch_computations."""
    out: dict[str, list[str]] = {}
    for role, target in _CALLEE.findall(self.attrs):
      out.setdefault(role, []).extend(re.findall(r"%([\w.\-]+)", target))
    return out


def parse_instruction(line: str) -> Instruction | None:
  """An instruction line, or None for anything else."""
  m = _INSTR.match(line)
  if not m:
    return None
  name, rest = m.group(2), m.group(3)
  if rest.startswith("("):
    end = _balanced(rest, 0)
  else:
    end = rest.find(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  # the layout of an array shape: f32[4]{0:T(128)} (possibly with nested parens)
  if rest.startswith("{"):
    layout_end = _balanced(rest, 0)
    shape, rest = shape + rest[:layout_end], rest[layout_end:].lstrip()
  op_match = re.match(r"([a-z][\w\-]*)\(", rest)
  if not op_match:
    return None
  op = op_match.group(1)
  close = _balanced(rest, op_match.end() - 1)
  args = rest[op_match.end() : close - 1]
  operands = re.findall(r"%([\w.\-]+)", args)
  return Instruction(name, shape, op, operands, rest[close:], args, bool(m.group(1)))


@dataclasses.dataclass
class Module:
  """A parsed HLO module: computations by name, the entry's name."""

  computations: dict[str, list[Instruction]]
  entry: str

  @classmethod
  def parse(cls, text: str) -> Module:
    """Raises ValueError if the text has no ENTRY computation."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
      header = _HEADER.match(line)
      if header and not line.startswith(" "):
        current = header.group(2)
        comps[current] = []
        if header.group(1):
          entry = current
        continue
      if line.startswith("}"):
        current = None
        continue
      if current is not None:
        instr = parse_instruction(line)
        if instr is not None:
          comps[current].append(instr)
    if entry is None:
      raise ValueError("not an HLO module's text: no ENTRY computation")
    return cls(comps, entry)

  def trip_count(self, while_instr: Instruction) -> int | None:
    """The loop's trip count: its ``known_trip_count``, or the constant its
    condition compares the counter with (``i < N`` from 0), else None."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', while_instr.attrs)
    if known:
      return int(known.group(1))
    cond = while_instr.callees().get("condition", [])
    if not cond or cond[0] not in self.computations:
      return None
    instrs = self.computations[cond[0]]
    by_name = {i.name: i for i in instrs}
    for i in instrs:
      if i.op == "compare" and "direction=LT" in i.attrs and len(i.operands) == 2:
        const = by_name.get(i.operands[1])
        if const is not None and const.op == "constant" and re.fullmatch(r"-?\d+", const.args):
          return int(const.args)
    return None

  def executions(self) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """(times each control-flow computation runs per execution of the
    entry, times each computation runs counting fusions and other called
    computations too, the while loops of unknown trip count)."""
    control: dict[str, float] = {}
    every: dict[str, float] = {}
    unknown: list[str] = []

    def visit(comp: str, times: float, in_fusion: bool):
      if comp not in self.computations:
        return
      every[comp] = every.get(comp, 0) + times
      if not in_fusion:
        control[comp] = control.get(comp, 0) + times
      for instr in self.computations[comp]:
        callees = instr.callees()
        if instr.op == "while":
          trips = self.trip_count(instr)
          if trips is None:
            unknown.append(instr.name)
            trips = 1
          for body in callees.get("body", []):
            visit(body, times * trips, in_fusion)
        for branch in callees.get("branch_computations", []):
          visit(branch, times, in_fusion)
        if instr.op == "call":
          for c in callees.get("to_apply", []):
            visit(c, times, in_fusion)
        for c in callees.get("calls", []):  # fusions, async wrappers
          visit(c, times, True)

    visit(self.entry, 1.0, False)
    return control, every, unknown

  def instructions(self, weights: dict[str, float]) -> Iterator[tuple[Instruction, float, dict]]:
    """(instruction, times it runs, its computation's name -> Instruction)."""
    for comp, times in weights.items():
      table = {i.name: i for i in self.computations[comp]}
      for instr in self.computations[comp]:
        yield instr, times, table


def _window_valid(
    out: int, size: int, stride: int, pad_lo: int, n_in: int, lhs_dil: int, rhs_dil: int
):
  """Multiply-adds of one convolution dimension that land on real input
  (not padding), summed over output positions."""
  n_dilated = (n_in - 1) * lhs_dil + 1 if n_in else 0
  total = 0
  for o in range(out):
    for w in range(size):
      pos = o * stride - pad_lo + w * rhs_dil
      if 0 <= pos < n_dilated and pos % lhs_dil == 0:
        total += 1
  return total


def _conv_flops(instr: Instruction, table: dict) -> float:
  labels = re.search(r"dim_labels=([\w]+)_([\w]+)->([\w]+)", instr.attrs)
  if not labels or len(instr.operands) < 2:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  lhs, rhs = table.get(instr.operands[0]), table.get(instr.operands[1])
  if lhs is None or rhs is None:
    return 0.0
  (_, lhs_dims), (_, rhs_dims), (_, out_dims) = (
      arrays(lhs.shape)[0],
      arrays(rhs.shape)[0],
      arrays(instr.shape)[0],
  )
  window = re.search(r"window=\{([^}]*)\}", instr.attrs)
  fields = dict(kv.split("=", 1) for kv in window.group(1).split()) if window else {}
  n_spatial = sum(c.isdigit() for c in lhs_l)
  split = lambda key, default: (
      [int(x) for x in fields[key].split("x")] if key in fields else [default] * n_spatial
  )
  sizes, strides = split("size", 1), split("stride", 1)
  lhs_dil, rhs_dil = split("lhs_dilate", 1), split("rhs_dilate", 1)
  pads = [tuple(int(v) for v in p.split("_")) for p in fields.get("pad", "").split("x") if p] or [
      (0, 0)
  ] * n_spatial
  per_out = rhs_dims[rhs_l.index("i")]
  out_other = math.prod(out_dims) // max(
      math.prod(out_dims[out_l.index(str(k))] for k in range(n_spatial)), 1
  )
  spatial_total = 1.0
  for k in range(n_spatial):
    o = out_dims[out_l.index(str(k))]
    n_in = lhs_dims[lhs_l.index(str(k))]
    spatial_total *= _window_valid(
        o, sizes[k], strides[k], pads[k][0], n_in, lhs_dil[k], rhs_dil[k]
    )
  return 2.0 * out_other * spatial_total * per_out


def _dot_flops(instr: Instruction, table: dict) -> float:
  lhs = table.get(instr.operands[0]) if instr.operands else None
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
  if lhs is None or not contracting:
    return 0.0
  lhs_dims = arrays(lhs.shape)[0][1]
  k = math.prod(lhs_dims[int(d)] for d in contracting.group(1).split(",") if d)
  return 2.0 * math.prod(arrays(instr.shape)[0][1]) * k


def _in_place_update(module: Module, instr: Instruction, table: dict) -> float | None:
  """Bytes of the update written in place, when ``instr`` is a
  dynamic-update-slice or a fusion whose root is one (XLA updates the
  buffer where it is: only the update is read and written), else None."""
  if instr.op == "dynamic-update-slice":
    update = table.get(instr.operands[1]) if len(instr.operands) > 1 else None
    return shape_bytes(update.shape) if update is not None else None
  if instr.op == "fusion":
    for callee in instr.callees().get("calls", []):
      body = module.computations.get(callee, [])
      root = next((i for i in body if i.root), None)
      if root is not None and root.op == "dynamic-update-slice" and len(root.operands) > 1:
        inner = {i.name: i for i in body}
        update = inner.get(root.operands[1])
        return shape_bytes(update.shape) if update is not None else None
  return None


def _traffic(module: Module, instr: Instruction, table: dict) -> float:
  """Bytes one execution of a top-level instruction reads and writes: its
  operands and result; a dynamic slice reads only its slice, an in-place
  update touches only its update."""
  if instr.op == "dynamic-slice":
    return 2 * shape_bytes(instr.shape)
  result = shape_bytes(instr.shape)
  operands = sum(shape_bytes(table[o].shape) for o in instr.operands if o in table)
  update = _in_place_update(module, instr, table)
  if update is not None:  # the buffer operand and the result are the same memory
    return operands - result + 2 * update
  return operands + result


def _custom_call_flops(instr: Instruction) -> float:
  """The FLOPs a custom call declares (a Pallas TPU kernel's ``cost_estimate``
  in its backend config), else 0."""
  m = re.search(r'cost_estimate\\?"\s*:\s*\{[^}]*?"?flops\\?"\s*:\s*\\?"?(\d+)', instr.attrs)
  return float(m.group(1)) if m else 0.0


@dataclasses.dataclass
class StepCounts:
  """Per device, one execution of the step (see the module docstring)."""

  matmul_flops: float
  bytes_accessed: float
  collectives: dict[str, dict[str, float]]  # op -> {"count", "bytes"}
  loop_trip_counts: list[int]
  unknown_trip_counts: list[str]
  matmul_flops_loops_once: float  # as XLA's cost analysis would count them
  bytes_accessed_loops_once: float

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def count(text: str) -> StepCounts:
  """Counts of a compiled module's text (``compiled.as_text()``).

  Raises:
    ValueError: the text is not an HLO module.
  """
  module = Module.parse(text)
  control, every, unknown = module.executions()
  once = {c: 1.0 for c in every}
  once_control = {c: 1.0 for c in control}

  def flops(weights):
    total = 0.0
    for instr, times, table in module.instructions(weights):
      if instr.op == "convolution":
        total += times * _conv_flops(instr, table)
      elif instr.op == "dot":
        total += times * _dot_flops(instr, table)
      elif instr.op == "custom-call":
        total += times * _custom_call_flops(instr)
    return total

  def traffic(weights):
    total = 0.0
    for instr, times, table in module.instructions(weights):
      if instr.op in _NO_TRAFFIC or instr.op.endswith("-start") or instr.op.endswith("-done"):
        continue
      total += times * _traffic(module, instr, table)
    return total

  collectives = {op: {"count": 0.0, "bytes": 0.0} for op in COLLECTIVES}
  for instr, times, _ in module.instructions(every):
    op = instr.op[: -len("-done")] if instr.op.endswith("-done") else instr.op
    if op in collectives and not instr.op.endswith("-start"):
      shape = instr.shape
      if instr.op.endswith("-done") and shape.startswith("("):  # (operand, result, ...)
        parts = arrays(shape)
        shape = f"{parts[-1][0]}[{','.join(map(str, parts[-1][1]))}]" if parts else shape
      collectives[op]["count"] += times
      collectives[op]["bytes"] += times * shape_bytes(shape)
  trips = [
      module.trip_count(i)
      for comp in control
      for i in module.computations[comp]
      if i.op == "while" and module.trip_count(i) is not None
  ]
  return StepCounts(
      matmul_flops=flops(every),
      bytes_accessed=traffic(control),
      collectives=collectives,
      loop_trip_counts=trips,
      unknown_trip_counts=unknown,
      matmul_flops_loops_once=flops(once),
      bytes_accessed_loops_once=traffic(once_control),
  )
