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


def to_model_config(config, backend="cpu") -> ModelConfig:
  from encoder_jax.train.setup import model_config
  return model_config(config, config.model.vocab_size, backend)


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
    # fp32: precision=auto would take the bf16 dots (and their explicit path) on a CPU with
    # AVX-512 BF16 (test_the_demo_recipe_picks_its_matmuls_and_attention_by_cpu)
    ("dropout=no_attention,precision=fp32", (0.1, 0.0), "jax.nn.dot_product_attention"),
    ("dropout=none,precision=fp32", (0.0, 0.0), "jax.nn.dot_product_attention"),
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


def test_the_demo_recipe_is_modernberts_block_and_exports():
  """runlocal's block (block=modern, the default) is one transformers holds: export writes it
  as ModernBertForMaskedLM. Its gated FFN of 344 costs what the plain FFN of 512 did (three
  128 x 344 matrices to two 128 x 512). block=alibi is the recipe before, which none holds."""
  from encoder_jax import hf as load
  from encoder_jax.objectives.pretraining import ObjectiveConfig
  demo = to_model_config(pretrain.get_config("runlocal"))
  family, gaps = load.exporting_family(demo, ObjectiveConfig())
  assert family is not None and family.name == "ModernBERT", gaps
  assert (demo.num_layers, demo.hidden_size, demo.num_heads) == (2, 128, 8)
  assert demo.glu and demo.rope and not demo.learned_positions and demo.position_bias == "none"
  assert demo.ffn_size == 344 and abs(3 * 344 - 2 * 512) / (2 * 512) < 0.01
  assert demo.local_window == 16 and demo.global_layers == (True, False)
  old = to_model_config(pretrain.get_config("runlocal,block=alibi"))
  assert (old.position_bias, old.ffn_size, old.glu, old.learned_positions) == (
      "alibi", 512, False, True)
  assert load.exporting_family(old, ObjectiveConfig())[0] is None
  # post-LN keeps layer 0's own attention norm (the embedding norm stands in only pre-LN)
  assert to_model_config(pretrain.get_config("runlocal,norm=post")).first_attn_norm
  with pytest.raises(ValueError, match="block=alibi picks the demo recipe's block: add runlocal"):
    pretrain.get_config("block=alibi")
  with pytest.raises(ValueError, match=r"block='bert'; choose one of \['modern', 'alibi'\]"):
    pretrain.get_config("runlocal,block=bert")


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


@pytest.mark.parametrize("backend,layers", [("cpu", (False, "none")), ("tpu", (True, "dots")),
                                            ("gpu", (True, "dots"))])
def test_layer_layout_is_picked_by_platform(backend, layers):
  # Unrolled layers without remat on CPU, scanned layers with `dots` remat on TPU/GPU
  # (measured: configs/pretrain.py model_config); an explicit choice wins on every platform.
  from encoder_jax.train.setup import ConfigError, resolve_layers
  cfg = to_model_config(pretrain.get_config("size=base"), backend)
  assert (cfg.scan_layers, cfg.remat_policy) == layers
  c = pretrain.get_config("size=base")
  c.model.scan_layers = "False"  # what --config.model.scan_layers=False gives
  forced = to_model_config(c, backend)
  assert (forced.scan_layers, forced.remat_policy) == (False, "none")
  c.model.update(dict(scan_layers="true", remat_policy="full"))
  forced = to_model_config(c, backend)
  assert (forced.scan_layers, forced.remat_policy) == (True, "full")
  # The demo recipe keeps its measured scan + full remat everywhere.
  demo = to_model_config(pretrain.get_config("runlocal"), backend)
  assert (demo.scan_layers, demo.remat_policy) == (True, "full")
  assert resolve_layers(False, "auto", backend) == (False, "none")
  assert resolve_layers("AUTO", " Auto", "cpu") == (False, "none")  # "auto" read one way
  with pytest.raises(ConfigError, match="model.scan_layers='scan'"):
    resolve_layers("scan", "auto", backend)


