"""`python -m encoder_jax.convert.export`: a real (tiny) pre-training run -> HF folders.

The runs use tests/train/test_loop.py's corpus and tiny config (1 block, d=32, rows of 32,
the BERT uncased vocab), a few steps each. The exported parameters are compared with the
checkpoint read independently (Orbax without a target), and transformers must load the
folders with nothing missing, tokenize like us and compute what our model computes. Which
family a run exports as, and the one line for a run none represents, are checked on the
presets' configs without training.
"""
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
import loop_helpers  # noqa: E402
from loop_helpers import tiny_config  # noqa: E402

from encoder_jax.convert import export  # noqa: E402
from encoder_jax.model import vocab_padding  # noqa: E402
from encoder_jax.convert import load_hf_bert, load_hf_electra_pair  # noqa: E402
from encoder_jax.hf.bert import _pure_params  # noqa: E402
from encoder_jax.data import tokenizer  # noqa: E402
from encoder_jax.data.tokenizer import WordPieceTokenizer  # noqa: E402
from encoder_jax.train import loop, setup  # noqa: E402
from encoder_jax.train.run_dir import RunDir  # noqa: E402

pytestmark = pytest.mark.parity
TOL = 1e-5
TEXTS = ["Call me Ishmael.", "The state of our union is strong, and growing."]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """A small corpus for the trainer runs that write the checkpoints exported here."""
  return loop_helpers.make_env(tmp_path_factory.mktemp("export_env"))


def _train(env, workdir, objective="mlm", vocab="minilm", **model):
  config = tiny_config(env, steps=2, checkpoint_every=1, eval_every=0)
  config.data.vocab = vocab
  # No dropout: the explicit attention path would double the step's compile time.
  config.model.update(dict(hidden_dropout=0.0, attention_dropout=0.0, **model))
  config.objective.objective = objective
  loop.train_and_evaluate(config, str(workdir))
  return workdir


@pytest.fixture(scope="module")
def mlm_run(env, tmp_path_factory):
  return _train(env, tmp_path_factory.mktemp("mlm_run"))


@pytest.fixture(scope="module")
def electra_run(env, tmp_path_factory):
  # ELECTRA-small's embedding projection: embeddings 16 wide, hidden 32 (generator hidden 8).
  return _train(env, tmp_path_factory.mktemp("electra_run"), "electra", embedding_size=16)


def _checkpoint_params(workdir, step):
  """The run's parameters at `step`, read by Orbax alone (no model, no abstract state), without
  the token table's padding rows (model.vocab_pad_multiple), which an export leaves behind:
  they must be zero."""
  raw = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")
  unwrap = lambda t: ({k: unwrap(v) for k, v in t.items()} if not set(t) == {"value"}
                      else np.asarray(t["value"])) if isinstance(t, dict) else np.asarray(t)
  params = unwrap(raw["params"])
  vocab_size = json.loads((workdir / "config.json").read_text())["model"]["vocab_size"]
  padded = vocab_padding.pad_vocab(vocab_padding.unpad_vocab(params, vocab_size),
                                   len(_token_table(params)))
  jax.tree.map(np.testing.assert_array_equal, padded, params)  # the padding rows are zero
  return vocab_padding.unpad_vocab(params, vocab_size)


def _token_table(params):
  for k, v in params.items():
    if k == "token" and "embedding" in v:
      return v["embedding"]
    if isinstance(v, dict) and (found := _token_table(v)) is not None:
      return found
  return None


def _run_scans(workdir) -> bool:
  """The layer layout the run recorded in its config.json (model.scan_layers=auto settles to
  the platform's: unrolled on CPU), which its checkpoints have."""
  recorded = json.loads((workdir / setup.CONFIG_FILE).read_text())["model"]
  return setup.resolve_layers(recorded["scan_layers"], recorded["remat_policy"])[0]


