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


def test_from_csv_writes_the_table_of_a_cut_short_run_without_compiling(tmp_path):
  """--from_csv: the rows a cut-short run left in the csv become the .md and the README's
  table; the rows it did not reach are named as left out; nothing is compiled."""
  import csv
  import pathlib
  import shutil

  from absl import flags as absl_flags
  first = tpu_aot.rows("ci", "none")[0]
  row = {**{k: "" for k in tpu_aot.FIELDS}, **dict(
      model=first.model, seq=first.seq, topology=first.topology, variant=first.variant,
      mesh_arg=first.mesh, batch=first.batch, dropout=first.dropout, mesh="1,8,1",
      optim_sharding="replicated", rows_device=32, accumulation=1, remat="dots",
      program="for tpu: activations bfloat16, scanned layers", hbm_gib=1.5, hbm_cap_gib=16.0,
      fits=True, est_mfu=0.123, est_update_ms=45.6)}
  out = tmp_path / "t"
  with out.with_suffix(".csv").open("w", newline="") as f:
    w = csv.DictWriter(f, tpu_aot.FIELDS)
    w.writeheader()
    w.writerow(row)
  readme = tmp_path / "README.md"
  shutil.copy(pathlib.Path(__file__).resolve().parents[2] / "launch" / "README.md", readme)
  try:
    absl_flags.FLAGS(["tpu_aot", "--rows=ci", f"--out={out}", "--from_csv",
                      f"--update_readme={readme}"])
    tpu_aot.main([])
  finally:
    absl_flags.FLAGS.unparse_flags()
  md = out.with_suffix(".md").read_text()
  assert "| 0.123 |" in md and md.count(f"| {first.model} |") == 1
  assert "not compiled in this run" in md and "electra-base s128 v5e-16 fixed" in md
  text = readme.read_text()
  assert "| 1.5 / 16.0 | 0.123 | 45.6 |" in text and "FSDP 1,8,1" in text
