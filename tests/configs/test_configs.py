"""Configs: every published size loads, CLI overrides reach the frozen ModelConfig."""
import pathlib
import subprocess
import sys

import pytest
from encoder_jax.model import ModelConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
from configs import pretrain  # noqa: E402

EXPECTED = {  # (L, d, h, FFN, embedding) from the BERT / Turc et al. / ELECTRA papers
    "tiny": (2, 128, 2, 512, 128), "mini": (4, 256, 4, 1024, 256),
    "small": (4, 512, 8, 2048, 512), "medium": (8, 512, 8, 2048, 512),
    "base": (12, 768, 12, 3072, 768), "large": (24, 1024, 16, 4096, 1024),
    "electra-small": (12, 256, 4, 1024, 128),
}


def to_model_config(config) -> ModelConfig:
  d = config.model.to_dict()
  d["embedding_size"] = d["embedding_size"] or None
  return ModelConfig.from_dict(d)


@pytest.mark.parametrize("size", sorted(EXPECTED))
def test_sizes(size):
  cfg = to_model_config(pretrain.get_config(f"size={size}"))
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_size,
          cfg.embed_size) == EXPECTED[size]
  assert not cfg.norm_first


def test_norm_and_bad_args():
  assert to_model_config(pretrain.get_config("size=mini,norm=pre")).norm_first
  with pytest.raises(ValueError, match="size"):
    pretrain.get_config("size=huge")
  with pytest.raises(ValueError, match="Bad config argument"):
    pretrain.get_config("objective")


@pytest.mark.parametrize("arg,dropouts,train_path", [
    ("", (0.1, 0.1), "explicit einsum"),  # BERT's recipe
    ("dropout=no_attention", (0.1, 0.0), "jax.nn.dot_product_attention"),
    ("dropout=none", (0.0, 0.0), "jax.nn.dot_product_attention"),
    ("runlocal,precision=fp32", (0.0, 0.0), "jax.nn.dot_product_attention"),  # demo recipe
    ("runlocal,dropout=bert", (0.1, 0.1), "explicit einsum"),
])
def test_dropout_presets_and_the_attention_path_they_train_with(arg, dropouts, train_path):
  from encoder_jax.model.attention import describe_attention
  cfg = to_model_config(pretrain.get_config(arg))
  assert (cfg.hidden_dropout, cfg.attention_dropout) == dropouts
  assert cfg.attention_impl == "auto"
  line = describe_attention(cfg, "cpu")
  assert train_path in line.partition(";")[0], line
  with pytest.raises(ValueError, match=r"dropout='mosaic'.*'bert', 'no_attention', 'none'"):
    pretrain.get_config("dropout=mosaic")


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_the_demo_recipe_picks_its_matmuls_and_attention_by_cpu(monkeypatch, bf16_cpu):
  # precision=auto: bf16 matmuls where the CPU multiplies bf16, and then the explicit attention
  # path (whose einsums take them); fp32 and jax.nn.dot_product_attention elsewhere.
  from encoder_jax.model import matmul
  from encoder_jax.model.attention import describe_attention
  monkeypatch.setattr(matmul, "cpu_has_bf16", lambda: bf16_cpu)
  cfg = to_model_config(pretrain.get_config("runlocal"))
  assert (cfg.dtype, cfg.dot_dtype) == ("float32", "auto")
  line = describe_attention(cfg, "cpu")
  assert ("explicit einsum" if bf16_cpu else "jax.nn.dot_product_attention") in line, line
  assert ("fp32 accumulation" in matmul.describe_dots(cfg.dot_dtype, cfg.dtype, "cpu")) == bf16_cpu
  assert "jax.nn.dot_product_attention" in describe_attention(cfg, "gpu")  # fp32 on a GPU


def test_cli_overrides(tmp_path):
  # config_flags registers the --config.a.b override flags while absl's app.run parses argv;
  # run it the way users do, in a fresh process.
  script = tmp_path / "show.py"
  script.write_text(
      "from absl import app, flags\n"
      "from ml_collections import config_flags\n"
      "config_flags.DEFINE_config_file('config', None, 'cfg', lock_config=True)\n"
      "def main(_):\n"
      "  c = flags.FLAGS.config.model\n"
      "  print(c.num_layers, c.hidden_size, c.hidden_dropout)\n"
      "app.run(main)\n")
  out = subprocess.run(
      [sys.executable, str(script), f"--config={ROOT / 'configs' / 'pretrain.py'}:size=mini",
       "--config.model.num_layers=6", "--config.model.hidden_dropout=0.0"],
      capture_output=True, text=True, check=True, cwd=ROOT)
  assert out.stdout.split() == ["6", "256", "0.0"]
