"""config.init_from: a new pre-training run starts from a run's parameters (all of them, heads
included; BERT's phase 2) or from a HF folder (continued pre-training of RoBERTa with its LM
head, of all-MiniLM-L6-v2's encoder), with a fresh optimizer and schedule; mismatched vocab
or shapes are refused naming both."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from configs import pretrain as pretrain_config
from encoder_jax import hf
from encoder_jax.data import fetch
from encoder_jax.model import vocab_padding
from encoder_jax.train import init_from, loop, setup
from encoder_jax.train.pretrained import Backbone

import loop_helpers as H


def test_merge_takes_shared_paths_and_refuses_other_shapes():
  fresh = {"a": {"w": np.zeros((2, 3), np.float32)}, "b": np.ones(4, np.float32)}
  merged, taken, kept = init_from.merge(fresh, {"a": {"w": np.full((2, 3), 7.0)},
                                                "z": np.ones(1)}, "src")
  assert taken == ["a/w"] and kept == ["b"]
  assert merged["a"]["w"].dtype == np.float32 and (merged["a"]["w"] == 7).all()
  assert merged["b"] is fresh["b"]
  with pytest.raises(ValueError, match=r"a/w: \(3, 3\) in src, \(2, 3\) in this run"):
    init_from.merge(fresh, {"a": {"w": np.ones((3, 3))}}, "src")
  with pytest.raises(ValueError, match="none of its parameters"):
    init_from.merge(fresh, {"q": np.ones(1)}, "src")


def test_layers_are_taken_in_the_run_s_layout():
  """A source read scanned ([L, ...] per parameter) into an unrolled run and back."""
  per_layer = [{"w": np.full((2,), i, np.float32)} for i in range(3)]
  unrolled = {"enc": {"blocks": dict(enumerate(per_layer)), "emb": np.ones(2)}}
  scanned = {"enc": {"blocks": {"w": np.stack([x["w"] for x in per_layer])},
                     "emb": np.ones(2)}}
  merged, taken, kept = init_from.merge(jax.tree.map(np.zeros_like, unrolled), scanned, "s")
  assert not kept and len(taken) == 4
  jax.tree.map(np.testing.assert_array_equal, merged, unrolled)
  merged, _, kept = init_from.merge(jax.tree.map(np.zeros_like, scanned), unrolled, "s")
  assert not kept
  jax.tree.map(np.testing.assert_array_equal, merged, scanned)


def test_a_source_without_vocabulary_padding_fills_a_padded_run():
  """A HF checkpoint's 30,522-row table (and MLM bias) into a run padded to 30,592 rows
  (model.vocab_pad_multiple): zero rows appended; a padded source into an unpadded run:
  its zero rows cut; non-zero rows past the run's table are a real size clash."""
  table = ("bert", "encoder", "embeddings", "token", "embedding")
  fresh = {"bert": {"encoder": {"embeddings": {"token": {"embedding": np.ones((48, 4))}}}},
           "mlm": {"bias": np.ones(48)}}
  src = {"bert": {"encoder": {"embeddings": {"token": {"embedding": np.full((45, 4), 2.0)}}}},
         "mlm": {"bias": np.full(45, 3.0)}}
  merged, taken, _ = init_from.merge(fresh, src, "src")
  got = merged
  for k in table:
    got = got[k]
  assert len(taken) == 2 and got.shape == (48, 4) and (got[:45] == 2).all()
  assert not got[45:].any() and not merged["mlm"]["bias"][45:].any()
  back, _, _ = init_from.merge(src, merged, "padded")  # padded source, unpadded run
  assert back["mlm"]["bias"].shape == (45,)
  merged["mlm"]["bias"][46] = 1.0  # a real row past the run's table: not padding
  with pytest.raises(ValueError, match=r"mlm/bias: \(48,\) in src, \(45,\) in this run"):
    init_from.merge(src, merged, "src")


def test_an_encoder_goes_where_each_objective_keeps_it():
  pre = Backbone(None, encoder={"e": 1}, pooler={"p": 2}, source="x")
  assert init_from.source_tree(pre, is_electra=False) == {"bert": {"encoder": {"e": 1},
                                                                   "pooler": {"p": 2}}}
  assert init_from.source_tree(pre, is_electra=True) == {"discriminator": {"e": 1},
                                                         "pooler": {"p": 2}}
  full = Backbone(None, None, None, "x", params={"anything": 1})
  assert init_from.source_tree(full, is_electra=True) == {"anything": 1}


@pytest.fixture(scope="module")
def phase1(env, tmp_path_factory):
  """A finished 6-step run to start from."""
  config = H.tiny_config(env, steps=H.N)
  workdir = tmp_path_factory.mktemp("phase1") / "run"
  loop.train_and_evaluate(config, str(workdir))
  return config, workdir


