r"""config.mesh="auto" on a TPU: the layout chosen by compiling candidates ahead of time.

  python -m encoder_jax.train.layout --tpu_topology=v5e:4x4 \
      --config=configs/pretrain.py:size=base,recipe=roberta --config.data.max_length=128
      (on any CPU with libtpu: `bash run.sh tpu python -m encoder_jax.train.layout ...`;
      the trainer runs the same search on the TPU VM itself when config.mesh is "auto")

Every time below is XLA's TPU cost-model ESTIMATE (`optimal_seconds` of the compiled step,
compile_check.analyze), never a measurement; HBM is XLA's buffer assignment of the program.

What is searched, for the recipe's global batch G = data.batch_size x optim.accumulation_steps
(kept: the recipe's optimisation is not the hardware's to change):
  * mesh axes and optimizer placement: data parallelism with the optimizer split over the data
    axis (ZeRO-1, config.optim_sharding="zero1"), plain data parallelism, FSDP;
  * rows per device m (the micro-batch) and accumulation k = G / (m x devices): the largest m
    whose program fits HBM with HBM_MARGIN headroom; memory is modelled from a first probe
    (state fixed, the rest linear in m) and every choice is confirmed by compiling it;
  * remat: "dots" (the scanned default; in the estimate faster than "none" at equal rows:
    bench/results/tpu_aot_calibration.txt); "full" only where nothing else fits;
  * scanned vs unrolled layers: unrolled up to MAX_UNROLLED_LAYERS layers (generator included;
    compile time and program size grow with depth; ELECTRA-large's 48 did not compile in 24 GiB
    of host memory), where the estimate is the whole step's; XLA's cost model counts a scanned
    loop's body once, so a scanned program's estimate cannot rank it against another.
The candidate with the least estimated time per optimizer update (k x the step's estimate)
wins; every update processes the same G rows, so that is the highest estimated MFU. When the
slice is too large for G (few rows a device, the estimate clearly better with more), a warning
gives both figures and names the slice of the same chips that G would keep busy.

Compiled results are cached by program: the key is a hash of the lowered program text (shapes,
shardings, every op), the devices and the compiler versions, so a repeated search, another
host of the same slice, or a resumed run compiles nothing again. The choice is a function of
the compiled programs only (never of a compile's wall time), so every host of a slice picks
the same layout. The trainer records it in config.json (`config.layout`), and a resumed run
reuses the record instead of searching (the batch size decides the data order).

Accumulation runs through optax.MultiSteps (train/optim.py), which computes the inner AdamW
update at every micro-step and keeps it only at the k-th; under ZeRO-1 that update is 1/devices
of the replicated one, which is why ZeRO-1 and accumulation go together here.
"""
from __future__ import annotations

import dataclasses
import fractions
import hashlib
import json
import math
import pathlib
import re
import time
from typing import Callable, Sequence

import ml_collections

# Usable share of a device's HBM: the rest is left to the runtime, the input pipeline's
# buffers and fragmentation.
HBM_MARGIN = 0.90
# HBM per chip (GiB), from the vendors' spec sheets. A compile-only v4 topology exposes each
# TensorCore as a device (2 per chip); v5e, v5p (megacore) and v6e one device per chip.
CHIP_HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5": 95, "TPU v6 lite": 32}
# How Cloud TPU names a slice of n chips of each kind (v4/v5p count TensorCores, 2 a chip).
SLICE_NAMES = {"TPU v4": ("v4", 2), "TPU v5 lite": ("v5e", 1), "TPU v5": ("v5p", 2),
               "TPU v6 lite": ("v6e", 1)}
MAX_UNROLLED_LAYERS = 24
PROBE_TOKENS = 2048  # tokens a device in the first probe (16 rows of 128, 4 of 512)
BETTER = 1.10  # an estimate this much higher at more rows a device makes the slice "too large"


