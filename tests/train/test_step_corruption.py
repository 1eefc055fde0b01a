"""What the pre-training step feeds the model: which tokens it corrupts and how, per objective
as configs/pretrain.py sets it up, fresh randomness at every step, and where and how much
ELECTRA's losses count.

The model is a probe: a stand-in with the call signature of BertForPreTraining / ElectraModel
that records the ids, positions and dropout keys `loss_and_metrics` hands it, and returns
logits whose losses have a closed form. So these tests see the corruption the step applies
(not `mask_tokens` called by hand), check the step's loss to float precision, and compile in
about a second each (there is no encoder).
"""
import functools
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.train import setup
from encoder_jax.train import step as step_lib
from encoder_jax.objectives import pretraining

ROOT = pathlib.Path(__file__).resolve().parents[2]
from configs import pretrain  # noqa: E402

# BERT's special ids inside a 256-id vocabulary: specials are neither first nor contiguous.
V, PAD, UNK, CLS, SEP, MASK = 256, 0, 100, 101, 102, 103
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
TOK = types.SimpleNamespace(vocab_size=V, pad_id=PAD, unk_id=UNK, cls_id=CLS, sep_id=SEP,
                            mask_id=MASK)
B, T = 512, 64
COPY_LOGIT = 3.0  # the MLM probe's logit for "the token I was given"
RTD_LOGIT = 0.7  # the ELECTRA probe's constant "replaced?" logit


def make_batch(seed=0):
  """[CLS] A [SEP] B [SEP] pad..., a few [UNK] inside the text, random lengths; the last row
  is [CLS] [SEP] (nothing to mask)."""
  rng = np.random.default_rng(seed)
  normal = np.setdiff1d(np.arange(V), SPECIALS)
  ids = rng.choice(normal, size=(B, T)).astype(np.int32)
  ids[rng.random((B, T)) < 0.03] = UNK
  lengths = rng.integers(16, T + 1, size=B)
  split = rng.integers(2, lengths - 2)  # A: [1, split), B: (split, length - 1)
  types_ = np.zeros((B, T), np.int32)
  for b in range(B):
    ids[b, 0], ids[b, split[b]], ids[b, lengths[b] - 1] = CLS, SEP, SEP
    types_[b, split[b] + 1:lengths[b]] = 1
  lengths[-1], ids[-1, 1], types_[-1] = 2, SEP, 0
  valid = np.arange(T)[None, :] < lengths[:, None]
  ids[~valid] = PAD
  return {"input_ids": ids, "mask": valid, "token_types": types_}


def objective_for(arg: str, **changes) -> step_lib.ObjectiveConfig:
  """The ObjectiveConfig a run of configs/pretrain.py:<arg> trains with (rows of T tokens)."""
  config = pretrain.get_config(arg)
  config.data.max_length = T
  config.objective.update(changes)
  return setup.objective_config(config, TOK)


def python_count(num_maskable: int, rate: float, max_predictions: int) -> int:
  """BERT's min(max_predictions, max(1, round(rate * n))), 0 with nothing to mask."""
  return min(max_predictions, max(1, int(round(num_maskable * rate)))) if num_maskable else 0


def _key_data(k):
  return None if k is None else jax.random.key_data(k)


class MlmProbe:
  """Stands in for BertForPreTraining: records its inputs, predicts the token it is given."""

  def __init__(self):
    self.seen = {}

  def __call__(self, ids_BxT, *, mlm_positions_BxP, dropout_rng, mask_BxT, **ctx):
    self.seen.update(ids=ids_BxT, positions=mlm_positions_BxP, mask=mask_BxT,
                     types=ctx["token_types_BxT"], dropout=_key_data(dropout_rng))
    given_BxP = jnp.take_along_axis(ids_BxT, mlm_positions_BxP, axis=1)
    return COPY_LOGIT * jax.nn.one_hot(given_BxP, V), None, None