def _assert_equal_trees(a, b):
  strkeys = lambda t: ({str(k): strkeys(v) for k, v in t.items()} if isinstance(t, dict)
                       else np.asarray(t))
  a, b = strkeys(a), strkeys(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _hf_inputs(folder):
  """Our tokenizer's batch, checked against AutoTokenizer loaded from the exported folder."""
  ours = WordPieceTokenizer.from_vocab(folder / "vocab.txt").batch_encode_pairs(TEXTS,
                                                                                max_length=16)
  hf_tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
  theirs = hf_tok(TEXTS, padding="max_length", max_length=16, truncation=True,
                  return_tensors="np")
  np.testing.assert_array_equal(theirs["input_ids"], ours["input_ids"])
  return ({k: torch.tensor(np.asarray(theirs[k])) for k in ("input_ids", "attention_mask",
                                                            "token_type_ids")},
          ours["mask"].astype(bool))


def test_mlm_run_exports_as_bert_for_masked_lm(mlm_run, tmp_path):
  workdir = mlm_run
  out = tmp_path / "hf"
  said = []
  written = export.export_run(workdir, out, report=said.append)  # newest step: 2
  assert [(w.folder, w.hf_class, w.auto_class) for w in written] == [
      (out, "BertForMaskedLM", "AutoModelForMaskedLM")]
  assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "vocab.txt",
                                             "tokenizer_config.json"}
  # every file readable by all, as config.json is (safetensors alone writes 0600)
  modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
  assert set(modes.values()) == {0o666 & ~_umask()} and modes["model.safetensors"] & 0o044, modes
  # progress: one print()ed line per stage, the reload check's difference, the Auto class
  stages = ["reading", "verifying", "restoring checkpoint 2", "writing BERT", "wrote",
            "reload check: transformers.AutoModelForMaskedLM on 3 rows: max |logits "
            "difference| ", "load it with transformers.AutoModelForMaskedLM.from_pretrained("]
  assert [line.startswith(f"export: {stage}") for line, stage in zip(said, stages)] == [
      True] * len(stages) and len(said) == len(stages), said
  diff, scale = map(float, re.search(r"difference\| (\S+) \(of values up to (\S+)\)$",
                                      said[5]).groups())
  assert diff <= TOL and scale >= 1, said[5]
  # the check fails where the folder does not reproduce the run (here: ours off by 1%)
  off = dataclasses.replace(written[0], ours=lambda ids, m: written[0].ours(ids, m) * 1.01)
  tok = WordPieceTokenizer.from_vocab(out / "vocab.txt")
  with pytest.raises(ValueError, match="does not reproduce the run"):
    export.reload_check([off], tok, 32, report=lambda _: None)
  # No NSP head in this run: HF's class with exactly these tensors.
  assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
  ours = load_hf_bert(out, pretraining=True, nsp=False, scan_layers=_run_scans(workdir))
  _assert_equal_trees(_pure_params(ours), _checkpoint_params(workdir, 2))

  hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True,
                                                               output_loading_info=True)
  assert type(hf).__name__ == "BertForMaskedLM"
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  inputs, mask = _hf_inputs(out)
  with torch.no_grad():
    ref = hf.eval()(**inputs).logits.numpy()
  logits, _, _ = ours(*(inputs[k].numpy() for k in ("input_ids", "attention_mask",
                                                    "token_type_ids")))
  assert np.abs(np.asarray(logits)[mask] - ref[mask]).max() <= TOL


