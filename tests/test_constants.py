"""One definition per constant, and the programs of bench/ and experiments/ use it.

Every expected figure below is written here from its published source, never read back from
the definition under test: changing a definition, or a consumer that stops using it (a copied
formula, a hard-coded peak), fails here.
"""
import argparse
import pathlib
import subprocess
import sys
import types

import pytest

from bench import gpu, systems, train_step
from configs import pretrain
from encoder_jax.model.config import BERT_VOCAB_SIZE, ModelConfig
from encoder_jax.objectives import masking, pretraining
from encoder_jax.train import flops, setup
from experiments import grids

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Devlin et al. 2019: the uncased WordPiece vocabulary of the released BERT checkpoints
# (uncased_L-12_H-768_A-12/vocab.txt has 30,522 lines).
BERT_UNCASED_VOCAB = 30522
# Prediction slots per row at mask rate 0.15: BERT's ceil(0.15 T) (its release's
# max_predictions_per_seq=20 at 128 tokens) and ELECTRA's configure_pretraining.py
# int((0.15 + 0.005) T).
SLOTS = {("mlm", 128): 20, ("mlm", 512): 77, ("electra", 128): 19, ("electra", 512): 79}
# Dense bf16 FLOP/s from the vendors' spec sheets: NVIDIA H100/H200 SXM 989 TFLOPS (1,979
# with 2:4 sparsity); Google Cloud TPU v4 275 TFLOPS per chip.
H100_H200_SXM = 989e12
TPU_V4_CHIP = 275e12
# A BERT tokenizer's ids as the trainer reads them (bert-base-uncased vocab.txt).
BERT_TOKENIZER = types.SimpleNamespace(vocab_size=BERT_UNCASED_VOCAB, pad_id=0, unk_id=100,
                                       cls_id=101, sep_id=102, mask_id=103)


def test_bert_vocab_size_is_the_published_one_everywhere():
  assert BERT_VOCAB_SIZE == BERT_UNCASED_VOCAB
  assert ModelConfig().vocab_size == BERT_UNCASED_VOCAB
  assert pretraining.ObjectiveConfig().vocab_size == BERT_UNCASED_VOCAB
  spec = systems.StepSpec(size="tiny")
  assert systems.model_config(spec).vocab_size == BERT_UNCASED_VOCAB
  assert systems.objective_config(spec).vocab_size == BERT_UNCASED_VOCAB
  assert gpu.objective_config(128).vocab_size == BERT_UNCASED_VOCAB


@pytest.mark.parametrize("objective,seq_len", sorted(SLOTS))
def test_default_max_predictions_gives_its_documented_slots(objective, seq_len):
  p = pretraining.default_max_predictions(objective, 0.15, seq_len)
  assert p == SLOTS[objective, seq_len]
  doc = " ".join(pretraining.default_max_predictions.__doc__.split())
  assert f"{p} at {seq_len}" in doc
  if objective == "mlm":  # BERT's cap never cuts a row's count round(0.15 n), n <= T
    assert (masking.num_to_predict_table(seq_len, 0.15, p)
            == masking.num_to_predict_table(seq_len, 0.15, seq_len)).all()


def _trainer_objective(objective: str, seq_len: int) -> pretraining.ObjectiveConfig:
  """What the trainer builds for configs/pretrain.py:objective=<objective> at `seq_len`."""
  config = pretrain.get_config(f"objective={objective}")
  config.data.max_length = seq_len
  return setup.objective_config(config, BERT_TOKENIZER)


def _corruption(obj: pretraining.ObjectiveConfig):
  return (obj.objective, obj.vocab_size, obj.mask_id, obj.special_ids, obj.mask_rate,
          obj.max_predictions, obj.fractions)


@pytest.mark.parametrize("objective,seq_len", sorted(SLOTS))
def test_bench_steps_corrupt_rows_as_the_trainer_does(objective, seq_len):
  """bench/systems.py (bench/train_step.py, bench/memory.py) and bench/gpu.py time the
  trainer's masking program: the same slots P, rate, fractions and special ids."""
  trainer = _trainer_objective(objective, seq_len)
  assert trainer.max_predictions == SLOTS[objective, seq_len]
  ours = systems.objective_config(systems.StepSpec(objective=objective, seq_len=seq_len))
  assert _corruption(ours) == _corruption(trainer)
  if objective == "mlm":
    assert _corruption(gpu.objective_config(seq_len)) == _corruption(trainer)


def test_bench_gpu_builds_its_step_with_the_trainers_slots():
  args = argparse.Namespace(dtype="float32", remat_policy="none")
  cfg, obj, _, _ = gpu.build_state("tiny", 512, args)
  assert obj.max_predictions == SLOTS["mlm", 512]
  assert cfg.vocab_size == obj.vocab_size == BERT_UNCASED_VOCAB


@pytest.mark.parametrize("objective", ["mlm", "electra"])
def test_bench_train_step_counts_the_flops_of_the_slots_it_times(objective):
  spec = systems.StepSpec(size="tiny", objective=objective, nsp=objective == "mlm",
                          batch_size=4, seq_len=512)
  cfg = systems.model_config(spec)
  gen = pretraining.ObjectiveConfig(objective=objective).generator_config(cfg)
  expected = flops.train_flops_per_step(cfg, batch_size=4, seq_len=512, objective=objective,
                                        nsp=objective == "mlm", generator=gen,
                                        max_predictions=SLOTS[objective, 512])
  assert train_step._flops(spec) == pytest.approx(expected, rel=1e-12)


def test_peak_flops_table_holds_the_published_peaks():
  assert flops.peak_flops_per_device("NVIDIA H100 80GB HBM3") == H100_H200_SXM
  assert flops.peak_flops_per_device("NVIDIA H200") == H100_H200_SXM
  assert flops.peak_flops_per_device("TPU v4") == TPU_V4_CHIP
  # doc text may quote a peak only as the table's
  assert "H100/H200 SXM 989 TFLOP/s" in " ".join(gpu.__doc__.split())


def _points(total_flops: float):
  point = types.SimpleNamespace(name="p", steps=1, flops_per_step=total_flops,
                                total_flops=total_flops, finetune=())
  return types.SimpleNamespace(points=[point])


def test_experiment_plans_use_the_peak_table():
  # one H100/H200: the training FLOPs at GPU_MFU of 989 TFLOP/s, plus the per-point cost
  train_s = 1000.0
  grid = _points(train_s * grids.GPU_MFU * H100_H200_SXM)
  assert grids.gpu_seconds(grid) == pytest.approx(train_s + grids.GPU_POINT_S)
  # v4-32: 16 chips of 275 TFLOP/s at MFU 0.5 for two hours. experiments.run defines absl
  # flags (--workdir ...) that other modules of the suite define too: checked in a child.
  code = ("import types; from experiments import run; "
          "p = types.SimpleNamespace(name='p', steps=1, flops_per_step={f!r}, "
          "total_flops={f!r}, finetune=()); "
          "print(run.plan_lines(types.SimpleNamespace(points=[p]), 'v4-32', 0.5)[-1])"
          ).format(f=2 * 3600 * 16 * TPU_V4_CHIP * 0.5)
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.strip().splitlines()[-1]
  assert out.split("|")[5].strip() == "2.0 h", out
