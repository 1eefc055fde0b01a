"""One process of the multi-host test (tests/train/test_multihost.py); not a test itself.

  python multihost_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR [restore_from]

NUM_PROCESSES processes x (8 / NUM_PROCESSES) CPU devices form one (2, 2, 2) mesh over
`jax.distributed` (gloo collectives on 127.0.0.1). Each process reads only its rows of every
global batch (encoder_jax.data.pipeline host sharding), runs 3 sharded MLM steps, writes a
collective Orbax checkpoint, and saves its losses, gradient norms and the rows it read. With
`restore_from` the (single) process instead restores that checkpoint onto its own mesh and
saves the params. The checkpoint goes to <OUT_DIR or restore_from>/ckpt, or to
$CHECKPOINT_ROOT when set (e.g. gs://bucket/..., tests/gcs/test_gcs_multihost.py).
"""
import os
import sys

pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
restore_from = sys.argv[5] if len(sys.argv) > 5 else None
# XLA_FLAGS: set by the starter (multihost_helpers.spawn: the suite's, this process's devices).
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if nproc > 1:
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                             process_id=pid, initialization_timeout=120)

import numpy as np  # noqa: E402

from encoder_jax.data.fetch import minilm_vocab  # noqa: E402
from encoder_jax.data.pipeline import Loader, LoaderConfig  # noqa: E402
from encoder_jax.data.tokenizer import WordPieceTokenizer  # noqa: E402
from encoder_jax.model import ModelConfig  # noqa: E402
from encoder_jax.train import sharding as sh  # noqa: E402
from encoder_jax.train import step as S  # noqa: E402
from encoder_jax.train.checkpoint import Checkpointer  # noqa: E402
from encoder_jax.train.optim import OptimConfig, build_optimizer  # noqa: E402

SENTENCES = [
    "Call me Ishmael.", "Some years ago, never mind how long precisely, I went to sea.",
    "It is a way I have of driving off the spleen and regulating the circulation.",
    "The state of the union is strong.", "We have work to do in the years ahead.",
    "Whenever it is a damp, drizzly November in my soul, I account it high time to get to sea.",
    "Congress will consider the budget in the spring.", "The whale rose beside the ship.",
    "There is now your insular city of the Manhattoes, belted round by wharves.",
    "Our economy grew faster than in any year since the war.",
    "Right and left, the streets take you waterward.", "Look at the crowds of water-gazers there.",
    "I ask you tonight to pass the bill.", "Nothing will content them but the extremest limit.",
    "The nation is at peace, and its people prosper.", "Queequeg was a native of Kokovoko.",
]
tok = WordPieceTokenizer.from_vocab(minilm_vocab())
enc = tok.batch_encode_pairs(SENTENCES, max_length=24)
rows = [{k: v[i] for k, v in enc.items()} | {"row": np.int32(i)} for i in range(len(SENTENCES))]

cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, num_layers=2, num_heads=4,
                  ffn_size=128, max_positions=32)
obj = S.ObjectiveConfig(vocab_size=tok.vocab_size, mask_id=tok.mask_id,
                        special_ids=(tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id),
                        max_predictions=4)
parts = build_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=1, total_steps=10))
tr, init = S.create(cfg, obj, parts.tx, parts.schedule, seed=0)
mesh = sh.make_mesh((2, 2, 2))
abstract = jax.eval_shape(init)
shardings = sh.state_shardings(abstract, mesh)
ckpt = Checkpointer(os.environ.get("CHECKPOINT_ROOT") or
                    os.path.join(out if restore_from is None else restore_from, "ckpt"),
                    async_save=False)

if restore_from is not None:
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)
  state, data_state, _ = ckpt.restore(ckpt.latest_step(), target)
  flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_leaves_with_path(state.params)}
  np.savez(os.path.join(out, "restored.npz"), step=np.asarray(state.step),
           data_step=data_state["step"], **flat)
  sys.exit(0)

state = jax.jit(init, out_shardings=shardings)()
step = S.make_train_step(tr, shardings, sh.batch_sharding(mesh))
loader = Loader(rows, LoaderConfig(global_batch_size=8, seed=0, process_index=jax.process_index(),
                                   process_count=jax.process_count(), read_threads=1))
it = iter(loader)
losses, grad_norms, read = [], [], []
for _ in range(3):
  local = next(it)
  read.append(local.pop("row"))
  state, m = step(state, sh.shard_batch(local, mesh))
  losses.append(float(m["loss"]))
  grad_norms.append(float(m["grad_norm"]))
ckpt.save(3, state, data_state=it.get_state(), meta={})
ckpt.close()
allgather = jax.experimental.multihost_utils.process_allgather
flat = {jax.tree_util.keystr(p): np.asarray(allgather(x, tiled=True))
        for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
np.savez(os.path.join(out, f"process{pid}.npz"), losses=np.array(losses),
         grad_norms=np.array(grad_norms), read=np.stack(read), **flat)