def test_electra_run_command_exports_discriminator_and_generator(electra_run, tmp_path):
  workdir = electra_run
  out = tmp_path / "hf"
  cmd = [sys.executable, "-m", "encoder_jax.convert.export", f"--workdir={workdir}",
         "--step=1", f"--out={out}"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  gen_dir = out / "generator"
  assert f"export: wrote {gen_dir}: ElectraForMaskedLM" in proc.stdout
  assert proc.stdout.rstrip().splitlines()[-2:] == [
      f"export: load it with transformers.AutoModelForPreTraining.from_pretrained('{out}')",
      f"export: load it with transformers.AutoModelForMaskedLM.from_pretrained('{gen_dir}')"]
  assert proc.stdout.count("export: reload check: ") == 2, proc.stdout

  ours = load_hf_electra_pair(out, gen_dir, scan_layers=_run_scans(workdir))
  at_1, at_2 = _checkpoint_params(workdir, 1), _checkpoint_params(workdir, 2)
  _assert_equal_trees(_pure_params(ours), at_1)  # --step=1, not the newest
  assert not np.array_equal(at_1["rtd"]["out"]["kernel"], at_2["rtd"]["out"]["kernel"])

  disc, info_d = transformers.ElectraForPreTraining.from_pretrained(
      out, local_files_only=True, output_loading_info=True)
  gen, info_g = transformers.ElectraForMaskedLM.from_pretrained(
      gen_dir, local_files_only=True, output_loading_info=True)
  for info in (info_d, info_g):
    assert not info["missing_keys"] and not info["unexpected_keys"], info
  inputs, mask = _hf_inputs(out)
  ids, msk, types = (inputs[k].numpy() for k in ("input_ids", "attention_mask",
                                                 "token_type_ids"))
  with torch.no_grad():
    ref_rtd, ref_gen = disc.eval()(**inputs).logits.numpy(), gen.eval()(**inputs).logits.numpy()
  rtd = np.asarray(ours.rtd(ours.discriminator(ids, msk, types).hidden_BxTxD))
  gen_logits = np.asarray(ours.gen_mlm(ours.generator(ids, msk, types).hidden_BxTxD,
                                       ours.token_embed))
  assert np.abs(rtd[mask] - ref_rtd[mask]).max() <= TOL
  assert np.abs(gen_logits[mask] - ref_gen[mask]).max() <= TOL


def test_export_refuses_what_it_cannot_do(mlm_run, tmp_path):
  workdir = mlm_run
  with pytest.raises(ValueError, match=r"available: \[1, 2\]"):
    export.export_run(workdir, tmp_path / "a", step=7)
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "mine.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="not empty"):
    export.export_run(workdir, tmp_path / "full")
  assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"
  (tmp_path / "model.bin").write_text("keep me too")
  with pytest.raises(FileExistsError, match=r"model\.bin is a file; export writes a folder .* "
                     r"e\.g\. --out=\S*model\.bin_hf"):
    export.export_run(workdir, tmp_path / "model.bin")
  assert (tmp_path / "model.bin").read_text() == "keep me too"
  with pytest.raises(FileNotFoundError, match=r"lacks config\.json and checkpoints/"):
    export.export_run(tmp_path, tmp_path / "b")


@pytest.mark.parametrize("vocab, pad, tokenizer_file", [("minilm", 0, "vocab.txt"),
                                                        ("demo-bpe:512", 1, "vocab.json")])
def test_a_roberta_shaped_run_exports_as_roberta_and_reloads_with_its_logits(
    env, tmp_path, vocab, pad, tokenizer_file):
  """A run of RoBERTa's shape (MLM alone, one token type, learned positions, post-LN):
  RobertaForMaskedLM, whose position table is ours below HF's padding rows; transformers
  computes the run's logits, and AutoTokenizer reads the run's vocab, BERT's WordPiece or a
  byte-level BPE (RobertaTokenizer from vocab.json + merges.txt), with encoder_jax's ids."""
  workdir = _train(env, tmp_path / "run", vocab=vocab, type_vocab_size=1, layer_norm_eps=1e-5)
  out = tmp_path / "hf"
  written = export.export_run(workdir, out, check=False)
  assert [(w.hf_class, w.auto_class) for w in written] == [("RobertaForMaskedLM",
                                                            "AutoModelForMaskedLM")]
  assert (out / tokenizer_file).is_file()
  hf_cfg = json.loads((out / "config.json").read_text())
  # HF counts positions from the pad id: 0 in BERT's WordPiece, 1 in RoBERTa's BPE
  assert (hf_cfg["model_type"], hf_cfg["pad_token_id"], hf_cfg["max_position_embeddings"],
          hf_cfg["type_vocab_size"], hf_cfg["layer_norm_eps"]) == ("roberta", pad, 32 + pad + 1,
                                                                  1, 1e-5)
  hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True,
                                                               output_loading_info=True)
  assert type(hf).__name__ == "RobertaForMaskedLM"
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  hf_tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  theirs = hf_tok(TEXTS, padding="max_length", max_length=16, truncation=True,
                  return_tensors="np")
  assert "token_type_ids" not in theirs  # RoBERTa has one type
  ours_rows = tokenizer.load(out / tokenizer_file).batch_encode_pairs(TEXTS, max_length=16)
  np.testing.assert_array_equal(theirs["input_ids"], ours_rows["input_ids"])
  mask = ours_rows["mask"].astype(bool)
  with torch.no_grad():
    ref = hf.eval()(input_ids=torch.tensor(theirs["input_ids"]),
                    attention_mask=torch.tensor(theirs["attention_mask"])).logits.numpy()
  model = RunDir.find(workdir).model(2, vocab_pad_multiple=1)  # HF's vocab_size columns
  logits, _, _ = model(ours_rows["input_ids"], ours_rows["mask"])
  assert np.abs(np.asarray(logits)[mask] - ref[mask]).max() <= TOL


