"""What the benchmarks time: our jitted train steps and HF torch `BertForPreTraining`, each in
its own worker process, fed the same batches of real demo-corpus text.

Why worker processes: torch (OpenMP) and XLA (Eigen) each keep a thread pool, and an OpenMP
pool spins for a while after every parallel region; in one process the idle pool of one
framework would eat cycles the other needs. A worker blocked on its pipe uses no CPU, so
interleaving rounds between workers (A B C, C B A, ...) times each framework alone while drift
of a shared, noisy machine hits all of them alike.

  spec = StepSpec(system="ours", size="mini", batch_size=32, seq_len=128)
  with Worker(spec, batches) as w:      # builds, compiles, warms up in the child
    wall_s, cpu_s = w.run(4)            # 4 steps, synchronised once at the end
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Vocabulary: encoder_jax.model.config.BERT_VOCAB_SIZE (the demo corpus is tokenised with
# MiniLM's = BERT's uncased vocab), imported where used: jax may not be imported before a
# worker has set its XLA_FLAGS.
SYSTEMS = ("ours", "hf")
OBJECTIVES = ("mlm", "electra")


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """One system to time. Plain values only: it crosses the process boundary."""

  system: str = "ours"  # ours | hf
  size: str = "mini"  # a key of encoder_jax.model.config.SIZES
  objective: str = "mlm"  # mlm (+NSP when nsp) | electra (ours only; no NSP)
  nsp: bool = True
  batch_size: int = 32
  seq_len: int = 128
  threads: int = 2  # torch.set_num_threads; XLA uses every core it sees
  # Our step's options (ModelConfig / ObjectiveConfig fields).
  scan_layers: bool = True
  remat_policy: str = "none"
  dtype: str = "float32"
  dot_dtype: str = ""  # ModelConfig.dot_dtype: "bfloat16" = bf16 matmuls, fp32 activations
  attention_dropout: float = 0.1
  hidden_dropout: float = 0.1
  # HF's options.
  hf_attn: str = "sdpa"  # attn_implementation: sdpa (HF's default) | eager
  hf_adamw: str = "default"  # torch AdamW implementation: default | foreach | fused
  # "bfloat16": forward and loss under torch.autocast("cpu", bfloat16) (bf16 matmuls, fp32
  # parameters and optimizer): the peer of our bf16 rows (model.dtype or model.dot_dtype).
  hf_autocast: str = ""
  seed: int = 0
  # Import encoder_jax from this directory instead (an exported older revision: before/after
  # comparisons of a change in one interleaved run; see train_step.py --variant).
  src: str | None = None
  xla_flags: str = ""  # appended to XLA_FLAGS in this worker (ours only)
  tag: str = ""  # appended to the label, e.g. " @HEAD~1"

  @property
  def label(self) -> str:
    if self.system == "hf":
      return "HF torch BertForPreTraining MLM+NSP" + (" bf16" if self.hf_autocast else "")
    obj = "MLM+NSP" if self.objective == "mlm" and self.nsp else self.objective.upper()
    return f"ours {obj}{self.tag}"

  @property
  def tokens_per_step(self) -> int:
    return self.batch_size * self.seq_len


def model_config(spec: StepSpec):
  from encoder_jax.model.config import BERT_VOCAB_SIZE, model_config_for_size
  return model_config_for_size(
      spec.size, vocab_size=BERT_VOCAB_SIZE, scan_layers=spec.scan_layers,
      remat_policy=spec.remat_policy, dtype=spec.dtype, dot_dtype=spec.dot_dtype,
      param_dtype="float32",
      attention_dropout=spec.attention_dropout, hidden_dropout=spec.hidden_dropout,
      max_positions=max(512, spec.seq_len))


def objective_config(spec: StepSpec):
  """The objective of `spec`'s step, with the trainer's prediction slots for its row length
  (pretraining.default_max_predictions, as encoder_jax.train.setup.objective_config)."""
  from encoder_jax.model.config import BERT_VOCAB_SIZE
  from encoder_jax.objectives.pretraining import default_max_predictions
  from encoder_jax.train.step import ObjectiveConfig
  nsp = spec.nsp and spec.objective == "mlm"
  obj = ObjectiveConfig(objective=spec.objective, sentence_task="nsp" if nsp else "none",
                        vocab_size=BERT_VOCAB_SIZE)
  return dataclasses.replace(obj, max_predictions=default_max_predictions(
      obj.objective, obj.mask_rate, spec.seq_len))


def optim_config():
  """BERT's AdamW (lr 1e-4, 0.9/0.999, eps 1e-6, decay 0.01, clip 1.0); the HF side mirrors it."""
  from encoder_jax.train.optim import OptimConfig
  return OptimConfig(learning_rate=1e-4, warmup_steps=100, total_steps=10_000, eps=1e-6,
                     weight_decay=0.01, clip_grad_norm=1.0)


