"""Mixed precision (`configs/pretrain.py:...,precision=bf16|bf16_dots`): fp32 storage.

precision=bf16 computes activations and matmuls in bf16; bf16_dots only rounds the matmul
operands to bf16 (fp32 accumulation, fp32 activations). Each training run must track the fp32
run of the same seed and data step for step (the losses differ only by bf16 rounding), must
really compute in bf16 (the losses are not bit-identical), and must keep parameters and
optimizer state in float32 in the checkpoint.
"""
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import loop_helpers as H
from encoder_jax.train import loop

from configs import pretrain

STEPS = 60
TOLERANCE = 0.02  # nats, at every step


def run(env, precision: str, tmp_path) -> tuple[dict, pathlib.Path]:
  config = H.tiny_config(env, steps=STEPS, log_every=1, eval_every=STEPS,
                         checkpoint_every=STEPS)
  config.optim.update(dict(total_steps=STEPS))
  model = pretrain.get_config(f"size=tiny,precision={precision}").model
  config.model.update(dict(dtype=model.dtype, dot_dtype=model.dot_dtype))
  workdir = tmp_path / precision
  loop.train_and_evaluate(config, str(workdir))
  return {k: v["loss"] for k, v in H.train_rows(workdir).items()}, workdir


@pytest.fixture(scope="module")
def fp32_losses(env, tmp_path_factory):
  return run(env, "fp32", tmp_path_factory.mktemp("fp32"))[0]  # one reference for both


@pytest.mark.parametrize("precision", ["bf16", "bf16_dots"])
def test_bf16_tracks_fp32_and_stores_fp32(env, tmp_path, precision, fp32_losses):
  fp32 = fp32_losses
  bf16, workdir = run(env, precision, tmp_path)
  assert sorted(fp32) == sorted(bf16) == list(range(1, STEPS + 1))
  diff = np.array([abs(fp32[k] - bf16[k]) for k in sorted(fp32)])
  assert fp32[STEPS] < fp32[1] - 0.5, "the run must learn for the comparison to mean much"
  assert diff.max() < TOLERANCE, f"bf16 drifted from fp32: max |diff| {diff.max():.4f} nats"
  assert diff.max() > 0, "bf16 losses equal fp32's bit for bit: bf16 compute is not in effect"
  state = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(STEPS) / "state")
  dtypes = {str(np.asarray(x).dtype) for x in jax.tree.leaves(state)}
  assert dtypes <= {"float32", "int32"} and "float32" in dtypes, dtypes


def test_precision_presets():
  model = lambda arg: pretrain.get_config(arg).model
  # auto (the default) is resolved for the platform compiled for (tests/tpu/): bf16 on TPU/GPU
  assert (model("size=tiny").dtype, model("size=tiny").dot_dtype) == ("auto", "auto")
  assert (model("precision=fp32").dtype, model("precision=fp32").dot_dtype) == ("float32", "")
  assert (model("precision=bf16").dtype, model("precision=bf16").dot_dtype) == ("bfloat16", "")
  assert model("precision=bf16_dots").dot_dtype == "bfloat16"
  assert model("precision=bf16_dots").dtype == "float32"
  # The demo recipe picks bf16 dots where the CPU multiplies bf16 (model.matmul.bf16_dots).
  assert (model("runlocal").dtype, model("runlocal").dot_dtype) == ("auto", "auto")
  assert model("runlocal,precision=fp32").dot_dtype == ""
  with pytest.raises(ValueError, match="precision"):
    model("precision=fp16")