@dataclasses.dataclass(frozen=True)
class Layout:
  mesh: str  # config.mesh: "-1,1,1" (data parallel) or "1,-1,1" (FSDP)
  optim_sharding: str  # "zero1" | "replicated"
  rows: int  # rows a device per step call (the micro-batch)
  remat: str  # model.remat_policy
  scan: bool  # model.scan_layers

  def describe(self) -> str:
    return (f"{kind_of(self.mesh, self.optim_sharding)}, {self.rows} rows/device, remat "
            f"{self.remat}, {'scanned' if self.scan else 'unrolled'} layers")


def kind_of(mesh: str, optim_sharding: str) -> str:
  """"data parallel", "data parallel + ZeRO-1", "FSDP" or "mesh d,f,t" for a config.mesh
  (data, fsdp, tensor), as written ("-1,1,1") or resolved for a slice ("16,1,1")."""
  data, fsdp, tensor = (mesh.split(",") + ["", "", ""])[:3]
  where = ("data parallel" if fsdp == tensor == "1" else
           "FSDP" if data == tensor == "1" else f"mesh {mesh}")
  return where + (" + ZeRO-1" if optim_sharding == "zero1" else "")


@dataclasses.dataclass
class Priced:
  """One compiled candidate (every time a compiler ESTIMATE)."""
  layout: Layout
  accumulation: int  # k: step calls per optimizer update
  fits: bool = False
  hbm_gib: float | None = None  # live bytes a device at the step's peak
  argument_gib: float | None = None  # of which the arguments (train state + batch)
  cap_gib: float = 0.0
  est_step_s: float | None = None  # one step call (one micro-batch), averaged over k
  est_emit_s: float | None = None  # the call that runs the optimizer (XLA's own figure)
  xla_flops: float | None = None
  est_mfu: float | None = None  # the project's MFU definition (train/flops.py), estimated
  compile_s: float = 0.0
  cached: bool = False
  program: str = ""
  collectives: str = ""
  error: str = ""
  confirmed: bool = False  # memory from the program that runs (accumulating: see confirm)
  record: dict = dataclasses.field(default_factory=dict, repr=False)  # the compiler's figures

  @property
  def est_update_s(self) -> float | None:
    return None if self.est_step_s is None else self.est_step_s * self.accumulation

  def row(self) -> str:
    mem = (f"{self.hbm_gib:.2f}/{self.cap_gib:.1f} GiB" if self.hbm_gib is not None
           else "? GiB")
    est = (f"est {self.est_step_s * 1e3:.1f} ms/step x {self.accumulation} = "
           f"{self.est_update_s * 1e3:.1f} ms/update, est MFU {self.est_mfu:.3f}"
           if self.est_step_s else "no comparable estimate")
    fit = "fits" if self.fits else "does not fit"
    if self.accumulation > 1 and not self.confirmed:
      fit += ", the k=1 program + the accumulator"
    return (f"{self.layout.describe()}: {mem} ({fit}), {est}"
            f"{' [cached]' if self.cached else f' [compiled in {self.compile_s:.0f} s]'}"
            f"{' ' + self.error[:160] if self.error and not self.fits else ''}")


@dataclasses.dataclass
class Choice:
  best: Priced
  priced: list[Priced]
  notes: list[str]
  global_batch: int
  devices: int
  chips: int
  kind: str


def global_batch(config: ml_collections.ConfigDict) -> int:
  return int(config.data.batch_size) * int(config.optim.accumulation_steps)


def slice_name(kind: str, chips: int) -> str:
  prefix, per_chip = SLICE_NAMES.get(kind, (kind.lower().replace(" ", ""), 1))
  return f"{prefix}-{chips * per_chip}"


def chips_of(devices) -> int:
  return len({tuple(getattr(d, "coords", (d.id,))) for d in devices})


def hbm_cap_gib(devices) -> float:
  """HBM of one device (a v4 compile-only device is half a chip)."""
  kind = devices[0].device_kind
  return CHIP_HBM_GIB.get(kind, 16) * chips_of(devices) / len(devices)


