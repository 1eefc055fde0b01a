"""ELECTRA's model side (encoder_jax/model/electra.py): the generator sizes of the published
models, and one token table shared by generator and discriminator."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model import ModelConfig
from encoder_jax.model.electra import ElectraModel, generator_config

# google-research/electra configure_pretraining.py (ELECTRA Table 6): the discriminator
# (hidden, layers, heads, FFN, embedding), its generator_hidden_size, and the generator
# get_generator_config derives: hidden * frac, hidden // 64 heads, 4 * hidden FFN, same depth.
PUBLISHED = {
    "small": ((256, 12, 4, 1024, 128), 0.25, (64, 12, 1, 256, 128)),
    "base": ((768, 12, 12, 3072, 768), 0.33333, (256, 12, 4, 1024, 768)),
    "large": ((1024, 24, 16, 4096, 1024), 0.25, (256, 24, 4, 1024, 1024)),
}


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_generator_sizes_are_the_published_ones(size):
  (d, layers, heads, ffn, emb), frac, want = PUBLISHED[size]
  disc = ModelConfig(hidden_size=d, num_layers=layers, num_heads=heads, ffn_size=ffn,
                     embedding_size=emb if emb != d else None)
  gen = generator_config(disc, frac)
  assert (gen.hidden_size, gen.num_layers, gen.num_heads, gen.ffn_size, gen.embed_size) == want
  assert gen.head_dim == 64 == disc.head_dim
  assert generator_config(disc, frac, layers_frac=0.5).num_layers == layers // 2


def test_generator_and_discriminator_share_one_token_table():
  disc = ModelConfig(vocab_size=48, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64,
                     max_positions=8, embedding_size=16, hidden_dropout=0.0,
                     attention_dropout=0.0)
  model = ElectraModel(disc, generator_config(disc, 0.5), rngs=nnx.Rngs(0))
  tables = [p for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
            if v[...].shape == (48, 16)]
  assert len(tables) == 1, tables  # one parameter, not a copy per network
  ids = jnp.array([[5, 6, 7, 8]])
  gen = nnx.jit(lambda m, x: m.generator(x).hidden_BxTxD)
  before = np.asarray(gen(model, ids))
  # Writing the discriminator's table moves the generator: they read the same parameter.
  table = model.discriminator.embeddings.token.embedding
  bump = jnp.asarray(np.random.default_rng(0).standard_normal(16), jnp.float32)
  table[...] = table[...].at[6].add(bump)  # not a constant shift, which LayerNorm removes
  assert np.abs(np.asarray(gen(model, ids)) - before).max() > 1e-3
  # The generator's MLM loss sends gradient into that table through the generator's inputs:
  # the logit of id 9 reaches row 9 through the tied decoder, rows 5-8 only as inputs.
  grads = nnx.grad(lambda m: jnp.sum(m.gen_mlm(m.generator(ids).hidden_BxTxD, m.token_embed)
                                     [..., 9]))(model)
  g = np.abs(np.asarray(grads["discriminator"]["embeddings"]["token"]["embedding"][...]))
  assert (g[5:9].max(axis=1) > 0).all() and g[9].max() > 0
  assert g[10:].max() == 0 and g[:5].max() == 0