@pytest.mark.parametrize("preset,model,classes", [
    ("size=tiny", {"embedding_size": 8}, [("ElectraForMaskedLM", "AutoModelForMaskedLM")]),
    ("size=tiny,objective=replace_mlm", {}, [("ElectraModel", "AutoModel"),
                                             ("ElectraForMaskedLM", "AutoModelForMaskedLM")]),
])
def test_electra_shaped_runs_export_and_reload_with_their_outputs(tmp_path, preset, model,
                                                                  classes):
  """An MLM run with an embedding projection (HF BERT has none) is ELECTRA's generator model;
  a Replace-MLM run's discriminator head has no HF class: a bare ElectraModel, compared on
  its hidden states. Runs written as the trainer writes them, with random parameters."""
  import run_helpers as R  # pylint: disable=g-import-not-at-top
  R.saved_run(tmp_path / "run", R.run_config(R.tiny_vocab(tmp_path), preset, **model))
  said = []
  written = export.export_run(tmp_path / "run", tmp_path / "hf", report=said.append)
  assert [(w.hf_class, w.auto_class) for w in written] == classes
  checks = [line for line in said if "reload check" in line]
  assert len(checks) == len(classes), said
  left_out = [line for line in said if "left out" in line]
  assert left_out == ([] if len(classes) == 1 else [
      "export: left out disc_mlm: ElectraModel has no place for them"]), said
  # independently of the check: the first folder in transformers against the run's model
  hf = getattr(transformers, classes[0][0]).from_pretrained(written[0].folder).eval()
  ids = np.array([[2, 5, 6, 7, 3, 0], [2, 8, 9, 3, 0, 0]])
  mask = ids != 0
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)))
  model = RunDir.find(tmp_path / "run").model(7, vocab_pad_multiple=1)
  if classes[0][0] == "ElectraModel":
    ours, theirs = model.discriminator(ids, mask).hidden_BxTxD, out.last_hidden_state
  else:
    ours, theirs = model(ids, mask)[0], out.logits
  ours, theirs = np.asarray(ours)[mask], theirs.numpy()[mask]
  assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()  # fp32, outputs ~500