def configure(config: ml_collections.ConfigDict, layout: Layout, n_devices: int,
              batch: int | None = None) -> ml_collections.ConfigDict:
  """A copy of `config` running `layout` for the global batch `batch` (default: the recipe's)."""
  G = batch or global_batch(config)
  if G % (layout.rows * n_devices):
    raise ValueError(f"{layout.rows} rows on each of {n_devices} devices do not divide the "
                     f"global batch of {G}.")
  c = ml_collections.ConfigDict(config.to_dict())
  c.mesh, c.optim_sharding = layout.mesh, layout.optim_sharding
  c.data.batch_size = layout.rows * n_devices
  c.optim.accumulation_steps = G // c.data.batch_size
  c.model.remat_policy, c.model.scan_layers = layout.remat, str(layout.scan)
  return c


def _versions() -> str:
  import importlib.metadata as md

  import jax
  try:
    libtpu = md.version("libtpu")
  except md.PackageNotFoundError:
    libtpu = "none"
  return f"jax {jax.__version__} libtpu {libtpu}"


class Pricer:
  """Compiles candidates for `devices` (TPU, real or compile-only) and caches the results by
  program in `cache_dir` (one JSON file a program)."""

  def __init__(self, devices, cache_dir=None, say: Callable[[str], None] = print):
    from encoder_jax.data.fetch import cache_root
    self.devices = list(devices)
    self.cache = pathlib.Path(cache_dir) if cache_dir else cache_root() / "layouts"
    self.say = say
    self.compiles = 0
    d = self.devices
    self.where = (f"{len(d)} x {d[0].device_kind} {sorted(tuple(x.coords) for x in d)} "
                  f"{_versions()}" if hasattr(d[0], "coords") else f"{len(d)} x {d[0]}")

  def price(self, config: ml_collections.ConfigDict, layout: Layout,
            batch: int | None = None) -> Priced:
    """`layout` for the global batch `batch` (default: the recipe's), priced. Accumulating
    layouts (k > 1) are priced through the same step at k = 1 (see `_accumulated`): XLA's
    estimate of the accumulating program itself is no use (below); `confirm` compiles that
    program for its memory."""
    from encoder_jax.train import compile_check as cc
    from encoder_jax.train import flops as flops_lib
    c = configure(config, layout, len(self.devices), batch)
    out = Priced(layout, int(c.optim.accumulation_steps), cap_gib=hbm_cap_gib(self.devices))
    one = configure(config, layout, len(self.devices), layout.rows * len(self.devices))
    lowered, s, *_ = cc.lower_train_step(one, self.devices)
    record, out.cached = self.compiled(lowered)
    out.record = record
    out.compile_s, out.error = record.get("compile_s", 0.0), record.get("error", "")
    out.collectives = record.get("collectives", "")
    out.program = cc.describe_program(s.model_cfg)
    extra = 0.0
    if out.accumulation > 1:
      update, accumulate, extra = self.branch_estimates(c)
    if "peak_bytes" in record:
      out.hbm_gib = (record["peak_bytes"] + extra) / 2**30
      out.argument_gib = (record["argument_bytes"] + extra) / 2**30
      out.fits = out.hbm_gib <= HBM_MARGIN * out.cap_gib
    elif record.get("oom_gib"):
      out.hbm_gib = record["oom_gib"]
    est = record.get("optimal_seconds")
    if est and not layout.scan:  # (a scanned program's estimate covers one layer of L)
      out.est_emit_s = out.est_step_s = est
      out.xla_flops = record.get("xla_flops")
      if out.accumulation > 1:
        out.est_emit_s, out.est_step_s = _accumulated(est, update, accumulate,
                                                      out.accumulation)
      peak = flops_lib.peak_flops_per_device(self.devices[0].device_kind)
      out.est_mfu = s.flops_per_step / (out.est_step_s * chips_of(self.devices) * peak)
    return out

  def confirm(self, config: ml_collections.ConfigDict, p: Priced) -> Priced:
    """`p` with the memory of the program that runs (the accumulating one, k > 1), compiled."""
    from encoder_jax.train import compile_check as cc
    if p.accumulation == 1:
      return dataclasses.replace(p, confirmed=True)
    c = configure(config, p.layout, len(self.devices))
    record, _ = self.compiled(cc.lower_train_step(c, self.devices)[0])
    p = dataclasses.replace(p, record=record, confirmed=True)
    if "peak_bytes" in record:
      p.hbm_gib = record["peak_bytes"] / 2**30
      p.argument_gib = record["argument_bytes"] / 2**30
    p.fits = "peak_bytes" in record and p.hbm_gib <= HBM_MARGIN * p.cap_gib
    p.error = record.get("error", "")
    return p

  def compiled(self, lowered, need: Sequence[str] = ()) -> tuple[dict, bool]:
    """(what compiling `lowered` for these devices gave, whether it came from the cache; a
    cached record without the keys in `need`, written by an older version, is redone)."""
    key = hashlib.sha256((lowered.as_text() + self.where).encode()).hexdigest()[:32]
    path = self.cache / f"{key}.json"
    if path.exists():
      record = json.loads(path.read_text())
      if all(k in record for k in need) or record.get("error"):
        return record, True
    record = _compile(lowered)
    self.compiles += 1
    self.cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{time.time_ns()}")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return record, False

  def branch_estimates(self, c: ml_collections.ConfigDict) -> tuple[float, float, float]:
    """(estimated seconds of the update, of the accumulation, the accumulator's bytes a
    device) for `c`'s accumulating step: its two branches compiled alone with the step's
    shardings, the update (step.apply_update, ZeRO-1's gather included) and the accumulation
    (optim.accumulate). Small programs, the same at any rows a device."""
    import jax
    import numpy as np

    from encoder_jax.train import optim, setup, sharding
    from encoder_jax.train import step as step_lib
    s = setup.build(c, self.devices[0].platform)
    mesh = sharding.mesh_from_config(s.mesh, self.devices)
    abstract, shardings = sharding.sharded_abstract_state(s.init_fn, mesh, s.optim_sharding)
    where = sharding.update_shardings(abstract.params, shardings.params, mesh,
                                      s.optim_sharding)
    placed = lambda tree, sh: jax.tree.map(
        lambda a, x: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=x), tree, sh)
    grads = placed(abstract.params, where or shardings.params)
    k, tx = s.optim_cfg.accumulation_steps, s.trainer.tx
    gather = shardings.params if where is not None else None
    update = jax.jit(lambda g, o, p: step_lib.apply_update(tx, g, o, p, gather)).lower(
        grads, abstract.opt_state, grads)
    acc = jax.jit(lambda g, o: optim.accumulate(g, o, k)).lower(grads, abstract.opt_state)
    buffer = sum(int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize
                 for a in jax.tree.leaves(abstract.opt_state.acc_grads))
    return (*(self.compiled(x)[0].get("optimal_seconds") or 0.0 for x in (update, acc)),
            float(buffer))