def test_a_run_starts_from_every_parameter_of_another_with_a_fresh_optimizer(env, phase1):
  config, workdir = phase1
  new = H.tiny_config(env, steps=2)
  new.init_from = str(workdir)
  s = setup.build(new)
  state = loop.start_state(s)
  done, _, _ = H.restore(workdir, H.N, config)
  H.assert_bitwise_equal(state.params, done.params)  # encoder, MLM head: all of them
  assert int(state.step) == 0
  fresh = loop.start_state(setup.build(H.tiny_config(env)))
  H.assert_bitwise_equal(state.opt_state, fresh.opt_state)  # zero moments, count 0
  # a checkpoint step folder names the same parameters
  new.init_from = str(workdir / "checkpoints" / "6")
  step_dir = loop.start_state(setup.build(new))
  H.assert_bitwise_equal(step_dir.params, done.params)


def test_the_trainer_loads_init_from_itself(env, phase1, capsys):
  """train_and_evaluate(config, workdir) with config.init_from set, called as any caller
  would (no entry point loads it first), on rows of another length (the phase-2 move): the run
  starts from every parameter of the source and trains on."""
  _, workdir = phase1
  new = H.tiny_config(env, steps=2)
  new.init_from = str(workdir)
  new.data.max_length = 16
  summary = loop.train_and_evaluate(new, str(workdir.parent / "phase2"))
  assert summary["steps"] == 2 and summary["resumed_from"] is None
  said = capsys.readouterr().out
  assert f"init_from ckpt:{workdir / 'checkpoints' / '6'}: " in said, said
  assert " parameter arrays taken, 0 left fresh;" in said, said


def test_mismatched_shape_vocab_or_model_is_refused_naming_both(env, phase1, tmp_path):
  _, workdir = phase1
  wider = H.tiny_config(env, steps=2)
  wider.model.hidden_size = 64
  wider.init_from = str(workdir)
  # (32,) / (64,) with the CPU's unrolled layers; (1, 32) / (1, 64) with scanned ones
  with pytest.raises(ValueError, match=r"20 parameter\(s\) differ in shape.*out_bias: "
                     r"\((1, )?32,?\) in ckpt:\S*run/checkpoints/6, \((1, )?64,?\) in this run"):
    loop.start_state(setup.build(wider))
  # the same size, but two tokens swapped: the embedding rows would mean other tokens
  lines = open(fetch.minilm_vocab()).read().split("\n")
  lines[1000], lines[1001] = lines[1001], lines[1000]
  (tmp_path / "vocab.txt").write_text("\n".join(lines))
  other = H.tiny_config(env, steps=2)
  other.data.vocab = str(tmp_path / "vocab.txt")
  other.init_from = str(workdir)
  with pytest.raises(ValueError, match=f"vocab {fetch.minilm_vocab()}.*tokenizes with "
                                       f"{tmp_path / 'vocab.txt'}"):
    loop.start_state(setup.build(other))
  electra = H.tiny_config(env, steps=2)
  electra.objective.objective = "electra"
  electra.init_from = str(workdir)
  with pytest.raises(ValueError, match="none of its parameters"):
    loop.start_state(setup.build(electra))


