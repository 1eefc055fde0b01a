"""Fine-tuning outputs stay with their examples: predict_split and export_embeddings return
row i's outputs at index i, whatever the length-sorted order, the batching, the weight-0
padding of the last batch and the per-batch length cropping they use inside."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from encoder_jax.finetune import run, setup, tasks, trainer
from encoder_jax.finetune.backbone import FinetuneModel
from encoder_jax.model import ModelConfig
from encoder_jax.model.heads import NEG_INF, masked_mean

CFG = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, ffn_size=64, num_layers=1,
                  max_positions=16)
N, T = 11, 16  # 11 rows in batches of 4: the last batch holds 3 rows and a weight-0 filler


def encoded() -> tasks.Encoded:
  """11 rows whose lengths are not sorted (so length-sorted batching reorders them)."""
  rng = np.random.default_rng(0)
  lengths = rng.permutation(np.arange(3, 3 + N))
  mask = np.arange(T)[None, :] < lengths[:, None]
  ids = np.where(mask, rng.integers(5, 64, (N, T)), 0).astype(np.int32)
  ids[:, 0] = 2
  types_ = (mask & (np.arange(T)[None, :] >= lengths[:, None] // 2)).astype(np.int32)
  return tasks.Encoded({"input_ids": ids, "mask": mask.astype(np.int32), "token_types": types_,
                        "labels": np.arange(N, dtype=np.int32) % 3})


def _steps(model):
  return trainer.make_steps(model, optax.sgd(0.0), optax.constant_schedule(0.0), freeze=False,
                            dropout=False)


@pytest.mark.parametrize("kind,num_labels", [("classify", 3), ("tag", 5), ("span", 2)])
def test_predict_split_returns_each_rows_outputs_in_row_order(kind, num_labels):
  model = FinetuneModel(CFG, kind, num_labels, pooling="cls", rngs=nnx.Rngs(0))
  steps, enc = _steps(model), encoded()
  params = nnx.state(model, nnx.Param)
  # Reference: all rows in their own order, one batch at full length.
  want = steps.predict(params, {k: jnp.asarray(enc.arrays[k]) for k in
                                ("input_ids", "mask", "token_types")})
  got = trainer.predict_split(steps, params, enc, batch_size=4, length_bucket=8)
  mask = enc.arrays["mask"].astype(bool)
  for k, w in want.items():
    w, g = np.asarray(w), got[k]
    assert g.shape == w.shape, k
    if kind == "classify":
      np.testing.assert_allclose(g, w, atol=1e-5, err_msg=k)
    else:  # per token: equal on real tokens; cropped-off pads filled back (never an answer)
      np.testing.assert_allclose(g[mask], w[mask], atol=1e-5, err_msg=k)
      if kind == "span":
        assert (g[~mask] <= NEG_INF).all()


def test_exported_embeddings_are_each_rows_own_in_row_order(tmp_path, tiny_config):
  model = FinetuneModel(CFG, "classify", 3, pooling="mean", rngs=nnx.Rngs(1))
  enc = encoded()
  config = tiny_config("glue/cola", "", export_embeddings="validation", export_pooling="mean",
                       eval_batch_size=4, length_bucket=8)
  s = setup.build(config)
  [path] = run.export_embeddings(model, s.task, {"validation": enc}, s.output, s.train, tmp_path)
  got = np.load(path)
  mask = jnp.asarray(enc.arrays["mask"])
  hidden = model.encoder(jnp.asarray(enc.arrays["input_ids"]), mask,
                         jnp.asarray(enc.arrays["token_types"])).hidden_BxTxD
  np.testing.assert_allclose(got, masked_mean(hidden, mask), atol=1e-5)
  np.testing.assert_array_equal(np.load(str(path).replace(".npy", "_labels.npy")),
                                enc.arrays["labels"])