def _accumulated(step_s: float, update_s: float, accumulate_s: float, k: int
                 ) -> tuple[float, float]:
  """(the micro-step that updates, the average of the k) of an accumulating step, from the
  estimate of the same step without accumulation (one micro-batch, then the update) and of its
  two branches alone. XLA's estimate of the accumulating program itself is unusable: it
  prices a lax.cond at its dearer branch, and the custom calls it has no price for
  (compile_check.UNPRICED_CUSTOM_CALLS: -1 s each, 324 of them in BERT-base's ZeRO-1 step,
  30 in its update branch) do not add up across the cond (BERT-base's step read 19 s)."""
  emit = step_s + accumulate_s
  other = max(step_s - update_s + accumulate_s, 0.0)
  return emit, (emit + (k - 1) * other) / k


def _compile(lowered) -> dict:
  """What a compiled candidate leaves in the cache: memory, estimate, collectives; or the
  compiler's refusal (out of HBM: the memory it asked for), or another error."""
  from encoder_jax.train import compile_check as cc
  t0 = time.perf_counter()
  try:
    compiled = lowered.compile()
  except Exception as err:  # noqa: BLE001 -- a candidate that cannot compile is a result
    msg = str(err)
    m = re.search(r"Used ([\d.]+)([GMK]) of ([\d.]+)G hbm", msg) or re.search(
        r"HLO temporaries \(([\d.]+)([GM])\)", msg)
    oom = None
    if m:
      oom = float(m.group(1)) / {"G": 1, "M": 1024, "K": 2**20}[m.group(2)]
    first = (msg.strip().splitlines() or [""])[0][:300]
    return {"error": f"{type(err).__name__}: {first}", "oom_gib": oom,
            "compile_s": time.perf_counter() - t0}
  a = cc.analyze(compiled)
  return {**a, "compile_s": time.perf_counter() - t0,
          "collectives": " ".join(f"{k[2:]}:{v}" for k, v in a.items() if k.startswith("n_"))}