def build_ours(spec: StepSpec):
  """(Trainer, step, state): the real step from encoder_jax.train.step, nothing bench-specific."""
  import jax
  from encoder_jax.train import optim, step as step_lib
  parts = optim.build_optimizer(optim_config())
  tr, init = step_lib.create(model_config(spec), objective_config(spec), parts.tx,
                             parts.schedule, spec.seed)
  state = jax.jit(init)()
  return tr, step_lib.make_train_step(tr), state


def load_batches(batch_size: int, seq_len: int, n: int, seed: int = 0) -> list[dict]:
  """`n` batches of the demo corpus as BERT SEGMENT-PAIR + NSP rows ([CLS] A [SEP] B [SEP])."""
  from encoder_jax.data import examples, pipeline
  loader = pipeline.pretrain_loader(
      source="demo", vocab="minilm", example=examples.ExampleConfig(
          format="segment_pair", nsp=True, max_length=seq_len, seed=seed),
      global_batch_size=batch_size, seed=seed, process_index=0, process_count=1)
  it = iter(loader)
  keep = ("input_ids", "mask", "token_types", "nsp_label")  # what HF's model receives too
  return [{k: np.asarray(b[k]) for k in keep} for b in (next(it) for _ in range(n))]


def hf_batches(batches: list[dict], seq_len: int, seed: int = 0) -> list[dict]:
  """The same batches corrupted for HF with our corruption rules (80/10/10, exact 15% count,
  never specials), as [B, T] labels (-100 where no prediction): HF's input format."""
  import jax
  import jax.numpy as jnp
  from encoder_jax.objectives.masking import mask_tokens
  obj = objective_config(StepSpec(objective="mlm", seq_len=seq_len))
  mask_frac, random_frac = obj.fractions

  @jax.jit
  def corrupt(key, ids, mask):
    maskable = mask & ~jnp.isin(ids, jnp.asarray(obj.special_ids, ids.dtype))
    m = mask_tokens(key, ids, maskable, vocab_size=obj.vocab_size, mask_id=obj.mask_id,
                    rate=obj.mask_rate, max_predictions=obj.max_predictions,
                    mask_frac=mask_frac, random_frac=random_frac, special_ids=obj.special_ids)
    return m.ids_BxT, m.labels_BxT

  out = []
  for i, b in enumerate(batches):
    ids, labels = corrupt(jax.random.key(seed + i), b["input_ids"], b["mask"])
    out.append(dict(b, input_ids=np.asarray(ids), labels=np.asarray(labels)))
  return out


