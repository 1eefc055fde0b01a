"""Packed rows (model side): a row holding several examples (segment_ids 1..k, positions
restarting per example, as data/shards.decode_row gives them) computes for each example what
the example computes alone in its own row, on every attention path this machine runs
(explicit, XLA, the Pallas TPU kernel under its interpreter), with and without RoPE and
sliding windows; and a row whose segments are not kept apart does not (the test can fail)."""
import logging

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model import Encoder, ModelConfig
from encoder_jax.model import attention
from test_pallas_attention import _hlo_interpret

BASE = dict(vocab_size=60, hidden_size=32, num_layers=3, num_heads=4, ffn_size=48,
            max_positions=128, hidden_dropout=0.0, attention_dropout=0.0, norm_first=True,
            scan_layers=True)
KINDS = {"plain": {}, "rope": dict(rope=True, learned_positions=False),
         "window": dict(local_window=4, global_every=2),
         "rope_window": dict(rope=True, learned_positions=False, rope_theta=160_000.0,
                             local_window=4, global_every=2)}


def packed(lengths_rows: list[list[int]], t: int, seed: int = 0):
  """Packed rows of examples of the given lengths, and each example alone in a row of t."""
  rng = np.random.default_rng(seed)
  ids, seg, pos = (np.zeros((len(lengths_rows), t), np.int32) for _ in range(3))
  alone, spans = [], []
  for r, lengths in enumerate(lengths_rows):
    at = 0
    for k, n in enumerate(lengths):
      example = rng.integers(1, 60, n)
      ids[r, at:at + n], seg[r, at:at + n], pos[r, at:at + n] = example, k + 1, np.arange(n)
      alone.append(np.pad(example, (0, t - n)))
      spans.append((r, at, n))
      at += n
  return ids, seg, pos, np.stack(alone).astype(np.int32), spans


def max_gap(enc, ids, seg, pos, alone, spans, *, segments=True) -> float:
  """Largest difference between each example's vectors in its packed row and alone."""
  out = enc(jnp.asarray(ids), jnp.asarray(seg > 0), segment_ids_BxT=jnp.asarray(seg)
            if segments else None, positions_BxT=jnp.asarray(pos)).hidden_BxTxD
  ref = enc(jnp.asarray(alone), jnp.asarray(alone > 0)).hidden_BxTxD
  return max(float(np.abs(np.asarray(out[r, at:at + n]) - np.asarray(ref[i, :n])).max())
             for i, (r, at, n) in enumerate(spans))


@pytest.mark.parametrize("impl", ["explicit", "xla"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_packed_row_equals_its_examples_alone(impl, kind):
  enc = Encoder(ModelConfig(**BASE, **KINDS[kind], attention_impl=impl), rngs=nnx.Rngs(0))
  batch = packed([[7, 6], [9, 5]], 16)
  gap = max_gap(enc, *batch)
  print(f"{impl} {kind}: packed vs alone {gap:.2e}")
  assert gap < 2e-5
  # the same row with its examples seeing each other (a cross-segment leak) fails the check
  assert max_gap(enc, *batch, segments=False) > 1e-3


@pytest.mark.parametrize("kind,impl,scan", [("rope_window", "auto", True),
                                            ("rope", "pallas", False)])
def test_packed_row_on_the_pallas_kernel(kind, impl, scan, caplog, monkeypatch):
  """Under the Pallas kernel (interpreted): global layers on the kernel, whose segment ids
  keep the examples apart; local layers ("auto" on a TPU) on XLA with the window, said once;
  in a scanned stack both in one scan (lax.cond on the traced kind)."""
  cfg = ModelConfig(**{**BASE, "hidden_size": 128, "num_heads": 2, "num_layers": 2,
                       "scan_layers": scan}, **KINDS[kind], attention_impl=impl, platform="tpu")
  enc = Encoder(cfg, rngs=nnx.Rngs(0))
  batch = packed([[50, 60], [128]], 128)
  monkeypatch.setattr(attention, "_warned", set())
  with caplog.at_level(logging.WARNING), _hlo_interpret():
    gap = max_gap(enc, *batch)
  print(f"pallas {kind}: packed vs alone {gap:.2e}")
  assert gap < 2e-5
  local = [r.getMessage() for r in caplog.records if "cannot run local layers" in
           r.getMessage() or "local layer's window" in r.getMessage()]
  assert len(local) == (1 if "window" in kind else 0)
