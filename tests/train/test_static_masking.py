"""Static (BERT) vs dynamic (RoBERTa) masking, as the training step applies it.

Static: a row's mask is a function of (seed, example id, epoch % dupe_factor) only, so the same
example is corrupted identically at every step that maps to the same copy. Dynamic: a new mask
at every step. Observed through the jitted train step's loss on one fixed batch from one fixed
state (dropout off), so a mask that changes changes the loss.
"""
import jax
import numpy as np
import pytest

from encoder_jax.data import pipeline
from encoder_jax.model import ModelConfig
from encoder_jax.train import step as step_lib
from encoder_jax.train.optim import OptimConfig, build_optimizer

V = 64  # ids 0..4 are the specials


def _trainer(masking, dupe_factor=2):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, V, (8, 16)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
  batch = {"input_ids": ids, "mask": np.ones((8, 16), bool),
           "token_types": np.zeros((8, 16), np.int32)}
  cfg = ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64,
                    max_positions=16, hidden_dropout=0.0, attention_dropout=0.0)
  obj = step_lib.ObjectiveConfig(vocab_size=V, mask_id=4, special_ids=(0, 1, 2, 3, 4),
                                 max_predictions=4, masking=masking, dupe_factor=dupe_factor)
  tx, schedule = build_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10))
  tr, init = step_lib.create(cfg, obj, tx, schedule, seed=0)
  return (tr, step_lib.make_train_step(tr)), init(), batch


def _loss(trainer, state, batch, step, epoch):
  """The train step's loss on `batch` from `state` with the step counter at `step`."""
  _, train_step = trainer
  b = dict(batch, example_id=np.arange(8, dtype=np.int32),
           epoch=np.full(8, epoch, np.int32))
  state = state._replace(step=jax.numpy.asarray(step, jax.numpy.int32))
  state = jax.tree.map(lambda x: x.copy(), state)  # the step donates its input
  _, metrics = train_step(state, b)
  return float(metrics["loss"])


def test_static_masks_depend_on_example_and_copy_not_step():
  tr, state, batch = _trainer("static", dupe_factor=2)
  at_epoch0 = _loss(tr, state, batch, step=3, epoch=0)
  assert _loss(tr, state, batch, step=11, epoch=0) == at_epoch0  # another step, same copy
  assert _loss(tr, state, batch, step=11, epoch=2) == at_epoch0  # epoch 2 = copy 0 again
  assert _loss(tr, state, batch, step=3, epoch=1) != at_epoch0  # copy 1: other masks


def test_dynamic_masks_change_every_step():
  tr, state, batch = _trainer("dynamic")
  losses = {_loss(tr, state, batch, step=s, epoch=0) for s in (3, 4, 5)}
  assert len(losses) == 3
  assert _loss(tr, state, batch, step=3, epoch=7) in losses  # the epoch plays no part


def test_static_masking_without_example_ids_is_an_error():
  (_, train_step), state, batch = _trainer("static")
  with pytest.raises(ValueError, match="example_id"):
    train_step(state, batch)


def test_bad_masking_names_the_choices():
  with pytest.raises(ValueError, match="dynamic"):
    step_lib.ObjectiveConfig(masking="offline")
  with pytest.raises(ValueError, match="dupe_factor"):
    step_lib.ObjectiveConfig(masking="static", dupe_factor=0)


class _Rows:
  """A plan of n rows whose content is their own index."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return {"input_ids": np.full(4, i, np.int32)}


@pytest.mark.parametrize("hosts", [1, 2])
def test_loader_tags_rows_with_example_id_and_epoch(hosts):
  n, batch = 10, 4  # 10 rows: epochs do not align with batches
  got_ids, got_epochs = [], []
  for h in range(hosts):
    loader = pipeline.Loader(_Rows(n), pipeline.LoaderConfig(
        global_batch_size=batch, seed=3, process_index=h, process_count=hosts,
        example_ids=True))
    it = iter(loader)
    rows = [next(it) for _ in range(10)]  # 40 stream positions = 4 epochs
    got_ids.append(np.stack([r["example_id"] for r in rows]))
    got_epochs.append(np.stack([r["epoch"] for r in rows]))
    for r in rows:  # the tag is the row that was read
      np.testing.assert_array_equal(r["input_ids"][:, 0], r["example_id"])
  ids = np.concatenate(got_ids, axis=1).reshape(-1)  # global stream order
  epochs = np.concatenate(got_epochs, axis=1).reshape(-1)
  np.testing.assert_array_equal(epochs, np.arange(40) // n)
  for e in range(4):  # every epoch is a permutation of all rows, a different one each time
    assert sorted(ids[epochs == e]) == list(range(n))
  assert not np.array_equal(ids[:n], ids[n:2 * n])
