"""Our block == torch.nn.TransformerEncoderLayer (post-LN and pre-LN) with copied weights."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from encoder_jax.model import Block, ModelConfig  # noqa: E402
from encoder_jax.model.attention import make_attention_mask  # noqa: E402

pytestmark = pytest.mark.parity


def _copy_into_torch(block: Block, layer, d: int):
  t = lambda a: torch.tensor(np.asarray(a))
  qkv = np.asarray(block.attn.qkv_kernel[...])  # [D, 3, N, H]
  with torch.no_grad():
    layer.self_attn.in_proj_weight.copy_(t(qkv.reshape(d, 3 * d).T))
    layer.self_attn.in_proj_bias.copy_(t(np.asarray(block.attn.qkv_bias[...]).reshape(3 * d)))
    layer.self_attn.out_proj.weight.copy_(t(np.asarray(block.attn.out_kernel[...]).reshape(d, d).T))
    layer.self_attn.out_proj.bias.copy_(t(block.attn.out_bias[...]))
    layer.linear1.weight.copy_(t(np.asarray(block.ffn_in.kernel[...]).T))
    layer.linear1.bias.copy_(t(block.ffn_in.bias[...]))
    layer.linear2.weight.copy_(t(np.asarray(block.ffn_out.kernel[...]).T))
    layer.linear2.bias.copy_(t(block.ffn_out.bias[...]))
    for ln, ours in ((layer.norm1, block.ln_attn), (layer.norm2, block.ln_ffn)):
      ln.weight.copy_(t(ours.scale[...]))
      ln.bias.copy_(t(ours.bias[...]))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_block_matches_torch_encoder_layer(norm_first):
  d, h = 64, 4
  cfg = ModelConfig(hidden_size=d, num_heads=h, ffn_size=4 * d, num_layers=1, vocab_size=8,
                    max_positions=16, norm_first=norm_first, layer_norm_eps=1e-5)
  # Non-trivial LayerNorm and bias values, so a swapped or missing parameter shows.
  block = Block(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  for var in (block.ln_attn.scale, block.ln_ffn.scale):
    var[...] = jnp.asarray(1 + 0.1 * rng.standard_normal(d), jnp.float32)
  for var in (block.ln_attn.bias, block.ln_ffn.bias, block.attn.out_bias, block.ffn_out.bias):
    var[...] = jnp.asarray(0.1 * rng.standard_normal(var[...].shape), jnp.float32)
  block.attn.qkv_bias[...] = jnp.asarray(0.1 * rng.standard_normal((3, h, d // h)), jnp.float32)

  layer = torch.nn.TransformerEncoderLayer(d, h, 4 * d, dropout=0.0, activation="gelu",
                                           layer_norm_eps=1e-5, batch_first=True,
                                           norm_first=norm_first).eval()
  _copy_into_torch(block, layer, d)
  x = rng.standard_normal((3, 7, d)).astype(np.float32)
  lengths = [7, 4, 2]
  valid = np.arange(7)[None, :] < np.array(lengths)[:, None]
  ours = np.asarray(block(jnp.asarray(x), make_attention_mask(jnp.asarray(valid))))
  with torch.no_grad():
    theirs = layer(torch.tensor(x), src_key_padding_mask=torch.tensor(~valid)).numpy()
  err = np.abs(ours[valid] - theirs[valid]).max()
  print(f"block parity norm_first={norm_first}: max abs diff {err:.2e}")
  assert err <= 1e-5
