"""The decoder on the encoder's memory: torch parity, padded memory is invisible, and a tiny
seq2seq model that learns to reverse variable-length digit strings."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from encoder_jax.model import EncoderOutput, ModelConfig
from seq2seq_decoder import DecoderBlock, Seq2Seq, greedy_decode, make_causal_mask
from random_params import randomize

try:
  import torch
except ImportError:  # the parity test needs the `test` extra; the others do not
  torch = None


def _std(name: str) -> float:
  """The random parameters' scale: norms and biases 0.1, weights 0.05."""
  return 0.1 if name in ("scale", "bias") or name.endswith("_bias") else 0.05


def _copy_into_torch(block: DecoderBlock, layer, d: int):
  t = lambda a: torch.tensor(np.asarray(a))
  sa, ca = block.attn, block.cross_attn
  with torch.no_grad():
    layer.self_attn.in_proj_weight.copy_(t(np.asarray(sa.qkv_kernel[...]).reshape(d, 3 * d).T))
    layer.self_attn.in_proj_bias.copy_(t(np.asarray(sa.qkv_bias[...]).reshape(3 * d)))
    layer.self_attn.out_proj.weight.copy_(t(np.asarray(sa.out_kernel[...]).reshape(d, d).T))
    layer.self_attn.out_proj.bias.copy_(t(sa.out_bias[...]))
    # torch packs the cross-attention's q, k, v in one [3D, D] matrix too: q from ours, k and v
    # from our fused [D, 2, N, H] memory kernel.
    q_w = np.asarray(ca.q_kernel[...]).reshape(d, d).T
    kv_w = np.asarray(ca.kv_kernel[...]).reshape(d, 2 * d).T
    layer.multihead_attn.in_proj_weight.copy_(t(np.concatenate([q_w, kv_w])))
    layer.multihead_attn.in_proj_bias.copy_(t(np.concatenate(
        [np.asarray(ca.q_bias[...]).reshape(d), np.asarray(ca.kv_bias[...]).reshape(2 * d)])))
    layer.multihead_attn.out_proj.weight.copy_(t(np.asarray(ca.out_kernel[...]).reshape(d, d).T))
    layer.multihead_attn.out_proj.bias.copy_(t(ca.out_bias[...]))
    layer.linear1.weight.copy_(t(np.asarray(block.ffn_in.kernel[...]).T))
    layer.linear1.bias.copy_(t(block.ffn_in.bias[...]))
    layer.linear2.weight.copy_(t(np.asarray(block.ffn_out.kernel[...]).T))
    layer.linear2.bias.copy_(t(block.ffn_out.bias[...]))
    for ln, ours in ((layer.norm1, block.ln_attn), (layer.norm2, block.ln_cross),
                     (layer.norm3, block.ln_ffn)):
      ln.weight.copy_(t(ours.scale[...]))
      ln.bias.copy_(t(ours.bias[...]))


def _cfg(**kw):
  return ModelConfig(**{**dict(hidden_size=64, num_heads=4, ffn_size=256, num_layers=1,
                               vocab_size=16, max_positions=16, layer_norm_eps=1e-5,
                               hidden_dropout=0.0, attention_dropout=0.0), **kw})


@pytest.mark.parity
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_block_matches_torch_decoder_layer(norm_first):
  if torch is None:
    pytest.skip("torch is not installed")
  d, h = 64, 4
  block = DecoderBlock(_cfg(norm_first=norm_first), rngs=nnx.Rngs(0))
  randomize(block, 1, _std)
  layer = torch.nn.TransformerDecoderLayer(d, h, 4 * d, dropout=0.0, activation="gelu",
                                           layer_norm_eps=1e-5, batch_first=True,
                                           norm_first=norm_first).eval()
  _copy_into_torch(block, layer, d)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 7, d)).astype(np.float32)
  mem = rng.standard_normal((3, 9, d)).astype(np.float32)
  tgt_valid = np.arange(7)[None, :] < np.array([7, 5, 2])[:, None]
  mem_valid = np.arange(9)[None, :] < np.array([9, 3, 6])[:, None]
  memory = EncoderOutput(jnp.asarray(mem), jnp.asarray(mem_valid))
  ours = np.asarray(block(jnp.asarray(x), make_causal_mask(jnp.asarray(tgt_valid)), memory))
  causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)  # True = masked
  with torch.no_grad():
    theirs = layer(torch.tensor(x), torch.tensor(mem), tgt_mask=causal, tgt_is_causal=True,
                   tgt_key_padding_mask=torch.tensor(~tgt_valid),
                   memory_key_padding_mask=torch.tensor(~mem_valid)).numpy()
  err = np.abs(ours[tgt_valid] - theirs[tgt_valid]).max()
  print(f"decoder block parity norm_first={norm_first}: max abs diff {err:.2e}")
  assert err <= 1e-5


