"""Pre-training config: one model size from the published table, plus run settings.

Run (from the repo root):
  bash run.sh python -m encoder_jax.main --config=configs/pretrain.py:size=mini \
      --workdir=/tmp/run --config.model.num_layers=6
Arguments after ':' are comma-separated key=value pairs:
  size   tiny | mini | small | medium | base | large | electra-small  (default: tiny)
  norm   post | pre   (post-LN BERT block, or pre-LN with a final LayerNorm; default post)
Any leaf can be overridden on the command line: --config.model.hidden_dropout=0.0.
"""
import ml_collections

from encoder_jax.model.config import SIZES, ModelConfig


def parse_arg(arg: str | None, **defaults) -> dict[str, str]:
  """'size=mini,norm=pre' -> {'size': 'mini', 'norm': 'pre'} over defaults; unknown keys raise."""
  out = dict(defaults)
  for part in filter(None, (arg or "").split(",")):
    key, sep, value = part.partition("=")
    if not sep or key not in defaults:
      raise ValueError(f"Bad config argument {part!r}: use key=value with key in "
                       f"{sorted(defaults)}.")
    out[key] = value
  return out


def model_config(size: str, norm: str) -> ml_collections.ConfigDict:
  if size not in SIZES:
    raise ValueError(f"size={size!r}; choose one of {sorted(SIZES)}.")
  if norm not in ("post", "pre"):
    raise ValueError(f"norm={norm!r}; choose 'post' or 'pre'.")
  fields = ModelConfig(**SIZES[size], norm_first=(norm == "pre")).to_dict()
  fields["embedding_size"] = fields["embedding_size"] or 0  # ConfigDict leaves need a type
  return ml_collections.ConfigDict(fields)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, size="tiny", norm="post")
  config = ml_collections.ConfigDict()
  config.size = args["size"]
  config.model = model_config(args["size"], args["norm"])
  config.seed = 0
  return config