def _uniform_non_special(shape):
  """Logits of a uniform distribution over the non-special ids."""
  return jnp.broadcast_to(jnp.where(jnp.isin(jnp.arange(V), jnp.asarray(SPECIALS)), -1e9, 0.0),
                          shape + (V,))


class ElectraProbe:
  """Stands in for ElectraModel: a generator that samples uniformly over the non-special ids,
  a discriminator that says "replaced" with the constant logit RTD_LOGIT everywhere, MLM heads
  as uniform as the generator; records what each network is given."""

  token_embed = pooler = nsp = None

  def __init__(self):
    self.seen = {}

  def generator(self, ids_BxT, *, dropout_rng, mask_BxT, **ctx):
    self.seen.update(gen_ids=ids_BxT, gen_dropout=_key_data(dropout_rng), mask=mask_BxT)
    return types.SimpleNamespace(hidden_BxTxD=jnp.zeros(ids_BxT.shape + (1,)))

  def gen_mlm(self, hidden_BxTxD, token_embed, positions_BxP):
    self.seen["positions"] = positions_BxP
    return _uniform_non_special(positions_BxP.shape)

  def discriminator(self, ids_BxT, *, dropout_rng, **ctx):
    self.seen.update(disc_ids=ids_BxT, disc_dropout=_key_data(dropout_rng))
    return types.SimpleNamespace(hidden_BxTxD=jnp.zeros(ids_BxT.shape + (1,)))

  def rtd(self, hidden_BxTxD):
    return jnp.full(hidden_BxTxD.shape[:2], RTD_LOGIT)

  def disc_mlm(self, hidden_BxTxD, token_embed, positions_BxP=None):
    return _uniform_non_special((positions_BxP if positions_BxP is not None
                                 else hidden_BxTxD[..., 0]).shape)


@functools.lru_cache(maxsize=None)
def probed_step(obj: step_lib.ObjectiveConfig, train: bool = True):
  """jit(batch, key) -> (loss, metrics, what the probe saw) of loss_and_metrics."""
  @jax.jit
  def run(batch, key):
    probe = ElectraProbe() if obj.is_electra else MlmProbe()
    loss, metrics = pretraining.loss_and_metrics(probe, batch, key, obj, train=train)
    return loss, metrics, probe.seen
  return lambda batch, key: jax.device_get(run(batch, key))


def chosen_positions(obj, batch, positions_BxP):
  """Per row, the positions the step chose: the first n slots (n from BERT's formula)."""
  maskable = batch["mask"] & ~np.isin(batch["input_ids"], SPECIALS)
  counts = [python_count(int(m), obj.mask_rate, obj.max_predictions) for m in maskable.sum(1)]
  chosen = np.zeros((B, T), bool)
  for b, n in enumerate(counts):
    pos = positions_BxP[b]
    assert (np.diff(pos[:n]) > 0).all() and (pos[n:] == 0).all(), (b, pos, n)
    chosen[b, pos[:n]] = True
  return chosen, maskable, sum(counts)


def split_of(original, corrupted, chosen):
  """Shares of the chosen tokens replaced by [MASK], by another token, and kept."""
  new, old = corrupted[chosen], original[chosen]
  return ((new == MASK).mean(), ((new != MASK) & (new != old)).mean(), (new == old).mean())


# (mask, random, keep): BERT's 80/10/10 for MLM; ELECTRA's repo masks 85% and keeps 15%.
@pytest.mark.parametrize("arg,split", [("objective=mlm", (0.8, 0.1, 0.1)),
                                       ("objective=electra", (0.85, 0.0, 0.15)),
                                       ("objective=replace_mlm", (0.85, 0.0, 0.15))])