class _Hf:
  """HF torch BertForPreTraining (MLM at every position + NSP), AdamW, clipping: one step."""

  def __init__(self, spec: StepSpec, batches):
    import torch
    import transformers
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    c, o = model_config(spec), optim_config()  # the model and optimizer of our step
    hcfg = transformers.BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, intermediate_size=c.ffn_size, hidden_act="gelu",
        hidden_dropout_prob=c.hidden_dropout, attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=c.max_positions, type_vocab_size=c.type_vocab_size,
        layer_norm_eps=c.layer_norm_eps)
    self.model = transformers.BertForPreTraining._from_config(
        hcfg, attn_implementation=spec.hf_attn).train()
    kw = {} if spec.hf_adamw == "default" else {spec.hf_adamw: True}
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=o.learning_rate, betas=(o.b1, o.b2),
                                 eps=o.eps, weight_decay=o.weight_decay, **kw)
    self.clip = o.clip_grad_norm
    self.batches = [dict(input_ids=torch.as_tensor(b["input_ids"], dtype=torch.long),
                         attention_mask=torch.as_tensor(b["mask"], dtype=torch.long),
                         token_type_ids=torch.as_tensor(b["token_types"], dtype=torch.long),
                         labels=torch.as_tensor(b["labels"], dtype=torch.long),
                         next_sentence_label=torch.as_tensor(b["nsp_label"], dtype=torch.long))
                    for b in batches]
    self.torch = torch
    self.autocast = (torch.autocast("cpu", dtype=getattr(torch, spec.hf_autocast))
                     if spec.hf_autocast else contextlib.nullcontext())
    self.i = 0
    self.loss = None

  def run(self, n: int):
    for _ in range(n):
      b = self.batches[self.i % len(self.batches)]
      self.i += 1
      self.opt.zero_grad(set_to_none=True)
      with self.autocast:
        loss = self.model(**b).loss
      loss.backward()
      self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
      self.opt.step()
      self.loss = loss

  def info(self) -> dict:
    return {"loss": float(self.loss.detach()) if self.loss is not None else None, **_rss()}


class _Ours:
  """Our jitted step (donated state, metrics left on device; one sync per `run`)."""

  def __init__(self, spec: StepSpec, batches):
    import jax
    self.jax = jax
    t = time.perf_counter()
    self.tr, self.step, self.state = build_ours(spec)
    self.batches = [jax.device_put(b) for b in batches]
    self.metrics = None
    self.i = 0
    self.run(1)  # compile + first step
    self.compile_s = time.perf_counter() - t
    self.checks = self._check_step()

  def _check_step(self) -> dict:
    """One more step under a transfer guard (no host<->device copy may happen inside it, so
    the host never waits for the device within a step), then: was the old state donated?"""
    jax = self.jax
    old = jax.tree.leaves(self.state)
    try:
      with jax.transfer_guard("disallow"):
        self.run(1)
      transfer = "none"
    except Exception as e:  # pylint: disable=broad-except
      transfer = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
      self.run(1)
    # Host callbacks (jax.debug.print, pure_callback, io_callback) would stall every step on
    # the host; they show up as custom calls in the lowered program.
    text = self.step.lower(self.state, self.batches[0]).as_text()
    callbacks = text.count("callback")
    return {"donated": all(x.is_deleted() for x in old), "host_transfer": transfer,
            "host_callbacks": callbacks}

  def run(self, n: int):
    for _ in range(n):
      b = self.batches[self.i % len(self.batches)]
      self.i += 1
      self.state, self.metrics = self.step(self.state, b)
    self.jax.block_until_ready(self.state)

  def info(self) -> dict:
    return {"loss": float(self.metrics["loss"]), "compile_s": self.compile_s, **self.checks,
            **_rss()}


