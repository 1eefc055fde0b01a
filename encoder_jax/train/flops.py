"""Analytic FLOPs per training step (encoder, heads, ELECTRA generator) and MFU.

Convention (stated once, used everywhere):
  * A matmul of [m, k] x [k, n] is 2*m*k*n FLOPs (multiply + add), as in ELECTRA's
    flops_computation.py and the "6N" rule. Only matmuls are counted: biases, LayerNorm,
    activations, softmax and dropout are O(d) per token (~1% of a BERT-base step) and left out.
  * Forward, per sequence of T tokens, per layer: QKV 2*T*d*3d, attention output 2*T*d*d,
    FFN 2*T*2*d*f (a gated FFN: 2*T*3*d*f), attention scores QK^T 2*T*T*d and the weighted sum
    of values 2*T*T*d. Sliding-window layers are counted as the full T x T they compute (every
    attention path here masks a dense score matrix; no kernel skips the masked blocks).
    Embedding lookups are gathers (0 FLOPs); an embedding projection e -> d (ELECTRA-small)
    is 2*T*e*d. Heads: MLM 2*d*e + 2*e*V per predicted position (transform + tied decoder),
    counted at max_predictions positions (sparse prediction) or at all T; NSP/SOP pooler +
    classifier 2*d*d + 2*d*2 per sequence; RTD 2*d*d + 2*d per token.
  * Training = (1 + backward_factor) * forward, backward_factor = 2 by default: the backward
    pass of a matmul is two matmuls (input gradient and weight gradient), so the matmul part
    is exactly 6 * params * tokens. ELECTRA's script instead takes backward == forward
    (backward_factor=1) and counts the embedding lookup as a dense one-hot matmul 2*e*V per
    token (`dense_embedding_lookup=True`); with both set, and its output_frac = P / T, this
    module reproduces the paper's Table 1 figures within ~2% (it omits their elementwise ops).
  * The padded batch is what the hardware computes, so every position counts, pad or not.
  * ELECTRA: generator (its own ModelConfig: a fraction of the width; with tied embeddings its
    embedding_size is the discriminator's) forward+backward with the MLM head at the masked
    positions, plus the discriminator with the RTD head at every position.

MFU = achieved model FLOP/s / peak, with the peak per device from `peak_flops_per_device` (the
vendors' dense bf16 figures). A CPU has no spec-sheet figure XLA reaches: its peak is the best
matmul rate measured on this machine for the operand type the model's matmuls use (fp32, or
bf16 operands with fp32 accumulation on a CPU with AVX-512 BF16 / AMX), measured ONCE per
machine and kept in <cache>/cpu_peak.json (`cpu_peak`), so every run on a machine divides by
the same stated figure (a per-run measurement came out 80-127 GFLOP/s over five runs on one
machine, and MFU read 114-121%). A run whose MFU still exceeds 100% says why
(`mfu_above_peak_note`).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import time

import jax
import jax.numpy as jnp

from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.pretraining import OBJECTIVES


def block_matmul_params(cfg: ModelConfig) -> int:
  """Weights of the dense layers in one block: QKV + output (4*d*d) + FFN (2*d*f, or 3*d*f
  for a gated FFN, GeGLU / SwiGLU: two input projections of f and the output one)."""
  d = cfg.hidden_size
  return 4 * d * d + (3 if cfg.glu else 2) * d * cfg.ffn_size


def forward_flops(cfg: ModelConfig, *, batch_size: int, seq_len: int,
                  mlm_positions: int = 0, nsp: bool = False, rtd: bool = False,
                  copy_head: bool = False, dense_embedding_lookup: bool = False,
                  prefix: str = "") -> dict[str, float]:
  """Forward FLOPs of one step, by component (keys prefixed with `prefix`).

  mlm_positions: MLM head rows per sequence (max_predictions if sparse, seq_len if dense, 0 none).
  """
  B, T = batch_size, seq_len
  d, e, V, L = cfg.hidden_size, cfg.embed_size, cfg.vocab_size, cfg.num_layers
  if T > cfg.max_positions:
    raise ValueError(f"seq_len={T} exceeds max_positions={cfg.max_positions} of the model.")
  if not 0 <= mlm_positions <= T:
    raise ValueError(f"mlm_positions={mlm_positions} must be in [0, seq_len={T}].")
  out = {
      "embedding_lookup": 2.0 * e * V * T * B if dense_embedding_lookup else 0.0,
      "embedding_projection": 2.0 * e * d * T * B if e != d else 0.0,
      "block_dense": 2.0 * L * block_matmul_params(cfg) * T * B,
      "attention": 4.0 * L * T * T * d * B,
      "mlm_head": (2.0 * d * e + 2.0 * e * V) * mlm_positions * B,
      "nsp_head": (2.0 * d * d + 4.0 * d) * B if nsp else 0.0,
      "rtd_head": (2.0 * d * d + 2.0 * d) * T * B if rtd else 0.0,
      "copy_head": 2.0 * d * T * B if copy_head else 0.0,
  }
  return {prefix + k: v for k, v in out.items()}


def train_flops_breakdown(cfg: ModelConfig, *, batch_size: int, seq_len: int,
                          objective: str = "mlm", max_predictions: int = 20,
                          sparse_mlm: bool = True, nsp: bool = False,
                          generator: ModelConfig | None = None, backward_factor: float = 2.0,
                          dense_embedding_lookup: bool = False) -> dict[str, float]:
  """Training FLOPs of one step (forward + backward), by component; generator keys "gen_"."""
  if objective not in OBJECTIVES:
    raise ValueError(f"objective={objective!r}; choose one of {OBJECTIVES}.")
  needs_gen = objective != "mlm"
  if needs_gen and generator is None:
    raise ValueError(f"objective={objective!r} trains a generator; pass generator=ModelConfig "
                     "of the generator.")
  if not needs_gen and generator is not None:
    raise ValueError("objective='mlm' has no generator; drop generator= or pick an ELECTRA "
                     "objective.")
  P = max_predictions if sparse_mlm else seq_len
  common = dict(batch_size=batch_size, seq_len=seq_len,
                dense_embedding_lookup=dense_embedding_lookup)
  if objective in ("mlm", "replace_mlm"):
    fwd = forward_flops(cfg, mlm_positions=P, nsp=nsp, **common)
  elif objective == "all_tokens_mlm":
    fwd = forward_flops(cfg, mlm_positions=seq_len, nsp=nsp, copy_head=True, **common)
  else:  # electra, electra_15: the RTD head runs at every position either way
    fwd = forward_flops(cfg, rtd=True, nsp=nsp, **common)
  if needs_gen:
    fwd |= forward_flops(generator, mlm_positions=P, prefix="gen_", **common)
  return {k: (1.0 + backward_factor) * v for k, v in fwd.items()}


def train_flops_per_step(cfg: ModelConfig, **kwargs) -> float:
  """Total training FLOPs of one step; arguments as `train_flops_breakdown`."""
  return float(sum(train_flops_breakdown(cfg, **kwargs).values()))


# Dense (no 2:4 sparsity) bf16 peak FLOP/s per JAX device, from the vendors' spec sheets.
# TPU v2/v3 expose each TensorCore as a device (half a chip); v4/v5p (megacore), v5e, v6e
# expose one device per chip.
_TPU_PEAK = {
    "tpu v2": 22.5e12, "tpu v3": 61.5e12, "tpu v4": 275e12,
    "tpu v5 lite": 197e12, "tpu v5e": 197e12, "tpu v5": 459e12, "tpu v5p": 459e12,
    "tpu v6 lite": 918e12, "tpu v6e": 918e12,
}
# GPUs by substring of device_kind, most specific first (SXM figures unless the kind says PCIe/NVL).
_GPU_PEAK = (
    ("h100 pcie", 756e12), ("h200 nvl", 835e12), ("h100", 989e12), ("h200", 989e12),
    ("a100", 312e12), ("v100", 125e12),
)


def peak_flops_per_device(device_kind: str | None = None, dtype: str = "float32") -> float:
  """Peak FLOP/s of one device of this kind (default: jax.devices()[0]). TPU/GPU: the vendors'
  dense bf16 figure. CPU: `cpu_peak(dtype)` (measured once per machine, cached): `dtype` is the
  type of the model's matmul operands, "float32" or "bfloat16"."""
  kind = (device_kind if device_kind is not None else jax.devices()[0].device_kind).lower()
  if kind == "cpu" or kind.startswith("cpu"):
    return cpu_peak(dtype)["flops_per_s"]
  if kind in _TPU_PEAK:
    return _TPU_PEAK[kind]
  for key, peak in _GPU_PEAK:
    if key in kind:
      return peak
  raise ValueError(f"No peak FLOP/s known for device kind {kind!r}; pass the peak explicitly "
                   "(--config.train.peak_flops=<FLOP/s per device>) or add it to "
                   "flops._TPU_PEAK/_GPU_PEAK.")