def _cli(workdir, out, *args):
  return subprocess.run([sys.executable, "-m", "encoder_jax.convert.export", f"--workdir={workdir}",
                         f"--out={out}", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def test_help_names_the_auto_class_of_each_run_shape():
  proc = subprocess.run([sys.executable, "-m", "encoder_jax.convert.export", "--help"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  # (absl's --help exits 1)
  for hf_class, auto in (("RobertaForMaskedLM", "AutoModelForMaskedLM"),
                         ("BertForPreTraining", "AutoModelForPreTraining"),
                         ("BertForMaskedLM", "AutoModelForMaskedLM"),
                         ("ElectraForMaskedLM", "AutoModelForMaskedLM")):
    assert re.search(rf"{hf_class} +{auto}\n", proc.stdout), (hf_class, proc.stdout[:3000])


def test_a_pre_ln_alibi_run_is_refused_in_one_line(tmp_path):
  """The demo recipe's former block (configs/pretrain.py:runlocal,block=alibi: pre-LN, ALiBi,
  8 heads) has no HF equivalent: one line names both switches and the nearest configuration
  that exports, before any checkpoint is read (this run's checkpoints/ is empty) and with
  nothing written to --out."""
  config = loop_helpers.pretrain.get_config("runlocal=True,block=alibi")  # configs/pretrain.py
  assert config.model.norm_first and config.model.position_bias == "alibi"
  workdir, out = tmp_path / "run", tmp_path / "hf"
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / setup.CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
  proc = _cli(workdir, out)
  assert proc.returncode == 1, proc.stderr[-3000:]
  said = [line for line in proc.stderr.splitlines() if line.startswith("export:")]
  assert len(said) == 1 and proc.stderr.rstrip().endswith(said[0]), proc.stderr[-3000:]
  for part in ("export: model.position_bias='alibi' has no transformers equivalent in "
               "RoBERTa/BERT/ELECTRA/ModernBERT (HF has learned absolute positions only); the "
               "closest, BERT, has no place for model.norm_first=True (HF's blocks are post-LN);",
               "the nearest exportable configuration is this run's with "
               "--config.model.norm_first=False --config.model.position_bias=none, which "
               "exports as BERT (as configs/pretrain.py's presets are without runlocal, e.g. "
               "configs/pretrain.py:size=tiny)", f"init=ckpt:{workdir} ",
               "Nothing was written to --out"):
    assert part in said[0], said[0]
  assert not out.exists()
  assert proc.stdout.splitlines() == [f"export: reading {workdir / setup.CONFIG_FILE}"]
  # An ELECTRA run with ALiBi (post-LN): the ELECTRA family is the closest
  config.objective.objective = "electra"
  config.model.norm_first = False
  (workdir / setup.CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
  with pytest.raises(export.NotRepresentable, match=r"^model\.position_bias='alibi' has no .*"
                     r"which exports as ELECTRA .*configs/pretrain\.py:size=tiny,"
                     r"objective=electra\)"):
    export.export_run(workdir, out, report=lambda _: None)
  assert not out.exists()
  # No switch lacking everywhere: the closest family and what it lacks (ELECTRA-small's
  # embedding projection with NSP: BERT has no projection, ELECTRA no NSP head).
  from encoder_jax import hf
  from encoder_jax.model.config import ModelConfig
  from encoder_jax.objectives.pretraining import ObjectiveConfig
  cfg, obj = ModelConfig(embedding_size=128), ObjectiveConfig(sentence_task="nsp")
  assert export.refusal("runs/x", cfg, obj, hf.exporting_family(cfg, obj)[1]).startswith(
      "no family in RoBERTa/BERT/ELECTRA/ModernBERT represents this run: the closest, BERT, has "
      "no place for model.embedding_size=128 (HF BERT has no embedding projection to "
      "hidden_size=768); the nearest exportable configuration is this run's with "
      "--config.model.embedding_size=0, which exports as BERT. Fine-tune")


@pytest.mark.parametrize("preset,model,family", [
    ("size=tiny", {}, "BERT"),
    ("size=tiny,nsp=nsp", {}, "BERT"),
    ("size=tiny", {"type_vocab_size": 1}, "RoBERTa"),
    ("size=tiny", {"type_vocab_size": 0}, "RoBERTa"),
    ("size=tiny,nsp=sop", {"type_vocab_size": 1}, "BERT"),
    ("size=tiny", {"embedding_size": 64}, "ELECTRA"),
    ("size=tiny,objective=electra", {}, "ELECTRA"),
    ("size=tiny,objective=replace_mlm", {"type_vocab_size": 1}, "ELECTRA"),
    ("size=tiny", {"type_vocab_size": 1, "activation": "relu"}, "BERT"),
    ("size=tiny,nsp=nsp", {"embedding_size": 64}, None),
    ("size=tiny,norm=pre", {}, None),
])
def test_export_takes_the_first_family_that_represents_the_run(preset, model, family):
  """Each preset shape goes to the family that computes it exactly (hf.FAMILIES' order:
  RoBERTa, BERT, ELECTRA), or to none."""
  from encoder_jax import hf
  from encoder_jax.model.config import ModelConfig
  from encoder_jax.objectives.pretraining import ObjectiveConfig
  config = loop_helpers.pretrain.get_config(preset)
  d = {k: v for k, v in config.model.to_dict().items()
       if k not in ("scan_layers", "remat_policy", "dtype", "dot_dtype")}
  cfg = ModelConfig(**{**d, "embedding_size": d["embedding_size"] or None, **model})
  obj = ObjectiveConfig(objective=config.objective.objective,
                        sentence_task=config.objective.sentence_task)
  found, gaps = hf.exporting_family(cfg, obj)
  assert (found.name if found else None) == family, [(f.name, g) for f, g in gaps]


def _umask():
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def test_a_modernbert_block_run_exports_as_modernbert_and_reloads_with_its_logits(env,
                                                                                 tmp_path):
  """A run of ModernBERT's block (pre-LN, RoPE with two thetas, GeGLU, bias-free, a local
  window in two layers of three, embedding norm) is refused by BERT, RoBERTa and ELECTRA and
  written as ModernBertForMaskedLM, whose logits transformers reproduces (the reload check)."""
  from encoder_jax.model.config import MODERNBERT_BLOCK  # pylint: disable=g-import-not-at-top
  block = {k: v for k, v in MODERNBERT_BLOCK.items() if k not in ("max_positions",
                                                                 "hidden_dropout",
                                                                 "attention_dropout")}
  workdir = _train(env, tmp_path / "run", **{**block, "num_layers": 3, "local_window": 8})
  said = []
  written = export.export_run(workdir, tmp_path / "hf", report=said.append)
  assert [(w.hf_class, w.auto_class) for w in written] == [("ModernBertForMaskedLM",
                                                            "AutoModelForMaskedLM")]
  check = [line for line in said if "reload check" in line]
  assert check and float(re.search(r"difference\| (\S+)", check[0]).group(1)) <= TOL, said
  hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert (hf_cfg["model_type"], hf_cfg["local_attention"], hf_cfg["num_hidden_layers"]) == (
      "modernbert", 8, 3)


def test_a_switch_no_family_holds_is_refused_naming_it(env, tmp_path):
  """RoPE in BERT's post-LN block: HF BERT, RoBERTa and ELECTRA have no rotary embeddings,
  ModernBERT no post-LN block: refused in one line naming the switch, nothing written."""
  workdir = _train(env, tmp_path / "run", rope=True, learned_positions=False)
  with pytest.raises(export.NotRepresentable, match=r"model\.rope=True .*HF's BERT block has no "
                     r"place for rotary position embeddings"):
    export.export_run(workdir, tmp_path / "hf", report=lambda _: None)
  assert not (tmp_path / "hf").exists()
