r"""Where a jitted step's time goes on XLA:CPU: a profile's ops summed by kind, dots with their
shapes and rates.

  # 1. a trace of steps 4-5 plus the compiled HLO (for the dot shapes):
  XLA_FLAGS="--xla_dump_to=/tmp/prof/hlo --xla_dump_hlo_as_text \
      --xla_dump_hlo_module_re=.*train_step.*" \
  python -m encoder_jax.main --mode=pretrain --config=configs/pretrain.py:size=base,nsp=nsp \
      --workdir=/tmp/prof/run --config.data.batch_size=8 --config.train.steps=6 \
      --config.optim.warmup_steps=1 --config.train.profile_steps=3 \
      --config.train.profile_num_steps=2 --config.train.eval_every=0 \
      --config.train.eval_steps=0 --config.train.checkpoint_every=0
  # 2. the summary:
  python -m bench.profile_ops --trace=/tmp/prof/run/profile --hlo=/tmp/prof/hlo --steps=2

Why by hand: xprof's op-profile tools report nothing for XLA:CPU (its thunk runtime records
each op as a host event named after the HLO instruction), so this reads the `.xplane.pb` with
jaxlib's own `ProfileData` and joins the event names to the optimized HLO text. Times are the
events' wall durations summed over XLA's threads: an op that several threads run at once (a
dot split by YNNPACK) counts once per thread that records it. The dot rate is its FLOPs over
that summed time, so it is a lower bound when a dot shares the cores with another op.
A dot inside a while loop (scanned layers) runs once per iteration; its rate here counts its
FLOPs once per step, so read scanned dots' times, not their rates.
Summed op time is not the wall time an op's removal would save: XLA:CPU runs independent ops
side by side (measured: an 8 ms-a-step argmax in the demo ELECTRA step, replaced by cheaper
reductions, left the step's wall time unchanged; bench/README.md).
"""
from __future__ import annotations

import collections
import glob
import math
import os
import re
import sys

from absl import app, flags

_TRACE = flags.DEFINE_string("trace", None, "A profile folder (the trainer's <workdir>/profile) "
                             "or one .xplane.pb file; the newest trace in it is read.")
_HLO = flags.DEFINE_string("hlo", "", "An --xla_dump_to folder with the step's optimized HLO "
                           "as text (adds dot shapes and rates); empty: op kinds only.")
_MODULE = flags.DEFINE_string("module", "train_step", "Which dumped module: a substring of its "
                              "file name.")
_STEPS = flags.DEFINE_integer("steps", 2, "Steps the trace holds (times are printed per step).")
_TOP = flags.DEFINE_integer("top", 15, "Rows per table.")