def _allowed_rows(per_device: int) -> list[int]:
  """Rows a device that divide the batch per device: powers of two, and the whole share."""
  rows = {m for m in (2 ** i for i in range(per_device.bit_length())) if per_device % m == 0}
  return sorted(rows | {per_device})


def _layers(config) -> int:
  m, o = config.model, config.objective
  gen = round(m.num_layers * o.gen_layers_frac) if o.objective != "mlm" else 0
  return int(m.num_layers) + gen


def _predict_rows(probe: Priced, allowed: list[int], others: Sequence[Priced] = ()) -> int:
  """The most rows a device whose program should fit, from the probe's memory: the
  arguments (state + batch) fixed, the rest linear in the rows (through the origin with one
  point, through two points with another compiled candidate of the same layout)."""
  usable = HBM_MARGIN * probe.cap_gib
  pts = sorted({(p.layout.rows, p.hbm_gib) for p in (probe, *others) if p.hbm_gib})
  if len(pts) >= 2:
    (m1, h1), (m2, h2) = pts[-2], pts[-1]
    slope = max((h2 - h1) / (m2 - m1), 1e-9)
    limit = m2 + (usable - h2) / slope
  else:
    fixed = probe.argument_gib or 0.0
    limit = probe.layout.rows * (usable - fixed) / max((probe.hbm_gib or usable) - fixed, 1e-9)
  fitting = [m for m in allowed if m <= limit]
  return fitting[-1] if fitting else allowed[0]


def _largest_fitting(pricer: Pricer, config, base: Layout, allowed: list[int],
                     say, start: int | None = None) -> list[Priced]:
  """Compiles `base` at the most rows a device that fit (probe at `start`, by default
  PROBE_TOKENS a device; predict; confirm)."""
  tokens = int(config.data.max_length)
  probe_rows = start or max([m for m in allowed if m * tokens <= PROBE_TOKENS] or [allowed[0]])
  seen = [pricer.price(config, dataclasses.replace(base, rows=probe_rows))]
  say(f"  {seen[-1].row()}")
  while not seen[-1].fits and seen[-1].layout.rows > allowed[0]:  # the probe is too big
    smaller = max(m for m in allowed if m < seen[-1].layout.rows)
    seen.append(pricer.price(config, dataclasses.replace(base, rows=smaller)))
    say(f"  {seen[-1].row()}")
  for _ in range(2):  # predict, confirm; once more with the two-point model
    fit = [p for p in seen if p.fits]
    if not fit:
      break
    rows = _predict_rows(fit[-1], allowed, [p for p in seen if p is not fit[-1]])
    if rows in {p.layout.rows for p in seen}:
      break
    seen.append(pricer.price(config, dataclasses.replace(base, rows=rows)))
    say(f"  {seen[-1].row()}")
    while not seen[-1].fits and seen[-1].layout.rows > max(p.layout.rows for p in fit):
      smaller = max(m for m in allowed if m < seen[-1].layout.rows)
      if smaller in {p.layout.rows for p in seen}:
        break
      seen.append(pricer.price(config, dataclasses.replace(base, rows=smaller)))
      say(f"  {seen[-1].row()}")
  return seen


def _rank(p: Priced) -> tuple:
  """Fitting first, then least estimated time per update (scanned programs have none: after
  estimated ones), then the most rows a device."""
  return (not p.fits, p.est_update_s is None, p.est_update_s or 0.0, -p.layout.rows)