@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_padded_memory_contents_change_nothing_a_real_slot_does(path):
  # "explicit": train mode with attention dropout, the path that materialises probabilities.
  block = DecoderBlock(_cfg(norm_first=True, attention_dropout=0.3 if path == "explicit"
                            else 0.0), rngs=nnx.Rngs(0))
  randomize(block, 2, _std)
  if path == "explicit":
    block.train()
  rng = np.random.default_rng(1)
  x_BxTxD = jnp.asarray(rng.standard_normal((2, 5, 64)), jnp.float32)
  hidden = rng.standard_normal((2, 8, 64)).astype(np.float32)
  mask_BxS = np.arange(8)[None, :] < np.array([[6], [3]])
  self_mask = make_causal_mask(jnp.ones((2, 5), bool))
  key = jax.random.key(7)  # the same dropout masks in every call
  run = nnx.jit(lambda b, h: b(x_BxTxD, self_mask, EncoderOutput(h, jnp.asarray(mask_BxS)),
                               key))
  base = np.asarray(run(block, jnp.asarray(hidden)))

  noisy = hidden.copy()
  noisy[~mask_BxS] = 1e3 * rng.standard_normal((int((~mask_BxS).sum()), 64))
  np.testing.assert_array_equal(np.asarray(run(block, jnp.asarray(noisy))), base)

  moved = hidden.copy()
  moved[1, 2] += 1.0  # the last real slot of row 1
  out = np.asarray(run(block, jnp.asarray(moved)))
  np.testing.assert_array_equal(out[0], base[0])
  assert (np.abs(out[1] - base[1]).max(axis=-1) > 1e-3).all()  # every target position sees it


def test_empty_memory_row_gives_zeros_not_an_average_of_padding():
  cross = DecoderBlock(_cfg(), rngs=nnx.Rngs(0)).cross_attn
  randomize(cross, 3, _std)
  hidden = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 64)), jnp.float32)
  mask = jnp.asarray([[True, True, False, False], [False] * 4])
  out = np.asarray(cross(jnp.ones((2, 3, 64)), EncoderOutput(hidden, mask)))
  # Attention output zeros, then the output projection: only its bias is left.
  np.testing.assert_array_equal(out[1], np.broadcast_to(np.asarray(cross.out_bias[...]),
                                                        (3, 64)))
  assert np.isfinite(out).all() and not np.allclose(out[0], out[1])


# ----------------------------------------------------------------------------- the toy task
PAD, BOS, EOS, DIGIT0 = 0, 1, 2, 3  # digits 0-9 are ids 3..12
MAX_DIGITS = 8
STEPS = 250  # exact match 1.000 at 200-250 steps for seeds 0, 1, 2


def _reversal_batch(rng, n):
  """Source: 1..MAX_DIGITS digits, right-padded. Target: BOS + reversed digits (decoder
  input) and reversed digits + EOS (labels), right-padded."""
  lengths = rng.integers(1, MAX_DIGITS + 1, size=n)
  digits = rng.integers(0, 10, size=(n, MAX_DIGITS)) + DIGIT0
  pos = np.arange(MAX_DIGITS)[None, :]
  src = np.where(pos < lengths[:, None], digits, PAD)
  rev_idx = np.clip(lengths[:, None] - 1 - pos, 0, None)
  rev = np.where(pos < lengths[:, None], np.take_along_axis(digits, rev_idx, 1), PAD)
  labels = np.concatenate([rev, np.full((n, 1), PAD)], 1)
  labels[np.arange(n), lengths] = EOS
  tgt_in = np.concatenate([np.full((n, 1), BOS), rev], 1)
  return src.astype(np.int32), tgt_in.astype(np.int32), labels.astype(np.int32)


@pytest.mark.usefixtures("full_xla_optimization")  # 250 steps: level 2 (tests/conftest.py)
def test_seq2seq_learns_to_reverse_digit_strings():
  t0, cpu0 = time.perf_counter(), time.process_time()
  enc_cfg = ModelConfig(vocab_size=13, hidden_size=64, num_layers=2, num_heads=4, ffn_size=128,
                        max_positions=MAX_DIGITS + 2, type_vocab_size=0, norm_first=True,
                        hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)
  # One compiled initialiser at XLA's lowest optimisation level: half the CPU time of the
  # eager per-parameter initialisers (each its own compile) on 2 cores.
  make = lambda: Seq2Seq(enc_cfg, enc_cfg, rngs=nnx.Rngs(0))
  graphdef, _ = nnx.split(nnx.eval_shape(make))
  init = jax.jit(lambda: nnx.state(make())).lower().compile(
      {"xla_backend_optimization_level": 0})
  model = nnx.merge(graphdef, init())
  schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 50, STEPS, 1e-4)
  opt = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, opt, src, tgt_in, labels):
    def loss_fn(model):
      logits = model(src, tgt_in, src != PAD, tgt_in != PAD)
      weights = (labels != PAD).astype(jnp.float32)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
      return (ce * weights).sum() / weights.sum()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    loss = train_step(model, opt, *_reversal_batch(rng, 64))
  src, _, labels = _reversal_batch(np.random.default_rng(123), 500)
  out = np.asarray(greedy_decode(model, jnp.asarray(src), jnp.asarray(src != PAD), bos_id=BOS,
                                 eos_id=EOS, max_len=MAX_DIGITS + 2))[:, 1:]
  exact = np.mean([(o == l).all() for o, l in zip(out, labels)])
  print(f"reversal: final train loss {float(loss):.4f}, greedy exact match {exact:.3f} on 500 "
        f"held-out strings, {time.perf_counter() - t0:.1f} s wall, "
        f"{time.process_time() - cpu0:.1f} s CPU")
  assert exact >= 0.95