def test_a_roberta_folder_continues_pre_training_with_its_lm_head(env, tmp_path):
  """init_from=<a RobertaForMaskedLM folder> (a random one of the run's shape, from a
  RobertaConfig; the run's BERT vocab, whose pad id 0 HF's positions count from): its encoder
  and its LM head are the run's step-0 parameters, read here from the torch model itself
  (our position 0 is HF's row pad + 1), and the run trains on from them."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config = H.tiny_config(env, steps=2, eval_every=0)
  config.model.update(dict(type_vocab_size=1, layer_norm_eps=1e-5))
  m = config.model
  torch.manual_seed(0)
  hf = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
      vocab_size=30522, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
      num_attention_heads=m.num_heads, intermediate_size=m.ffn_size,
      max_position_embeddings=m.max_positions + 1, type_vocab_size=1, pad_token_id=0,
      layer_norm_eps=1e-5))
  with torch.no_grad():
    for p in hf.parameters():
      p.copy_(torch.randn_like(p) * 0.05)
  folder = tmp_path / "roberta"
  hf.save_pretrained(folder)
  (folder / "vocab.txt").write_text(open(fetch.minilm_vocab()).read())
  config.init_from = str(folder)
  state = loop.start_state(setup.build(config))
  assert int(state.step) == 0
  padded = nnx.to_pure_dict(state.params)
  p = vocab_padding.unpad_vocab(padded, hf.config.vocab_size)  # the run pads its table to 128
  assert not np.asarray(padded["mlm"]["bias"][hf.config.vocab_size:]).any()
  emb, head = p["bert"]["encoder"]["embeddings"], p["mlm"]
  # the run's layer layout (unrolled on a CPU), whatever layout the folder was read in
  blocks = p["bert"]["encoder"]["blocks"]
  layer0 = blocks[0] if 0 in blocks else jax.tree.map(lambda x: x[0], blocks)
  t = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  d = m.hidden_size
  for ours, theirs in ((emb["token"]["embedding"], t["roberta.embeddings.word_embeddings.weight"]),
                       (np.asarray(layer0["attn"]["qkv_kernel"])[:, 0].reshape(d, d),
                        t["roberta.encoder.layer.0.attention.self.query.weight"].T),
                       (layer0["ln_ffn"]["scale"],
                        t["roberta.encoder.layer.0.output.LayerNorm.weight"]),
                       (emb["position"]["embedding"],
                        t["roberta.embeddings.position_embeddings.weight"][1:]),
                       (head["transform"]["kernel"], t["lm_head.dense.weight"].T),
                       (head["ln"]["scale"], t["lm_head.layer_norm.weight"]),
                       (head["bias"], t["lm_head.bias"])):
    np.testing.assert_array_equal(np.asarray(ours), theirs)
  summary = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert summary["steps"] == 2 and summary["resumed_from"] is None


def test_phase_2_config_is_berts_seq_512_phase_and_needs_a_phase_1_run():
  c = pretrain_config.get_config("size=base,phase=2")
  assert (c.phase, c.data.max_length, c.train.steps, c.optim.warmup_steps) == (2, 512,
                                                                               100_000, 1_000)
  assert c.model.max_positions == 512 and pretrain_config.get_config("size=base").phase == 1
  with pytest.raises(setup.ConfigError, match="init_from=<phase-1 workdir>"):
    setup.check_train_config(c)
  with pytest.raises(ValueError, match="phase='3'"):
    pretrain_config.get_config("phase=3")


@pytest.mark.slow
def test_continued_pretraining_of_minilm_starts_far_below_a_random_init(env, tmp_path):
  """all-MiniLM-L6-v2's encoder on real text (the demo corpus's Moby-Dick part), at
  BERT's learning rate (1e-4): after STEPS steps its held-out MLM loss is far below a random
  encoder's of the same shape after as many steps (see MIN_GAP). Its MLM head starts fresh (the
  model ships without one), tied to the loaded token embedding; at a high learning rate (3e-3)
  the fresh head's first updates wreck the loaded encoder (measured: 15.3 nats vs 8.5 random
  after 5 steps), so continued pre-training wants a fine-tuning-sized rate."""
  minilm = hf.model_config(fetch.minilm_dir())
  shape = {f.name: getattr(minilm, f.name) for f in dataclasses.fields(minilm)
           if f.name in ("hidden_size", "num_layers", "num_heads", "ffn_size", "max_positions",
                         "type_vocab_size", "activation", "layer_norm_eps")}
  losses = {}
  for init in ("minilm", ""):
    config = H.tiny_config(env, steps=STEPS, log_every=STEPS, eval_every=STEPS, eval_steps=2)
    config.optim.update(dict(learning_rate=1e-4, warmup_steps=2, total_steps=STEPS))
    config.model.update(dict(shape, norm_first=False, scan_layers="True"))
    config.data.update(dict(source="demo:moby_dick", max_length=64, batch_size=4,
                            eval_split="validation"))
    config.init_from = init
    summary = loop.train_and_evaluate(config, str(tmp_path / (init or "random")))
    losses[init or "random"] = summary["final_eval"]["mlm_loss"]
  print(f"\nheld-out MLM loss after {STEPS} steps: all-MiniLM-L6-v2 {losses['minilm']:.2f}, "
        f"random init {losses['random']:.2f} (min gap {MIN_GAP})")
  assert losses["minilm"] < losses["random"] - MIN_GAP, losses


STEPS = 10
MIN_GAP = 1.2  # nats (measured after 10 steps of 4 rows on Moby-Dick: 8.29 vs 10.12 = 1.83; of 8
# rows: 7.89 vs 10.08; on the State-of-the-Union part, 9x the text to tokenize: 7.74 vs 9.91. A
# step of this 22M-parameter model with its 30,522-word head is most of the test's time, so 4 rows)


def test_state_params_are_an_nnx_state():
  """init_from.apply works on the trainer's nnx.State (replace_by_pure_dict keeps its type)."""
  state = nnx.State({"a": {"w": nnx.Param(jax.numpy.zeros(2))}})
  pre = Backbone(None, None, None, "x", params={"a": {"w": np.ones(2)}})
  vocab = fetch.minilm_vocab()
  out = init_from.apply(state, pre, False, str(vocab), lambda s: None)
  assert isinstance(out, nnx.State) and (np.asarray(out["a"]["w"][...]) == 1).all()
  assert (np.asarray(state["a"]["w"][...]) == 0).all()  # the input is left as it was