def _rss() -> dict:
  """This process's resident memory now and at its peak (Linux), in bytes."""
  import resource
  out = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
  try:
    with open("/proc/self/statm") as f:
      out["rss"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    pass
  return out


def _load_encoder_jax_from(src: str) -> None:
  """`import encoder_jax` then loads the package under `src` (another revision's tree) instead
  of the installed one: it is loaded from there into sys.modules first, and its submodules
  follow the package's __path__ (no sys.path edit)."""
  import importlib.machinery  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  if "encoder_jax" in sys.modules:
    raise RuntimeError(f"src={src}: encoder_jax was imported in the worker before it could be "
                       "loaded from there")
  found = importlib.machinery.PathFinder.find_spec("encoder_jax", [os.path.abspath(src)])
  if found is None or found.loader is None:
    raise FileNotFoundError(f"src={src}: no encoder_jax/ package in that folder")
  module = importlib.util.module_from_spec(found)
  sys.modules["encoder_jax"] = module
  found.loader.exec_module(module)


def _serve(conn, spec, batches, env: dict[str, str], factory=None):
  os.environ.update(env)  # XLA_FLAGS etc. must be set before jax is imported
  if spec.src:
    _load_encoder_jax_from(spec.src)  # before anything imports encoder_jax
  try:
    system = (factory or (_Hf if spec.system == "hf" else _Ours))(spec, batches)
    if hasattr(system, "warmup"):
      system.warmup()
    else:
      system.run(1)  # warm-up: first-touch allocations, caches
    conn.send(("ready", None))
    while True:
      cmd, arg = conn.recv()
      if cmd == "run":
        wall, cpu = time.perf_counter(), time.process_time()
        system.run(arg)
        conn.send(("ok", (time.perf_counter() - wall, time.process_time() - cpu)))
      elif cmd == "info":
        conn.send(("ok", system.info()))
      else:
        break
  except BaseException as e:  # report to the driver instead of dying silently
    import traceback
    conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
  finally:
    conn.close()


class Worker:
  """A child process holding one system; `run(n)` times n steps there and returns seconds.

  The system is `factory(spec, batches)` built in the child (default: our step or HF's, by
  `spec.system`): a module-level class with `run(n)` and `info() -> dict`, and optionally
  `warmup()` to replace the untimed warm-up step (a learning curve may not skip a step). Any
  spec with `label`, `xla_flags` and `src` fields works (bench/learners.py has its own).
  """

  def __init__(self, spec, batches, env: dict[str, str] | None = None,
               wait: bool = True, factory=None):
    self.spec = spec
    ctx = mp.get_context("spawn")  # fresh interpreter: no inherited jax/torch thread pools
    self._conn, child = ctx.Pipe()
    env = dict(env or {})
    if spec.xla_flags:
      env["XLA_FLAGS"] = " ".join(x for x in (env.get("XLA_FLAGS", os.environ.get(
          "XLA_FLAGS", "")), spec.xla_flags) if x)
    self._proc = ctx.Process(target=_serve, args=(child, spec, batches, env, factory),
                             daemon=True)
    saved = dict(os.environ)
    os.environ.update(env)  # the child's environment is the parent's at start()
    try:
      self._proc.start()
    finally:
      os.environ.clear()
      os.environ.update(saved)
    child.close()
    self._ready = False
    if wait:
      self.wait_ready()

  @property
  def pid(self) -> int | None:
    return self._proc.pid

  def wait_ready(self):
    """Blocks until the child has built, compiled and warmed up its system."""
    if not self._ready:
      self._expect("ready")
      self._ready = True

  def _expect(self, *what):
    kind, payload = self._conn.recv()
    if kind == "error":
      raise RuntimeError(f"worker {self.spec.label} failed:\n{payload}")
    return payload

  def run(self, n: int) -> tuple[float, float]:
    """Runs n steps; returns (wall seconds, CPU seconds of the worker process, all threads)."""
    self.wait_ready()
    self._conn.send(("run", n))
    return tuple(self._expect("ok"))

  def info(self) -> dict[str, Any]:
    self.wait_ready()
    self._conn.send(("info", None))
    return self._expect("ok")

  def close(self):
    try:
      self._conn.send(("stop", None))
    except (BrokenPipeError, OSError):
      pass
    self._proc.join(timeout=30)
    if self._proc.is_alive():
      self._proc.kill()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def matmul_peak(n: int = 2048, repeats: int = 3) -> float:
  """FLOP/s of a jitted fp32 n x n matmul in this process now (median of `repeats`): the
  trainer's encoder_jax.train.flops.measured_cpu_matmul_peak without its per-process cache, so
  calling it between rounds tracks the machine's load."""
  from encoder_jax.train import flops
  return flops.measured_cpu_matmul_peak.__wrapped__(n, repeats)


class ForeignLoad:
  """Cores used by processes other than this benchmark's own (this process and its workers):
  the machine's busy CPU time (/proc/stat) minus ours (/proc/<pid>/stat), over wall time, since
  the last `cores()` call. The load average cannot tell: it counts our own busy workers.
  Linux only (None elsewhere). The readers are arguments so a test can feed fixed numbers."""

  def __init__(self, own_pids, read_stat=None, read_pid=None, clock=time.monotonic):
    self.own_pids = own_pids  # () -> pids of our workers (this process is added)
    self.read_stat = read_stat or _read_proc_stat
    self.read_pid = read_pid or _read_pid_cpu
    self.clock = clock
    self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    self.mark = self._snapshot()

  def _snapshot(self):
    try:
      busy = self.read_stat()
    except OSError:
      return None
    pids = {os.getpid(), *[p for p in self.own_pids() if p]}
    own = sum(self.read_pid(p) for p in pids)
    return self.clock(), busy / self.hz, own / self.hz

  def cores(self) -> float | None:
    now = self._snapshot()
    if now is None or self.mark is None:
      return None
    (t0, busy0, own0), (t1, busy1, own1) = self.mark, now
    self.mark = now
    if t1 <= t0:
      return 0.0
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))


