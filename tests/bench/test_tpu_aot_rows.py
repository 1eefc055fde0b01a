"""bench/tpu_aot.py's rows build the configs they name: --rows=recipes compiles RoBERTa's and
ModernBERT's recipes beside BERT-base (what `recipe=` sets reaches the compiled config), and the
table prices both at their recipes' global batches."""
import pytest

from bench import tpu_aot


def _config(model, seq=512, batch=256, dropout="bert"):
  return tpu_aot.config_of(tpu_aot.Row(model, seq, "v5e-16", "fixed", "1,-1,1", batch, dropout))


def test_recipe_rows_are_their_recipes():
  bert = _config("bert-base", 128)
  assert (bert.objective.sentence_task, bert.data.vocab, bert.model.rope) == ("nsp", "minilm",
                                                                              False)
  roberta = _config("roberta-base")
  assert roberta.data.vocab == "demo-bpe:50265" and roberta.data.pack
  assert roberta.objective.sentence_task == "none" and roberta.model.type_vocab_size == 1
  assert (roberta.data.max_length, roberta.data.batch_size, roberta.mesh) == (512, 256, "1,-1,1")
  modern = _config("modernbert-base", 1024, 128, "none")
  assert modern.model.rope and modern.model.glu and not modern.model.linear_bias
  assert modern.model.num_layers == 22 and modern.objective.mask_rate == pytest.approx(0.3)
  assert modern.data.vocab == "demo-bpe:50368" and modern.data.max_length == 1024


def test_recipes_rows_and_the_table_hold_both_recipes():
  models = [r.model for r in tpu_aot.rows("recipes", "none")]
  assert models[:3] == ["bert-base", "roberta-base", "modernbert-base"]
  table = {(r.model, r.batch) for r in tpu_aot.rows("table", "none") if r.variant == "auto"}
  assert ("roberta-base", tpu_aot.ROBERTA_BATCH) in table
  assert ("modernbert-base", tpu_aot.MODERNBERT_BATCH) in table
