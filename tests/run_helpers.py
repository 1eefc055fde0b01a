"""Pre-training run folders without training: what encoder_jax.train.loop leaves in a workdir
(config.json + checkpoints/<step>/{state, data, meta, checksums.json}), with random numbers
as parameters, for the readers of run folders (train/run_dir.py, convert/, finetune/).

The parameters are the abstract TrainState filled with random normals: these tests check where
values go, not the initialisers, whose eager XLA compilation costs seconds each on 2 cores."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from encoder_jax.train import setup
from encoder_jax.train.checkpoint import Checkpointer
from encoder_jax.train.step import TrainState

from configs import pretrain

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "whale", "ship", "call", "me",
          "is", "was", "state", "union", "strong", "and", "grow", "##ing", "jury", "said",
          "election", "it", "of", "our", "a", ".", ","] + [f"w{i}" for i in range(13)]


def tiny_vocab(folder: pathlib.Path) -> str:
  """A 40-token WordPiece vocab (BERT's specials first: [PAD] is id 0)."""
  path = folder / "vocab.txt"
  path.write_text("\n".join(TOKENS) + "\n")
  return str(path)


def run_config(vocab: str, preset: str = "size=tiny", **model):
  """configs/pretrain.py's `preset` shrunk to 1 layer of d=16 on rows of 16, fp32, unrolled
  layers (the CPU's choice), `model` fields changed."""
  config = pretrain.get_config(f"{preset},precision=fp32")
  config.model.update(dict(num_layers=1, hidden_size=16, num_heads=2, ffn_size=32,
                           max_positions=24, scan_layers="False", remat_policy="none",
                           hidden_dropout=0.0, attention_dropout=0.0))
  config.model.update(model)
  config.data.update(dict(vocab=vocab, max_length=16, batch_size=2))
  return config


def saved_run(workdir: pathlib.Path, config, steps=(7,), seed=0) -> dict[int, nnx.State]:
  """Writes config.json and one sealed checkpoint per step (parameters scaled by the step, so
  steps differ) into `workdir`; returns each step's parameters."""
  s = setup.build(config)
  abstract = jax.eval_shape(s.init_fn)
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype),
                        abstract.params)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / setup.CONFIG_FILE).write_text(s.config_json)
  ckpt = Checkpointer(workdir / "checkpoints", keep=len(steps), async_save=False)
  saved = {}
  for step in steps:
    p = jax.tree.map(lambda x, k=step: x * k, params)
    opt = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract.opt_state)
    ckpt.save(step, TrainState(jnp.asarray(step, jnp.int32), p, opt), data_state={"i": step},
              meta={"wall_s": 1.0})
    saved[step] = p
  ckpt.close()
  return saved


def pure(tree) -> dict:
  """Nested dicts of numpy arrays with string keys (nnx.State or a module's Params)."""
  if isinstance(tree, nnx.Module):
    tree = nnx.state(tree, nnx.Param)
  if isinstance(tree, nnx.State):
    tree = nnx.to_pure_dict(tree)
  strkeys = lambda t: ({str(k): strkeys(v) for k, v in t.items()} if isinstance(t, dict)
                       else np.asarray(t))
  return strkeys(tree)


def assert_same(a, b):
  a, b = pure(a), pure(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)
