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

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
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

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"ModelConfig.hidden_size={self.hidden_size} is not divisible by "
          f"num_heads={self.num_heads}; choose num_heads that divides hidden_size.")
    for name, choices in (("activation", ACTIVATIONS), ("remat_policy", REMAT_POLICIES),
                          ("position_init", POSITION_INITS), ("position_bias", POSITION_BIASES),
                          ("attention_impl", ATTENTION_IMPLS), ("platform", PLATFORMS),
                          ("dot_dtype", DOT_DTYPES)):
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
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError as e:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not a dtype.") from e

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


# Published sizes (Turc et al. 2019 miniatures, BERT Table 1, ELECTRA Table 6). FFN = 4d.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, ffn_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, ffn_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, ffn_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, ffn_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, ffn_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, ffn_size=4096),
    "electra-small": dict(num_layers=12, hidden_size=256, num_heads=4, ffn_size=1024,
                          embedding_size=128),
}


def model_config_for_size(size: str, **overrides: Any) -> ModelConfig:
  if size not in SIZES:
    raise ValueError(f"Unknown model size {size!r}; choose one of {sorted(SIZES)}.")
  return ModelConfig(**{**SIZES[size], **overrides})
