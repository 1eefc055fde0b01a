"""The frozen model config: the only thing layers see of a run's configuration.

Layers never receive an `ml_collections.ConfigDict`; `ModelConfig.from_dict` turns the
`config.model` part of a run config into this small, hashable, immutable value (so it can be a
static argument of `jax.jit` and a dict key for compiled-function caches).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
NORMS = ("layernorm", "rmsnorm")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "pallas", "explicit")
DOT_DTYPES = ("", "bfloat16", "auto")
POSITION_INITS = ("normal", "sinusoidal")
POSITION_BIASES = ("none", "alibi")
PLATFORMS = ("", "cpu", "gpu", "tpu")
# BERT's uncased WordPiece vocabulary (Devlin et al. 2019; also MiniLM's, data.vocab "minilm").
BERT_VOCAB_SIZE = 30522


def dataclass_from_mapping(cls, d: Mapping[str, Any], what: str):
  """cls(**d) from a mapping or ConfigDict, naming unknown keys and the valid ones."""
  d = dict(d.to_dict() if hasattr(d, "to_dict") else d)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"Unknown {what} config keys {unknown}; valid keys: {sorted(names)}.")
  return cls(**d)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and numerics of one encoder. Defaults are BERT-base (uncased vocab)."""

  vocab_size: int = BERT_VOCAB_SIZE
  hidden_size: int = 768  # d
  num_layers: int = 12  # L
  num_heads: int = 12  # h
  ffn_size: int = 3072  # usually 4d
  max_positions: int = 512
  type_vocab_size: int = 2  # segment A / B embeddings; 0 disables them
  # Width of the token/position/type embeddings. None -> hidden_size. When it differs (ELECTRA
  # small: 128 -> 256) a dense projection maps embeddings to hidden_size, and the tied MLM
  # decoder works in this width.
  embedding_size: int | None = None
  norm_first: bool = False  # False: BERT post-LN block; True: pre-LN block + final LayerNorm
  activation: str = "gelu"  # exact (erf) GELU as BERT; "gelu_tanh" is the approximation
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02  # std of the truncated normal init (BERT)
  dtype: str = "float32"  # compute dtype (activations, matmuls)
  param_dtype: str = "float32"  # storage dtype of the parameters
  scan_layers: bool = True  # nnx.scan over stacked blocks (fast compile) vs an unrolled list
  remat_policy: str = "none"  # rematerialisation of each block: none | full | dots | dots_no_batch
  # How attention is computed (encoder_jax.model.attention.attention_path decides, and the
  # trainer logs the choice at start-up). Attention-probability dropout (attention_dropout > 0
  # in train mode, BERT's 0.1) needs the probabilities, which the fused call does not expose:
  # training then always runs the explicit path, whatever this says. Otherwise:
  #   "auto"      cuDNN flash attention on GPU in bf16/fp16 (XLA if jax rejects the shapes),
  #               the Pallas TPU flash attention kernel on TPU (XLA where its blocks do not
  #               tile the rows: row length not a multiple of 128), XLA elsewhere (CPU, GPU
  #               in fp32);
  #   "xla"       jax.nn.dot_product_attention's XLA implementation (any device);
  #   "cudnn"     jax.nn.dot_product_attention with cuDNN flash attention (GPU, bf16/fp16;
  #               raises where it cannot run instead of falling back);
  #   "pallas"    jax.experimental.pallas.ops.tpu.flash_attention (TPU; on CPU only under
  #               a Pallas interpret mode, as tests/model/test_pallas_attention.py runs it);
  #               padding and packed segments become its segment ids, ALiBi its bias;
  #   "explicit"  the einsum + fp32 softmax path (what dropout forces), even without dropout.
  # jax itself never picks cuDNN (its default is XLA). bench/gpu.py measures both on a GPU.
  attention_impl: str = "auto"
  # Matmul operands (encoder_jax.model.matmul): "" = in `dtype`; "bfloat16" = rounded to bf16,
  # accumulated in fp32, the result back in `dtype`, forward and backward (torch CPU autocast's
  # split: fp32 activations, bf16 matmuls; configs/pretrain.py precision=bf16_dots); "auto" =
  # "bfloat16" on a CPU backend whose CPU has AVX-512 BF16 / AMX, "" elsewhere (decided where
  # the model is built, so one config serves every machine). A bf16 model (dtype="bfloat16")
  # takes the bf16 dots on CPU, where XLA's bf16-result dots are slower than fp32.
  dot_dtype: str = ""
  pad_token_id: int = 0
  # How the learned absolute position table starts: "normal" (BERT: truncated normal of
  # initializer_range) or "sinusoidal" (Vaswani et al.'s sin/cos table at the same scale;
  # still a learned parameter, same checkpoint layout).
  position_init: str = "normal"
  # Extra attention bias from relative distance: "none" (BERT) or "alibi" (Press et al. 2022,
  # symmetric for a bidirectional encoder as in MosaicBERT: -slope_n * |i - j| per head n).
  position_bias: str = "none"
  # The platform the model is compiled for, which every "auto" decided while tracing reads
  # (attention_impl, dot_dtype): "" = JAX's default backend. The trainer sets it to the
  # platform it compiles for, so a step compiled ahead of time for a TPU topology on a CPU
  # host (encoder_jax.train.compile_check) traces the TPU's program, not the host's.
  platform: str = ""
  # Rows of the token table (and width of the MLM logits) rounded up to a multiple of this:
  # 128 fills whole MXU / tensor-core tiles and lets the table split evenly over a mesh axis
  # (BERT's 30,522 -> 30,592). Padded ids are never predicted: their logits are masked
  # (heads.MlmHead) and their rows start at zero and get no gradient. 1 = no padding, the
  # layout of every checkpoint written before the field existed (configs/pretrain.py pads
  # new runs; encoder_jax.model.vocab_padding.unpad_vocab strips it for export).
  vocab_pad_multiple: int = 1

  # ---- Block switches. Each is read where its sublayer is built (model/sublayers.py,
  # attention.py, rotary.py, encoder.py); the defaults are BERT's block, so a config that sets
  # none of them builds today's parameter tree and computes today's numbers.
  # The norm of every block, the embeddings and the heads: "layernorm" (Ba et al. 2016) or
  # "rmsnorm" (Zhang & Sennrich 2019: x / rms(x) * scale, no mean, no bias).
  norm: str = "layernorm"
  norm_bias: bool = True  # LayerNorm's additive bias (ModernBERT: False); RMSNorm has none
  # Biases of the hidden linears: attention QKV and output, FFN, embedding projection, and
  # the heads' hidden transforms (MLM head, pooler, RTD dense). Layers that output logits
  # (MLM decoder bias, NSP, RTD, classifiers) keep theirs, as in ModernBERT.
  linear_bias: bool = True
  # Gated FFN (Shazeer 2020): act(x W) * (x V) then the output projection, W and V stored as
  # one [D, 2, F] kernel; activation="gelu" is GeGLU, "silu" SwiGLU. ffn_size is F.
  glu: bool = False
  learned_positions: bool = True  # the absolute position table (False: none, e.g. with RoPE)
  # Rotary position embeddings on queries and keys (Su et al. 2021, RoFormer), in the
  # rotate-half layout (pairs (i, i + H/2)) of GPT-NeoX / HF; wavelengths from theta, one theta
  # for global layers and one for local (sliding-window) layers (ModernBERT: 160,000 / 10,000).
  rope: bool = False
  rope_theta: float = 10_000.0
  rope_theta_local: float = 10_000.0
  # Sliding-window local attention: 0 = every layer global. Otherwise the total window (HF
  # ModernBertConfig.local_attention): a query sees keys with |i - j| <= local_window // 2, in
  # every layer but the global ones, which are layer i with i % global_every == 0 (ModernBERT:
  # 128, i.e. 64 each side, every third layer global starting with layer 0).
  local_window: int = 0
  global_every: int = 1
  embedding_norm: bool = True  # the norm after the embeddings (BERT's embedding LayerNorm)
  # False: layer 0's attention reads the embedding norm's output as it is, without a pre-norm
  # of its own (ModernBERT: the stream it would normalise was normalised just before). Needs
  # norm_first and embedding_norm. With scan_layers, layer 0 is then built outside the stack
  # (Encoder.first_block) and the stack holds layers 1..L-1.
  first_attn_norm: bool = True

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"ModelConfig.hidden_size={self.hidden_size} is not divisible by "
          f"num_heads={self.num_heads}; choose num_heads that divides hidden_size.")
    for name, choices in (("activation", ACTIVATIONS), ("remat_policy", REMAT_POLICIES),
                          ("position_init", POSITION_INITS), ("position_bias", POSITION_BIASES),
                          ("attention_impl", ATTENTION_IMPLS), ("platform", PLATFORMS),
                          ("dot_dtype", DOT_DTYPES), ("norm", NORMS)):
      if (value := getattr(self, name)) not in choices:
        # platform is set from the backend the run is on (train.setup), not by a flag.
        flag = "" if name == "platform" else f" (--config.model.{name})"
        empty = {"platform": " ('' = JAX's default backend)", "dot_dtype": " ('' = the compute "
                 "dtype)"}.get(name, "")
        raise ValueError(f"ModelConfig.{name}={value!r}{flag}; use one of {choices}{empty}.")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size",
                 "max_positions", "vocab_pad_multiple"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)} must be positive.")
    self._check_block_switches()
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not a dtype.") from e

  def _check_block_switches(self) -> None:
    if self.local_window < 0 or self.global_every < 1:
      raise ValueError(f"ModelConfig.local_window={self.local_window} must be >= 0 (0: global "
                       f"attention only) and global_every={self.global_every} >= 1.")
    if self.rope and (self.rope_theta <= 0 or self.rope_theta_local <= 0):
      raise ValueError(f"ModelConfig.rope_theta={self.rope_theta} and rope_theta_local="
                       f"{self.rope_theta_local} must be positive.")
    if self.rope and self.head_dim % 2:
      raise ValueError(f"ModelConfig.rope=True rotates pairs of head dimensions, but head_dim="
                       f"{self.head_dim} is odd; choose hidden_size / num_heads even.")
    if not self.first_attn_norm and not (self.norm_first and self.embedding_norm):
      raise ValueError("ModelConfig.first_attn_norm=False lets layer 0 read the embedding "
                       "norm's output in place of its attention pre-norm: it needs "
                       f"norm_first=True and embedding_norm=True (got norm_first="
                       f"{self.norm_first}, embedding_norm={self.embedding_norm}).")

  @property
  def global_layers(self) -> tuple[bool, ...]:
    """Per layer: True where it attends globally, False where within the local window."""
    return tuple(self.local_window == 0 or i % self.global_every == 0
                 for i in range(self.num_layers))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the token table: vocab_size rounded up to a multiple of vocab_pad_multiple."""
    m = self.vocab_pad_multiple
    return -(-self.vocab_size // m) * m

  @property
  def embed_size(self) -> int:
    """Width of the embedding tables (embedding_size, or hidden_size when unset)."""
    return self.embedding_size or self.hidden_size

  @property
  def backend(self) -> str:
    """The platform "auto" choices are made for: `platform`, or JAX's default backend."""
    return self.platform or jax.default_backend()

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def storage_dtype(self):
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a mapping (e.g. `config.model` of a ConfigDict); unknown keys are an error."""
    return dataclass_from_mapping(cls, d, "model")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# The block switches, BERT's value of each, and how an error message names a departure.
_BERT_BLOCK = (
    ("norm", "layernorm", "RMSNorm (model.norm='rmsnorm')"),
    ("norm_bias", True, "norms without bias (model.norm_bias=False)"),
    ("linear_bias", True, "linears without bias (model.linear_bias=False)"),
    ("glu", False, "a gated FFN (model.glu=True)"),
    ("learned_positions", True, "no learned position table (model.learned_positions=False)"),
    ("rope", False, "rotary position embeddings (model.rope=True)"),
    ("local_window", 0, "sliding-window local attention (model.local_window > 0)"),
    ("embedding_norm", True, "no norm after the embeddings (model.embedding_norm=False)"),
    ("first_attn_norm", True, "no attention pre-norm in layer 0 (model.first_attn_norm=False)"),
)


def bert_block_departures(cfg: ModelConfig) -> list[tuple[str, Any, str]]:
  """The block switches `cfg` sets away from BERT's block, as (field, BERT's value, phrase)
  (empty for BERT's block): what a converter to a BERT-block format (HF BERT, RoBERTa,
  ELECTRA) must refuse, besides pre-LN, ALiBi and the activation, which those formats name
  themselves."""
  return [(name, bert, why) for name, bert, why in _BERT_BLOCK
          if getattr(cfg, name) != bert and not (name == "local_window" and all(
              cfg.global_layers)) and not (name == "norm_bias" and cfg.norm == "rmsnorm")]


# ModernBERT's block (Warner et al. 2024, arXiv 2412.13663, section 2.1 and Table 3; HF
# ModernBertConfig's defaults): pre-norm with a norm after the embeddings that stands in for
# layer 0's attention pre-norm, LayerNorm without bias (eps 1e-5), no linear biases, GeGLU,
# RoPE (theta 160,000 global / 10,000 local), local attention over 128 tokens in two layers of
# three (every third global from layer 0), no absolute positions, no token types, 8,192
# positions, no dropout. The vocabulary is the tokenizer's (ModernBERT's own: 50,368).
MODERNBERT_BLOCK: dict[str, Any] = dict(
    norm_first=True, first_attn_norm=False, norm_bias=False, linear_bias=False,
    layer_norm_eps=1e-5, glu=True, activation="gelu", learned_positions=False, rope=True,
    rope_theta=160_000.0, rope_theta_local=10_000.0, local_window=128, global_every=3,
    type_vocab_size=0, max_positions=8192, hidden_dropout=0.0, attention_dropout=0.0)

# Published sizes (Turc et al. 2019 miniatures, BERT Table 1, ELECTRA Table 6; BERT's FFN = 4d;
# ModernBERT: arXiv 2412.13663 Table 3, GeGLU FFN of 1152 / 2624).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, ffn_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, ffn_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, ffn_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, ffn_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, ffn_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, ffn_size=4096),
    "electra-small": dict(num_layers=12, hidden_size=256, num_heads=4, ffn_size=1024,
                          embedding_size=128),
    "modernbert-base": dict(num_layers=22, hidden_size=768, num_heads=12, ffn_size=1152,
                            **MODERNBERT_BLOCK),
    "modernbert-large": dict(num_layers=28, hidden_size=1024, num_heads=16, ffn_size=2624,
                             **MODERNBERT_BLOCK),
}


def model_config_for_size(size: str, **overrides: Any) -> ModelConfig:
  if size not in SIZES:
    raise ValueError(f"Unknown model size {size!r}; choose one of {sorted(SIZES)}.")
  return ModelConfig(**{**SIZES[size], **overrides})