def measured_cpu_matmul_peak(n: int = 2048, repeats: int = 7, dtype: str = "float32") -> float:
  """FLOP/s of the fastest of `repeats` timed n x n matmuls on the first device.

  "float32": a plain fp32 matmul. "bfloat16": bf16 operands with fp32 accumulation through the
  model's own matmul path (encoder_jax.model.matmul.einsum), the dots a model with bf16 dots
  runs on a CPU. The fastest run, not the median: a peak is what the machine can do, and
  slower runs are other work on the machine (the median of 5 moved 80-127 GFLOP/s between
  runs on one 2-core machine; the best of 7 is far steadier)."""
  from encoder_jax.model import matmul as matmul_lib  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  if dtype == "bfloat16":
    f = jax.jit(lambda x, y: matmul_lib.einsum("mk,kn->mn", x, y, bf16=True,
                                                out_dtype=jnp.float32))
  elif dtype == "float32":
    f = jax.jit(jnp.matmul)
  else:
    raise ValueError(f"dtype={dtype!r}; the CPU peak is measured for 'float32' or 'bfloat16'.")
  f(a, b).block_until_ready()  # compile and warm up
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n ** 3 / best


CPU_PEAK_FILE = "cpu_peak.json"


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                  "")
  except OSError:
    name = ""
  return name or platform.processor() or platform.machine()