def _read_proc_stat() -> int:
  """Busy jiffies of all CPUs: everything but idle and iowait (first line of /proc/stat)."""
  with open("/proc/stat") as f:
    fields = [int(x) for x in f.readline().split()[1:]]
  return sum(fields[:8]) - fields[3] - fields[4]  # user..steal, without idle and iowait


def _read_pid_cpu(pid: int) -> int:
  """utime + stime + cutime + cstime (jiffies) of a process; 0 once it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rpartition(")")[2].split()
  except OSError:
    return 0
  return sum(int(x) for x in fields[11:15])


def quiet_verdict(foreign_cores: list[float | None], ncores: int, max_share: float
                  ) -> tuple[bool, str]:
  """(quiet?, a line saying why): quiet when the largest foreign load measured, before and
  during the rounds, stays within `max_share` of the cores."""
  seen = [c for c in foreign_cores if c is not None]
  if not seen:
    return True, "other processes' CPU use: not measurable here (no /proc)"
  worst = max(seen)
  quiet = worst <= max_share * ncores
  return quiet, (f"other processes' CPU use: max {worst:.2f} of {ncores} cores (median "
                 f"{statistics.median(seen):.2f}; limit {max_share:.0%} of the cores = "
                 f"{max_share * ncores:.2f}): {'quiet' if quiet else 'LOADED'}")


def loadavg() -> str:
  try:
    with open("/proc/loadavg") as f:
      return " ".join(f.read().split()[:3])
  except OSError:
    return "?"


def interleaved(workers: dict[str, Worker], rounds: int, steps: int, log=print,
                between=None, before=None
                ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
  """(wall, cpu) seconds per step of every worker, `rounds` times; the order of the workers
  is reversed every other round so that slow drift favours none of them. `before()` runs
  before every round and `between()` after it (e.g. a matmul-rate probe, a load reading)."""
  names = list(workers)
  wall: dict[str, list[float]] = {n: [] for n in names}
  cpu: dict[str, list[float]] = {n: [] for n in names}
  for r in range(rounds):
    if before is not None:
      before()
    order = names if r % 2 == 0 else names[::-1]
    for n in order:
      w, c = workers[n].run(steps)
      wall[n].append(w / steps)
      cpu[n].append(c / steps)
    if between is not None:
      between()
    log(f"  round {r + 1}/{rounds} (load {loadavg()}): " +
        "  ".join(f"{n} {wall[n][-1]:.3f}s" for n in names))
  return wall, cpu