_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .* \{$")


def _dims(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def parse_hlo(text: str) -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
  """(computation -> {"shapes": name -> dims, "dots": [line]}, instruction -> the computation
  it calls, instruction -> its line)."""
  comps: dict[str, dict] = {}
  calls: dict[str, str] = {}
  lines: dict[str, str] = {}
  cur = None
  for line in text.splitlines():
    m = _HEADER.match(line)
    if m:
      cur = comps.setdefault(m.group(1), {"shapes": {}, "dots": []})
      for p in re.finditer(r"([\w.\-]+): \w+\[([\d,]*)\]", m.group(2)):
        cur["shapes"][p.group(1)] = _dims(p.group(2))
      continue
    m = _INSTR.match(line)
    if not m or cur is None:
      continue
    cur["shapes"][m.group(1)] = _dims(m.group(3))
    lines[m.group(1)] = line.strip()
    if " dot(" in line:
      cur["dots"].append(line.strip())
    c = re.search(r"calls=%([\w.\-]+)", line)
    if c:
      calls[m.group(1)] = c.group(1)
  return comps, calls, lines


def dot_flops(comp: dict) -> tuple[float, str]:
  """FLOPs of the dots in a computation (2 x output size x contraction), and their shapes."""
  total, desc = 0.0, []
  for line in comp["dots"]:
    out = _dims(_INSTR.match(line).group(3))
    lhs, rhs = re.search(r" dot\(%?([\w.\-]+), %?([\w.\-]+)\)", line).groups()
    contracting = _dims(re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line).group(1))
    lhs_shape = comp["shapes"].get(lhs)
    if lhs_shape is None:
      continue
    total += 2.0 * math.prod(out) * math.prod(lhs_shape[d] for d in contracting)
    desc.append(f"{lhs_shape} x {comp['shapes'].get(rhs)} -> {out}")
  return total, "; ".join(desc)


def op_times(xplane: str) -> tuple[collections.Counter, collections.Counter]:
  """Summed wall time (ns) and event count of every op XLA's threads ran."""
  from jax._src.lib import _profile_data  # pylint: disable=g-import-not-at-top
  plane = _profile_data.ProfileData.from_file(xplane).find_plane_with_name("/host:CPU")
  times, counts = collections.Counter(), collections.Counter()
  for line in plane.lines:
    if not line.name.startswith("tf_XLA"):  # XLA's executor threads (Eigen, PjRt client)
      continue
    for e in line.events:
      if e.name.startswith("ThunkExecutor"):  # the executor's own spans around the ops
        continue
      times[e.name] += e.duration_ns
      counts[e.name] += 1
  return times, counts


def _newest(pattern: str) -> str:
  found = sorted(glob.glob(pattern, recursive=True), key=os.path.getmtime)
  if not found:
    raise app.UsageError(f"nothing matches {pattern}")
  return found[-1]


def summarize(xplane: str, hlo_text: str, steps: int, top: int) -> str:
  times, _ = op_times(xplane)
  comps, calls, lines = parse_hlo(hlo_text) if hlo_text else ({}, {}, {})
  kinds, kind_flops, shapes, rest = collections.Counter(), collections.Counter(), {}, []
  for op, ns in times.items():
    flops, desc = dot_flops(comps[calls[op]]) if op in calls and calls[op] in comps else (0, "")
    if not flops:
      rest.append((ns, op))
    kind = "dots (fusions holding a dot)" if flops else re.sub(r"\.\d+$", "", op)
    kinds[kind] += ns
    kind_flops[kind] += flops * steps
    if flops:
      row = shapes.setdefault(desc, [0, 0.0, 0])
      row[0] += ns
      row[1] += flops * steps
      row[2] += 1
  total = sum(kinds.values())
  out = [f"op time {total / 1e9 / steps:.3f} s per step, summed over XLA's threads "
         f"({len(times)} ops)", "", "| kind | s per step | share | GFLOP/s |", "|---|---|---|---|"]
  for kind, ns in kinds.most_common(top):
    rate = f"{kind_flops[kind] / ns:.0f}" if kind_flops[kind] else ""
    out.append(f"| {kind} | {ns / 1e9 / steps:.3f} | {100 * ns / total:.1f}% | {rate} |")
  if shapes:
    out += ["", "| dot (lhs x rhs -> out) | ops | s per step | GFLOP/s |", "|---|---|---|---|"]
    for desc, (ns, fl, n) in sorted(shapes.items(), key=lambda kv: -kv[1][0])[:top]:
      out.append(f"| {desc} | {n} | {ns / 1e9 / steps:.3f} | {fl / ns:.0f} |")
  out += ["", "| other op | s per step | result | from |", "|---|---|---|---|"]
  for ns, op in sorted(rest, reverse=True)[:top]:
    line = lines.get(op, "")
    m = _INSTR.match(line)
    result = f"{m.group(2)}[{m.group(3)}]" if m else ""
    src = re.search(r'op_name="([^"]+)"', line)
    out.append(f"| {op} | {ns / 1e9 / steps:.3f} | {result} | "
               f"{src.group(1)[-60:] if src else ''} |")
  return "\n".join(out)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}")
  if not _TRACE.value:
    raise app.UsageError("--trace is required: the trainer's <workdir>/profile folder.")
  xplane = (_TRACE.value if _TRACE.value.endswith(".xplane.pb")
            else _newest(os.path.join(_TRACE.value, "**", "*.xplane.pb")))
  hlo = ""
  if _HLO.value:
    hlo = open(_newest(os.path.join(_HLO.value, f"*{_MODULE.value}*after_optimizations.txt")),
               encoding="utf-8").read()
  print(f"{xplane}\n")
  print(summarize(xplane, hlo, _STEPS.value, _TOP.value))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