def cpu_machine_key(dtype: str) -> str:
  """What a cached CPU peak is valid for: the CPU model, the cores this process may use, the
  jax version (XLA's kernels) and the operand dtype."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return f"{_cpu_name()} | {cores} cores | jax {jax.__version__} | {dtype}"


def cpu_peak(dtype: str = "float32", cache_dir=None) -> dict:
  """{"flops_per_s", "measured" (date), "key", "file"}: this machine's CPU matmul peak for
  `dtype`, measured once (`measured_cpu_matmul_peak`) and cached in <cache>/cpu_peak.json under
  `cpu_machine_key(dtype)`. Delete the file (or its entry) to measure again. The environment
  variable ENCODER_JAX_CPU_PEAK (FLOP/s) states the figure instead: the test-suite sets it, so
  that a measurement taken while the tests load the machine never becomes the user's peak."""
  from encoder_jax.data.fetch import cache_root  # pylint: disable=g-import-not-at-top
  key = cpu_machine_key(dtype)
  if os.environ.get("ENCODER_JAX_CPU_PEAK"):  # a stated figure (the test-suite sets one)
    return {"flops_per_s": float(os.environ["ENCODER_JAX_CPU_PEAK"]), "measured": "given",
            "key": key, "file": "$ENCODER_JAX_CPU_PEAK"}
  path = cache_root(cache_dir) / CPU_PEAK_FILE
  try:
    known = json.loads(path.read_text())
  except (OSError, ValueError):
    known = {}
  if key not in known:
    known[key] = {"flops_per_s": measured_cpu_matmul_peak(dtype=dtype),
                  "measured": datetime.date.today().isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, path)
  return dict(known[key], key=key, file=str(path))


def peak_of_mesh(mesh, peak_per_device: float = 0.0,
                 dtype: str = "float32") -> tuple[int, float, str]:
  """(devices the MFU is counted over, peak FLOP/s of each, where that figure comes from) for a
  step on `mesh`.

  TPU/GPU: every device of the mesh, at the spec-sheet peak of its kind (the kind the step
  really runs on, not jax.devices()[0]'s). CPU: fake devices share their host's cores and the
  peak is this machine's cached measurement for the matmul operand `dtype` (`cpu_peak`), so the
  count is the number of processes (hosts) in the mesh. `peak_per_device` > 0 overrides the
  peak (config.train.peak_flops).
  """
  devices = list(mesh.devices.flat)
  kind = devices[0].device_kind
  if peak_per_device:
    return (len({d.process_index for d in devices}) if devices[0].platform == "cpu"
            else len(devices)), peak_per_device, f"{kind}, train.peak_flops"
  if devices[0].platform == "cpu":
    peak = cpu_peak(dtype)
    return (len({d.process_index for d in devices}), peak["flops_per_s"],
            f"{kind}, {dtype} matmuls, measured {peak['measured']}, cached in {peak['file']}")
  return len(devices), peak_flops_per_device(kind), f"{kind}, spec sheet"


def mfu_above_peak_note(mfu_value: float | None) -> str:
  """'' at or below 100%; otherwise why a model-FLOPs utilisation can read above 100%."""
  if mfu_value is None or mfu_value <= 1.0:
    return ""
  return ("MFU above 100%: the step ran faster than the peak it is divided by (on a CPU, the "
          "cached measurement of this machine's matmul rate, taken when other work may have "
          "been running); delete the cached entry to measure again, or give "
          "--config.train.peak_flops")


def throughput(flops_per_step: float, step_time_s: float, n_devices: int,
               peak_per_device: float) -> dict[str, float]:
  """Global FLOP/s, FLOP/s per device and MFU over all `n_devices` (see peak_of_mesh)."""
  flops_per_s = flops_per_step / step_time_s
  return {"flops_per_s": flops_per_s, "flops_per_s_per_device": flops_per_s / n_devices,
          "mfu": mfu(flops_per_step, step_time_s, n_devices, peak_per_device)}


def mfu(flops_per_step: float, step_time_s: float, n_devices: int, peak_per_device: float
        ) -> float:
  """Model FLOPs utilisation: flops_per_step / (step_time_s * n_devices * peak_per_device).

  flops_per_step is the global step's (all devices); n_devices and peak_per_device come from
  peak_of_mesh (on CPU the measured peak is the whole host's, so n_devices counts hosts).
  """
  if step_time_s <= 0 or n_devices < 1 or peak_per_device <= 0:
    raise ValueError(f"step_time_s={step_time_s}, n_devices={n_devices} and peak_per_device="
                     f"{peak_per_device} must all be positive.")
  return flops_per_step / (step_time_s * n_devices * peak_per_device)