def test_step_corrupts_only_ordinary_tokens_with_the_objectives_split(arg, split):
  obj = objective_for(arg)
  batch = make_batch()
  loss, m, seen = probed_step(obj)(batch, step_lib.step_key(0, 7))
  chosen, maskable, total = chosen_positions(obj, batch, seen["positions"])
  assert not (chosen & ~maskable).any()  # never [CLS], [SEP], [UNK], pads
  prefix = "gen" if obj.is_electra else "mlm"
  assert m[f"{prefix}_count"] == total  # BERT's exact count per row
  assert total > 2500
  ids = batch["input_ids"]
  given = seen["gen_ids" if obj.is_electra else "ids"]
  np.testing.assert_array_equal(given[~chosen], ids[~chosen])  # nothing else changes
  np.testing.assert_array_equal(seen["mask"], batch["mask"])
  if not obj.is_electra:
    np.testing.assert_array_equal(seen["types"], batch["token_types"])
  shares = split_of(ids, given, chosen)
  # ~2,800 chosen tokens: a share's binomial std is <= 0.0095; 0.8 vs 0.85 is 5 std apart.
  np.testing.assert_allclose(shares, split, atol=0.025, err_msg=f"mask/random/keep of {arg}")
  random_ids = given[chosen & (given != ids) & (given != MASK)]
  assert not np.isin(random_ids, SPECIALS).any()
  if obj.is_electra:
    # The discriminator reads the original row with the generator's samples at the chosen
    # positions: never a [MASK], nothing moved elsewhere.
    disc = seen["disc_ids"]
    np.testing.assert_array_equal(disc[~chosen], ids[~chosen])
    assert not np.isin(disc[chosen], SPECIALS).any()
    assert (disc[chosen] != ids[chosen]).mean() > 0.95


def test_mlm_step_loss_is_the_mean_over_chosen_tokens_of_their_original_ids():
  obj = objective_for("objective=mlm")
  batch = make_batch(1)
  loss, m, seen = probed_step(obj)(batch, step_lib.step_key(3, 0))
  chosen, _, total = chosen_positions(obj, batch, seen["positions"])
  given, original = seen["ids"][chosen], batch["input_ids"][chosen]
  # Logits COPY_LOGIT * one_hot(given): log p(original) in closed form.
  log_z = np.log(np.exp(COPY_LOGIT) + V - 1)
  want = np.mean(log_z - COPY_LOGIT * (given == original))
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(m["loss"], want, rtol=1e-5)
  np.testing.assert_allclose(m["mlm_accuracy"], np.mean(given == original), rtol=1e-6)


def _softplus(x):
  return np.logaddexp(0.0, x)


def electra_expected(arg, obj, batch, seen):
  """(generator loss, main loss, its token count, main weight) the step must produce."""
  chosen, _, total = chosen_positions(obj, batch, seen["positions"])
  ids, disc, valid = batch["input_ids"], seen["disc_ids"], batch["mask"]
  gen_loss = np.log(V - len(SPECIALS))  # uniform over the non-special ids
  replaced = disc != ids
  assert not (replaced & ~chosen).any()
  variant = arg.split("=")[1].split(",")[0]
  if variant in ("electra", "electra_15"):
    where = valid if variant == "electra" else chosen
    y = replaced[where]
    main = np.mean(np.where(y, _softplus(-RTD_LOGIT), _softplus(RTD_LOGIT)))
    return gen_loss, main, where.sum(), "disc"
  if variant == "replace_mlm":
    return gen_loss, np.log(V - len(SPECIALS)), total, "main"
  # all_tokens_mlm: p(y) = D [y == input] + (1 - D) softmax(y), D = sigmoid(RTD_LOGIT).
  d = 1 / (1 + np.exp(-RTD_LOGIT))
  softmax = np.where(np.isin(ids, SPECIALS), 0.0, 1 / (V - len(SPECIALS)))
  p = d * (disc == ids) + (1 - d) * softmax
  return gen_loss, -np.log(p[valid]).mean(), valid.sum(), "main"


@pytest.mark.parametrize("arg,weight", [
    ("objective=electra", 50.0), ("objective=electra_15", 50.0),
    ("objective=replace_mlm", 1.0), ("objective=all_tokens_mlm", 1.0),
    ("objective=electra,disc_weight=10", 10.0)])