def test_a_run_records_its_layout_and_a_resume_keeps_it(tmp_path):
  # A new run writes the resolved layout into its config (config.json records it, so export
  # and fine-tuning read the checkpoints' structure); a run resumed on another platform keeps
  # the layout its checkpoints were written with.
  import json
  from encoder_jax.train.setup import CONFIG_FILE, settle_layers
  new = pretrain.get_config("size=mini")
  settle_layers(new, tmp_path / "fresh", backend="cpu")
  assert (new.model.scan_layers, new.model.remat_policy) == ("False", "none")
  (tmp_path / CONFIG_FILE).write_text(json.dumps({"model": {"scan_layers": "True"}}))
  resumed = pretrain.get_config("size=mini")
  settle_layers(resumed, tmp_path, backend="cpu")
  assert (resumed.model.scan_layers, resumed.model.remat_policy) == ("True", "dots")
  # Runs from before "auto" recorded a JSON bool.
  (tmp_path / CONFIG_FILE).write_text(json.dumps({"model": {"scan_layers": True}}))
  old = pretrain.get_config("size=mini")
  settle_layers(old, tmp_path, backend="cpu")
  assert (old.model.scan_layers, old.model.remat_policy) == ("True", "dots")
  forced = pretrain.get_config("size=mini")
  forced.model.scan_layers = "False"  # an explicit choice is the user's, recorded or not
  settle_layers(forced, tmp_path, backend="tpu")
  assert (forced.model.scan_layers, forced.model.remat_policy) == ("False", "none")


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
      "  print(c.num_layers, c.hidden_size, c.hidden_dropout, c.scan_layers)\n"
      "app.run(main)\n")
  out = subprocess.run(
      [sys.executable, str(script), f"--config={ROOT / 'configs' / 'pretrain.py'}:size=mini",
       "--config.model.num_layers=6", "--config.model.hidden_dropout=0.0",
       "--config.model.scan_layers=False"],
      capture_output=True, text=True, check=True, cwd=ROOT)
  assert out.stdout.split() == ["6", "256", "0.0", "False"]


@pytest.mark.parametrize("size,lr,warmup", [("base", 6e-4, 24_000), ("large", 4e-4, 30_000)])
def test_roberta_recipe_is_table_9(size, lr, warmup):
  """recipe=roberta: RoBERTa's pre-training hyperparameters (Liu et al. 2019, Appendix Table 9),
  a byte-level BPE of the released size, FULL-SENTENCES packed, no NSP, dynamic masking."""
  from encoder_jax.data import tokenizer, vocab as vocab_lib
  c = pretrain.get_config(f"recipe=roberta,size={size}")
  assert (c.data.format, c.data.pack, c.data.max_length, c.data.batch_size) == (
      "full_sentences", True, 512, 8192)
  assert (c.objective.objective, c.objective.sentence_task, c.objective.masking) == (
      "mlm", "none", "dynamic")
  assert (c.objective.mask_rate, c.objective.whole_word) == (0.15, False)
  o = c.optim
  assert (o.optimizer, o.learning_rate, o.b1, o.b2, o.eps, o.weight_decay) == (
      "adamw", lr, 0.9, 0.98, 1e-6, 0.01)
  assert (o.schedule, o.warmup_steps, o.end_lr_frac, o.clip_grad_norm) == (
      "linear", warmup, 0.0, 0.0)
  assert c.train.steps == 500_000
  assert (c.model.hidden_dropout, c.model.attention_dropout) == (0.1, 0.1)
  assert (c.model.norm_first, c.model.type_vocab_size) == (False, 1)  # post-LN, no segments
  assert c.data.vocab == "demo-bpe:50265"  # a byte-level BPE of the released 50,265 entries
  assert tokenizer.is_bpe(vocab_lib.resolve_vocab("demo-bpe"))  # (the 8,192 one: cheap)
  bert = pretrain.get_config(f"size={size}")  # the default recipe is untouched
  assert (bert.data.vocab, bert.optim.b2, bert.data.pack) == ("minilm", 0.999, False)
  assert bert.model.type_vocab_size == 2


def test_roberta_recipe_refuses_what_roberta_does_not_do():
  for arg, match in (("recipe=roberta,nsp=nsp", "sentence task"),
                     ("recipe=roberta,objective=electra", "MLM"),
                     ("recipe=roberta,runlocal", "two recipes"),
                     ("recipe=roberta,phase=2", "phase=2"),
                     ("recipe=neobert", r"recipe='neobert'; choose one of \['bert'")):
    with pytest.raises(ValueError, match=match):
      pretrain.get_config(arg)