def search(config: ml_collections.ConfigDict, devices, *, cache_dir=None,
           say: Callable[[str], None] = print) -> Choice:
  """The layout for `config` on `devices` (module docstring); prints each candidate."""
  pricer = Pricer(devices, cache_dir, say)
  n, chips, kind = len(pricer.devices), chips_of(pricer.devices), pricer.devices[0].device_kind
  G = global_batch(config)
  if G < n or G % n:
    raise ValueError(f"the global batch of {G} rows (data.batch_size x optim."
                     f"accumulation_steps) cannot be split over the {n} devices of this slice; "
                     f"give a multiple of {n}, or use a slice of at most {max(1, G)} devices.")
  allowed = _allowed_rows(G // n)
  scan = _layers(config) > MAX_UNROLLED_LAYERS
  say(f"layout search (mesh=auto): global batch {G} x {config.data.max_length} on {n} x "
      f"{kind} ({slice_name(kind, chips)}), every time an XLA cost-model ESTIMATE")
  priced = _largest_fitting(pricer, config, Layout("-1,1,1", "zero1", 0, "dots", scan),
                            allowed, say)
  best = min(priced, key=_rank)
  if not best.fits:  # nothing fits replicated: FSDP, then full remat
    for base in (Layout("1,-1,1", "replicated", 0, "dots", scan),
                 Layout("1,-1,1", "replicated", 0, "full", scan)):
      priced += _largest_fitting(pricer, config, base, allowed, say)
      best = min(priced, key=_rank)
      if best.fits:
        break
  else:
    rows = best.layout.rows
    priced.append(pricer.price(config, Layout("-1,1,1", "replicated", rows, "dots", scan)))
    say(f"  {priced[-1].row()}")
    fsdp = Layout("1,-1,1", "replicated", rows, "dots", scan)
    if rows < allowed[-1]:  # memory-bound: FSDP keeps less state a device, maybe more rows
      priced += _largest_fitting(pricer, config, fsdp, allowed, say, start=rows)
    else:
      priced.append(pricer.price(config, fsdp))
      say(f"  {priced[-1].row()}")
    best = min(priced, key=_rank)
  while best.fits and not best.confirmed:  # an accumulating program: its own memory
    i = priced.index(best)
    priced[i] = pricer.confirm(config, best)
    if priced[i].accumulation > 1:
      say(f"  (the accumulating program itself) {priced[i].row()}")
    best = min(priced, key=_rank)
  if not best.fits:
    raise ValueError(f"no layout of {config.size} at {config.data.max_length} tokens fits "
                     f"{HBM_MARGIN:.0%} of a {kind} device's {best.cap_gib:.0f} GiB even at "
                     f"{allowed[0]} rows a device with FSDP and full remat; use a larger "
                     "slice or shorter rows.")
  notes = _too_large(pricer, config, best, allowed, say)
  say(f"chosen: {best.row()}")
  for note in notes:
    say(f"warning: {note}")
  return Choice(best, priced, notes, G, n, chips, kind)


def _too_large(pricer: Pricer, config, best: Priced, allowed: list[int], say) -> list[str]:
  """A warning, with figures, when the recipe's batch leaves each device too few rows: the
  best layout at up to 4x its rows a device (a larger global batch, compiled on this slice)
  estimated BETTER x faster per row. The slice that G would keep that busy is named."""
  if best.layout.rows != allowed[-1] or best.est_mfu is None:
    return []
  target = _predict_rows(best, [best.layout.rows * f for f in (2, 4)])
  if target <= best.layout.rows:
    return []
  n = len(pricer.devices)
  more = pricer.price(config, dataclasses.replace(best.layout, rows=target), batch=target * n)
  say(f"  (a larger batch, for comparison) {more.row()}")
  if not more.fits or not more.est_mfu or more.est_mfu < BETTER * best.est_mfu:
    return []
  G, chips = global_batch(config), chips_of(pricer.devices)
  per_chip = n / chips
  fewer = max(1, int(G / (target * per_chip)))
  kind = pricer.devices[0].device_kind
  return [f"this slice is too large for a global batch of {G}: {best.layout.rows} rows a "
          f"device, est MFU {best.est_mfu:.3f}; at {target} rows a device est MFU "
          f"{more.est_mfu:.3f} (estimated on this slice). {G} rows would keep {fewer} chips "
          f"that busy: a {slice_name(kind, fewer)} instead of this {slice_name(kind, chips)}, "
          f"or raise data.batch_size to {target * n} (a recipe change)."]


def record_of(choice: Choice, config: ml_collections.ConfigDict) -> dict:
  b = choice.best
  return {"layout": dataclasses.asdict(b.layout), "accumulation": b.accumulation,
          "global_batch": choice.global_batch,
          "recipe_accumulation": int(config.optim.accumulation_steps),
          "devices": choice.devices, "slice": slice_name(choice.kind, choice.chips),
          "est_mfu": b.est_mfu, "est_step_ms": b.est_step_s and b.est_step_s * 1e3,
          "hbm_gib": b.hbm_gib}


def apply(config: ml_collections.ConfigDict, record: dict) -> None:
  """Writes a layout record (record_of, or config.layout of a recorded run) into `config`:
  mesh, optimizer sharding, micro-batch, accumulation, remat, layers; train.steps and the
  log / eval / checkpoint intervals, which count step calls, scale with the accumulation so
  that they mean the same number of optimizer updates as the recipe's."""
  lay = Layout(**record["layout"])
  n = int(record["devices"])
  c = configure(config, lay, n, int(record["global_batch"]))
  config.mesh, config.optim_sharding = c.mesh, c.optim_sharding
  config.data.batch_size = c.data.batch_size
  config.model.remat_policy, config.model.scan_layers = lay.remat, str(lay.scan)
  scale = fractions.Fraction(int(record["accumulation"]), int(config.optim.accumulation_steps))
  config.optim.accumulation_steps = int(record["accumulation"])
  for key in ("steps", "log_every", "eval_every", "checkpoint_every"):
    if config.train[key]:
      config.train[key] = max(1, math.ceil(config.train[key] * scale))
  config.layout = json.dumps(record, sort_keys=True)


def settle(config: ml_collections.ConfigDict, workdir=None, devices=None,
           say: Callable[[str], None] = print) -> None:
  """config.mesh="auto" on a TPU: the recorded layout of a resumed run in `workdir`, or a new
  search (`search`), applied to `config` (`apply`). Elsewhere "auto" keeps its meaning
  (sharding.mesh_from_config: one CPU device; every GPU data-parallel)."""
  import jax
  from etils import epath
  devices = list(devices) if devices is not None else jax.devices()
  if config.get("mesh", "auto") != "auto" or devices[0].platform != "tpu":
    return
  from encoder_jax.train.setup import CONFIG_FILE
  record_file = epath.Path(workdir) / CONFIG_FILE if workdir is not None else None
  if record_file is not None and record_file.exists():
    recorded = json.loads(record_file.read_text()).get("layout") or ""
    if recorded:
      say("layout (mesh=auto): the one this run recorded in its config.json")
      apply(config, json.loads(recorded))
      return
  apply(config, record_of(search(config, devices, say=say), config))


def main(argv):
  """`python -m encoder_jax.train.layout --tpu_topology=v5e:4x4 --config=...`: the search for
  a slice before renting it (compile_check's --config and --tpu_topology flags)."""
  from absl import app, flags
  from jax.experimental import topologies
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  if f.config is None or not f.tpu_topology:
    raise app.UsageError("give --config=configs/pretrain.py:... and --tpu_topology=v5e:4x4 "
                         "(run with libtpu on the path: `bash run.sh tpu python -m ...`).")
  devices = topologies.get_topology_desc(platform="tpu", topology_name=f.tpu_topology).devices
  choice = search(f.config, devices)
  record = record_of(choice, f.config)
  print("config.layout (what the trainer records and a resumed run reuses):")
  print(json.dumps(record, sort_keys=True))


if __name__ == "__main__":
  import os
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU devices are compile-only
  from encoder_jax import cli
  from encoder_jax.train import compile_check  # noqa: F401  (defines --config, --tpu_topology)
  cli.run(main, "encoder_jax.train.layout")