def test_electra_step_loss_is_generator_plus_weighted_main_loss(arg, weight):
  name, *override = arg.split(",")
  changes = {"disc_weight": float(override[0].split("=")[1])} if override else {}
  obj = objective_for(name, **changes)
  batch = make_batch(2)
  loss, m, seen = probed_step(obj)(batch, step_lib.step_key(0, 11))
  gen, main, count, prefix = electra_expected(name, obj, batch, seen)
  np.testing.assert_allclose(m["gen_loss"], gen, rtol=1e-5)
  np.testing.assert_allclose(m[f"{prefix}_loss"], main, rtol=1e-5)
  assert m[f"{prefix}_count"] == count  # where the main loss counts (Table 5's variants)
  np.testing.assert_allclose(loss, gen + weight * main, rtol=1e-5)
  np.testing.assert_allclose(m["loss"], loss, rtol=1e-6)


@pytest.mark.parametrize("arg", ["objective=mlm", "objective=electra"])
def test_every_step_draws_new_masks_and_dropout_and_a_step_repeats_exactly(arg):
  obj = objective_for(arg)
  batch = make_batch(3)
  run = probed_step(obj)
  a, b, again = (run(batch, step_lib.step_key(0, s)) for s in (5, 6, 5))
  other_seed = run(batch, step_lib.step_key(1, 5))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(again)):
    np.testing.assert_array_equal(x, y)  # same (seed, step): the same draw, bit for bit
  drop = ("gen_dropout", "disc_dropout") if obj.is_electra else ("dropout",)
  chosen = lambda run_: chosen_positions(obj, batch, run_[2]["positions"])[0]
  for other in (b, other_seed):
    differs = (chosen(a) != chosen(other)).any(axis=1)
    assert differs[:-1].all() and not differs[-1]  # the last row has nothing to choose
    for k in drop:
      assert not np.array_equal(a[2][k], other[2][k]), k
  if obj.is_electra:
    assert not np.array_equal(a[2]["gen_dropout"], a[2]["disc_dropout"])
  else:  # eval mode: no dropout key at all (the same code path for both objectives)
    assert probed_step(obj, train=False)(batch, step_lib.step_key(0, 5))[2]["dropout"] is None


def test_electra_samples_are_fresh_at_every_step():
  # Everything maskable is chosen and masked, so the generator's input is the same at every
  # step and only the sampling key can make the discriminator's input differ.
  obj = objective_for("objective=electra", mask_rate=1.0, max_predictions=T, mask_frac=1.0)
  batch = make_batch(4)
  run = probed_step(obj)
  (_, _, a), (_, _, b), (_, _, again) = (run(batch, step_lib.step_key(0, s)) for s in (0, 1, 0))
  np.testing.assert_array_equal(a["gen_ids"], b["gen_ids"])
  chosen = a["gen_ids"] == MASK
  assert chosen.sum() > 10_000
  assert (a["disc_ids"][chosen] != b["disc_ids"][chosen]).mean() > 0.9
  np.testing.assert_array_equal(a["disc_ids"], again["disc_ids"])


# ----------------------------------------------------------------- whole words, real tokenizers


@functools.lru_cache(maxsize=None)
def real_rows(vocab: str, n_rows: int = 256, T_rows: int = 64):
  """(tokenizer, batch) of full_sentences rows of Moby-Dick built by the data path itself
  (sentences -> ids and word starts -> plan -> rows in the tokenizer's layout)."""
  from encoder_jax.data import examples, sources, tokenizer, vocab as vocab_lib
  tok = tokenizer.load(vocab_lib.resolve_vocab(vocab))
  docs = sources.demo_documents(split=None, parts=("moby_dick",))[:60]
  corpus = examples.Corpus.from_records(r for _, r in tokenizer.tokenize_documents(docs, tok))
  cfg = examples.ExampleConfig(format="full_sentences", max_length=T_rows)
  rows = examples.Rows(corpus, examples.make_plan(corpus, cfg, tok.layout), cfg, tok.cls_id,
                       tok.sep_id, tok.pad_id, tok.layout)
  assert len(rows) >= n_rows
  batch = {k: np.stack([rows[r][k] for r in range(n_rows)]) for k in rows[0]}
  return tok, batch