# ModernBERT (Warner et al. 2024, arXiv 2412.13663, section 2.2 / Table 3, and the
# AnswerDotAI/ModernBERT yaml modernbert-base-pretrain.yaml): (peak lr, global batch, warm-up
# tokens); steps = ceil(1.719T tokens / (batch x 1,024)), warm-up = ceil(tokens / (batch x
# 1,024)), worked out by hand: 1.719e12 / 4,718,592 = 364,303.3; 3e9 / 4,718,592 = 635.8;
# 1.719e12 / 5,046,272 = 340,647.4; 2e9 / 5,046,272 = 396.3.
@pytest.mark.parametrize("size,lr,batch,steps,warmup", [
    ("modernbert-base", 8e-4, 4608, 364_304, 636),
    ("modernbert-large", 5e-4, 4928, 340_648, 397)])
def test_modernbert_recipe_values(size, lr, batch, steps, warmup):
  from encoder_jax.model.config import MODERNBERT_BLOCK
  from encoder_jax.train.optim import OptimConfig, learning_rate_schedule
  c = pretrain.get_config("recipe=modernbert" + ("" if size == "modernbert-base" else
                                                 f",size={size}"))
  assert c.size == size
  cfg = to_model_config(c)
  assert all(getattr(cfg, k) == v for k, v in MODERNBERT_BLOCK.items())  # the block, whole
  assert (c.data.vocab, c.data.format, c.data.pack, c.data.max_length, c.data.batch_size) == (
      "demo-bpe:50368", "full_sentences", True, 1024, batch)
  o = c.objective
  assert (o.objective, o.sentence_task, o.mask_rate, o.mask_frac, o.random_frac, o.masking,
          o.whole_word) == ("mlm", "none", 0.3, 0.8, 0.1, "dynamic", False)
  p = c.optim
  assert (p.optimizer, p.learning_rate, p.b1, p.b2, p.eps, p.clip_grad_norm) == (
      "adamw", lr, 0.9, 0.98, 1e-6, 0.0)
  # ModernBERT's fully decoupled 1e-5 (w *= 1 - 1e-5 * lr_t / lr_peak) as optax's coupled one
  assert p.weight_decay == pytest.approx(1e-5 / lr) and lr * p.weight_decay == pytest.approx(1e-5)
  assert (p.schedule, p.decay_shape, p.warmup_steps, p.end_lr_frac) == ("wsd", "1-sqrt", warmup,
                                                                        0.0)
  assert p.decay_frac == pytest.approx(50 / 1719) and c.train.steps == steps
  sched = learning_rate_schedule(OptimConfig.from_dict({**p.to_dict(), "total_steps": steps}))
  decay_start = steps - round(steps * 50 / 1719)
  assert float(sched(warmup)) == pytest.approx(lr) and float(sched(decay_start)) == (
      pytest.approx(lr))
  assert float(sched(steps)) == 0.0 and float(sched(warmup // 2)) == pytest.approx(lr / 2, 0.01)
  bert = pretrain.get_config("size=base")  # the default recipe is untouched
  assert (bert.optim.schedule, bert.objective.mask_rate, bert.data.pack) == ("linear", 0.15,
                                                                            False)


def test_modernbert_recipe_refuses_what_modernbert_does_not_do():
  for arg, match in (("recipe=modernbert,nsp=nsp", "sentence task"),
                     ("recipe=modernbert,objective=electra", "MLM"),
                     ("recipe=modernbert,runlocal", "two recipes"),
                     ("recipe=modernbert,phase=2", "phase=2"),
                     ("recipe=modernbert,size=base", "size=modernbert-base"),
                     ("recipe=modernbert,norm=post", "pre-LN")):
    with pytest.raises(ValueError, match=match):
      pretrain.get_config(arg)


def test_presets_that_pack():
  """The ModernBERT sizes and recipe=roberta|modernbert pack by default; BERT's recipe and a
  sentence task (which cannot pack) do not."""
  for arg, pack in (("size=modernbert-base", True), ("size=modernbert-large", True),
                    ("recipe=roberta", True), ("recipe=modernbert", True),
                    ("size=modernbert-base,nsp=nsp", False), ("size=base", False), ("", False),
                    ("runlocal", False)):
    assert pretrain.get_config(arg).data.pack is pack, arg
