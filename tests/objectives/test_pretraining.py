"""The objective's composition (encoder_jax/objectives/pretraining.py) with a probe model: the
step's loss in closed form (MLM + NSP/SOP), what the model is handed (corruption of ordinary
tokens only, the batch's context, a dropout key only in training), and the objectives'
published corruption splits. tests/train/test_step_corruption.py runs the same function at
the trainer's batch sizes for every objective of configs/pretrain.py."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives import pretraining
from encoder_jax.objectives.pretraining import ObjectiveConfig

V, PAD, UNK, CLS, SEP, MASK = 64, 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
B, T, P = 8, 16, 4
NSP_LOGITS = (0.0, 1.5)  # the probe's NSP logits for every row


class MlmProbe:
  """BertForPreTraining's call signature: uniform MLM logits (loss log V whatever it is asked)
  and constant NSP logits; it records what it was handed."""

  def __init__(self, nsp: bool):
    self.nsp, self.seen = nsp, {}

  def __call__(self, ids_BxT, *, mlm_positions_BxP, dropout_rng, mask_BxT, token_types_BxT,
               segment_ids_BxT, positions_BxT):
    self.seen.update(ids=ids_BxT, positions=mlm_positions_BxP, mask=mask_BxT,
                     types=token_types_BxT, dropout=dropout_rng is not None)
    logits = jnp.zeros(mlm_positions_BxP.shape + (V,))
    nsp = jnp.broadcast_to(jnp.asarray(NSP_LOGITS), (ids_BxT.shape[0], 2)) if self.nsp else None
    return logits, nsp, None


def _batch(seed=0):
  """[CLS] text (with an [UNK]) [SEP] pad..., random lengths >= 6."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(len(SPECIALS), V, (B, T)).astype(np.int32)
  lengths = rng.integers(6, T + 1, B)
  ids[:, 0], ids[np.arange(B), lengths - 1], ids[:, 2] = CLS, SEP, UNK
  mask = np.arange(T)[None, :] < lengths[:, None]
  ids[~mask] = PAD
  types = np.where(mask & (np.arange(T) >= 3), 1, 0).astype(np.int32)
  return {"input_ids": ids, "mask": mask, "token_types": types,
          "nsp_label": (np.arange(B) % 3 == 0).astype(np.int32)}


def _run(obj, batch, *, train, unigram=None):
  @jax.jit
  def run(batch, key):
    probe = MlmProbe(nsp=obj.sentence_task != "none")
    loss, metrics = pretraining.loss_and_metrics(probe, batch, key, obj, train=train,
                                                 unigram_logp_V=unigram)
    return loss, metrics, probe.seen
  return jax.device_get(run(batch, jax.random.key(0)))


def _obj(**kw):
  return ObjectiveConfig(**{**dict(vocab_size=V, mask_id=MASK, special_ids=SPECIALS,
                                   max_predictions=P, mask_rate=0.3), **kw})


@pytest.mark.parametrize("task", ["none", "nsp", "sop"])
def test_loss_is_mlm_plus_the_sentence_task(task):
  batch = _batch()
  loss, metrics, _ = _run(_obj(sentence_task=task), batch, train=False)
  # Uniform logits: log V per prediction. Constant NSP logits (0, c): softplus(+-c) by label.
  c = NSP_LOGITS[1] - NSP_LOGITS[0]
  nsp = np.where(batch["nsp_label"] == 0, np.log1p(np.exp(c)), np.log1p(np.exp(-c))).mean()
  want = math.log(V) + (0.0 if task == "none" else nsp)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(metrics["mlm_loss"], math.log(V), rtol=1e-6)
  if task == "none":
    assert not any(k.startswith(("nsp", "sop")) for k in metrics)
  else:
    np.testing.assert_allclose(metrics[f"{task}_loss"], nsp, rtol=1e-6)
    assert metrics[f"{task}_count"] == B
  assert metrics["loss"] == loss


def test_the_model_gets_corrupted_ordinary_tokens_and_the_batchs_context():
  batch = _batch(1)
  for train in (False, True):
    _, metrics, seen = _run(_obj(), batch, train=train)
    assert seen["dropout"] == train  # a dropout key only in training
    np.testing.assert_array_equal(seen["mask"], batch["mask"])
    np.testing.assert_array_equal(seen["types"], batch["token_types"])
    ids, pos = batch["input_ids"], seen["positions"]
    rows = np.arange(B)[:, None]
    chosen = np.zeros((B, T), bool)
    chosen[rows, pos] = True
    chosen[:, 0] = False  # empty prediction slots point at 0 ([CLS], never chosen)
    # Chosen: ordinary tokens of the row only ([CLS], [SEP], [UNK] and pads never).
    assert not (chosen & np.isin(ids, SPECIALS)).any()
    assert not (chosen & ~batch["mask"]).any()
    # round(0.3 * maskable) per row (BERT's count), capped at P
    maskable = (batch["mask"] & ~np.isin(ids, SPECIALS)).sum(1)
    np.testing.assert_array_equal(chosen.sum(1), np.minimum(P, np.round(0.3 * maskable)))
    assert metrics["mlm_count"] == chosen.sum()
    # Only chosen tokens change; nothing outside them.
    np.testing.assert_array_equal(seen["ids"][~chosen], ids[~chosen])


def test_unigram_baseline_is_scored_on_the_same_targets():
  _, metrics, _ = _run(_obj(), _batch(2), train=False, unigram=jnp.full((V,), -math.log(V)))
  for name in ("unigram_loss", "unigram_at_mask_loss", "mlm_at_mask_loss"):
    np.testing.assert_allclose(metrics[name], math.log(V), rtol=1e-6, err_msg=name)


def test_published_corruption_splits_and_bad_choices():
  # BERT: 80% [MASK], 10% random, 10% kept; ELECTRA: 85% [MASK], no random token.
  assert ObjectiveConfig().fractions == (0.8, 0.1)
  for objective in ("electra", "electra_15", "replace_mlm", "all_tokens_mlm"):
    assert ObjectiveConfig(objective=objective).fractions == (0.85, 0.0)
  assert ObjectiveConfig(mask_frac=1.0, random_frac=0.0).fractions == (1.0, 0.0)
  with pytest.raises(ValueError, match="objective"):
    ObjectiveConfig(objective="t5")
  with pytest.raises(ValueError, match="sentence_task"):
    ObjectiveConfig(sentence_task="next")


def test_pad_fraction_is_the_share_of_padded_positions():
  """A hand-built batch of 8 rows x 16 positions holding 16, 10, 6, 6, 7, 8, 9 and 16 real
  tokens (78 of 128): 50 / 128 of it is padding, whatever the ids say."""
  lengths = np.array([16, 10, 6, 6, 7, 8, 9, 16])
  batch = _batch()
  batch["mask"] = np.arange(T)[None, :] < lengths[:, None]
  batch["input_ids"] = np.where(batch["mask"], batch["input_ids"], PAD)
  batch["input_ids"][:, 1] = PAD  # a pad id inside a row is still a real position
  batch["mask"][:, 1] = True
  _, metrics, _ = _run(_obj(), batch, train=True)
  assert metrics["pad_fraction"] == pytest.approx(50 / 128, abs=1e-7)