def reference_words(tok, ids_BxT, maskable_BxT):
  """Word index of every maskable token (-1 elsewhere) from the token strings alone: a word
  starts at a token that does not continue one (WordPiece: no `##`; byte-level BPE: a leading
  `Ġ`, the space before the word) or at the first token after a special."""
  continues = (lambda t: t.startswith("##")) if tok.kind == "wordpiece" else (
      lambda t: not t.startswith("Ġ"))
  word_BxT = np.full(ids_BxT.shape, -1)
  n = 0
  for b in range(ids_BxT.shape[0]):
    prev_maskable = False
    for t in range(ids_BxT.shape[1]):
      if maskable_BxT[b, t]:
        if not (prev_maskable and continues(tok.id_to_token(ids_BxT[b, t]))):
          n += 1
        word_BxT[b, t] = n
      prev_maskable = maskable_BxT[b, t]
  return word_BxT


@pytest.mark.parametrize("vocab", ["minilm", "demo-bpe"])
def test_whole_word_step_masks_whole_words_only(vocab):
  """objective.whole_word=True through the configured step, on rows of real text: every word
  (by the tokenizer's own continuation marker) is chosen whole or not at all, and specials
  never. The same batch without it does split words, so the check can see a split."""
  tok, batch = real_rows(vocab)
  V_tok = tok.vocab_size

  class Probe:  # records what loss_and_metrics hands the model
    def __init__(self):
      self.seen = {}

    def __call__(self, ids_BxT, *, mlm_positions_BxP, dropout_rng, mask_BxT, **ctx):
      self.seen["positions"] = mlm_positions_BxP
      return jnp.zeros(mlm_positions_BxP.shape + (V_tok,)), None, None

  def chosen(whole_word, step):
    config = pretrain.get_config("objective=mlm")
    config.data.max_length = batch["input_ids"].shape[1]
    config.objective.whole_word = whole_word
    obj = setup.objective_config(config, tok)
    assert obj.special_ids == tok.special_ids

    @jax.jit
    def run(batch, key):
      probe = Probe()
      pretraining.loss_and_metrics(probe, batch, key, obj, train=True)
      return probe.seen["positions"]

    pos_BxP = np.asarray(run(batch, step_lib.step_key(0, step)))
    out = np.zeros(batch["input_ids"].shape, bool)
    rows_BxP = np.broadcast_to(np.arange(len(pos_BxP))[:, None], pos_BxP.shape)
    out[rows_BxP[pos_BxP > 0], pos_BxP[pos_BxP > 0]] = True  # position 0 is [CLS]: padding
    return out

  ids = batch["input_ids"]
  maskable = batch["mask"] & ~np.isin(ids, tok.special_ids)
  word = reference_words(tok, ids, maskable)
  n_words = word.max()
  size = np.bincount(word[word >= 0], minlength=n_words + 1)

  def split_and_whole(c):
    taken = np.bincount(word[c], minlength=n_words + 1)
    partly = (taken > 0) & (taken < size)
    return int(partly.sum()), int(((taken == size) & (size > 1)).sum())

  for step in (0, 1):
    c = chosen(True, step)
    assert not (c & ~maskable).any()  # no special, no pad
    split, multi = split_and_whole(c)
    assert split == 0, f"{split} words partly masked"
    assert multi > 30 and c.sum() > 0.1 * maskable.sum()  # multi-piece words were masked whole
  assert split_and_whole(chosen(False, 0))[0] > 30
