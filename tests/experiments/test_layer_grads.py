"""experiments/layer_grads.py: per-layer gradient norms through the trainer's one step."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from encoder_jax.train import step as step_lib
from experiments import layer_grads


def test_per_layer_norms_take_the_norm_of_each_layer_of_the_stacked_parameters():
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 8, 4)).astype(np.float32)  # (layers, in, out)
  bias = rng.normal(size=(3, 4)).astype(np.float32)
  other = rng.normal(size=(3, 5)).astype(np.float32)
  grads = {"bert": {"encoder": {"blocks": {"ffn_out": {"kernel": kernel, "bias": bias},
                                           "ln_ffn": {"scale": other}}}},
           "mlm": {"bias": np.ones(7, np.float32)}}
  m = jax.jit(layer_grads.per_layer_norms)(grads)
  want_w2 = [np.linalg.norm(kernel[i]) for i in range(3)]
  want_layer = [np.sqrt(np.sum(kernel[i] ** 2) + np.sum(bias[i] ** 2) + np.sum(other[i] ** 2))
                for i in range(3)]
  np.testing.assert_allclose(m["w2_grad_norm"], want_w2, rtol=1e-6)
  np.testing.assert_allclose(m["layer_grad_norm"], want_layer, rtol=1e-6)
  assert layer_grads.ratio(np.array(want_w2)) == want_w2[-1] / want_w2[0]


def test_make_step_reports_grad_metrics_of_the_unclipped_gradient():
  """grad_metrics sees the gradient the loss gives, before the optimizer clips it."""
  tx = optax.chain(optax.clip_by_global_norm(1e-3), optax.sgd(1.0))
  params = {"w": jnp.array([3.0, 4.0])}
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  loss = lambda p, step, batch: (jnp.sum(p["w"] * batch), {})  # gradient = batch
  f = step_lib.make_step(loss, tx, lambda s: 1.0,
                         grad_metrics=lambda g: {"g": g["w"], "n": jnp.linalg.norm(g["w"])})
  new, m = f(state, jnp.array([30.0, 40.0]))
  np.testing.assert_allclose(m["g"], [30.0, 40.0])
  assert float(m["n"]) == 50.0 == float(m["grad_norm"])
  # ... while the update is the clipped one: 1e-3 of the unit direction
  np.testing.assert_allclose(new.params["w"], [3.0 - 0.6e-3, 4.0 - 0.8e-3], rtol=1e-6)


def test_a_point_records_per_layer_norms_at_init_and_the_report_is_written(tmp_path):
  """Two layers, four steps of the demo recipe: step 0's W2 norms are the gradient at
  initialisation, one per layer, and the report, CSVs and plot are written."""
  cfg = layer_grads.Settings(depths=(2,), norms=("post",), seeds=(0,), width=32, steps=4,
                             record_at=(0, 1))
  r = layer_grads.run_point(cfg, 2, "post", 0)
  assert sorted(r["layers"]) == [0, 1, 3] and r["status"] == "done"  # asked, and the last
  w2, layer = r["layers"][0]
  assert w2.shape == layer.shape == (2,) and np.all(w2 > 0) and np.all(layer > w2)
  assert [c[0] for c in r["curve"]] == [0, 1, 2, 3]
  layer_grads.write_report(tmp_path, {(2, "post", 0): r}, cfg)
  md = (tmp_path / "results.md").read_text()
  assert "| 2 | post | 1 |" in md and "init std 0.02" in md
  assert md.startswith("**Produced by** an unknown commit")  # (no provenance.json here)
  assert len((tmp_path / "layers.csv").read_text().splitlines()) == 1 + 3 * 2
  assert (tmp_path / "layer_grads.png").exists()
  assert (tmp_path / "loss_curves.png").exists()
  # --report redraws from the CSVs: the same numbers back (to the CSVs' 6 digits)
  back = layer_grads.read_results(tmp_path)[(2, "post", 0)]
  assert sorted(back["layers"]) == sorted(r["layers"]) and back["status"] == "done"
  np.testing.assert_allclose(back["layers"][3][0], r["layers"][3][0], rtol=1e-5)
  np.testing.assert_allclose([c[1] for c in back["curve"]], [c[1] for c in r["curve"]],
                             rtol=1e-5)
  before = md
  layer_grads.report(tmp_path, {(2, "post", 0): back}, cfg)
  assert (tmp_path / "results.md").read_text() == before


def test_a_tool_invocation_is_appended_to_provenance(tmp_path, monkeypatch):
  from experiments import provenance
  monkeypatch.setattr("sys.argv", ["layer_grads.py", "--depths=2"])
  first = provenance.record_tool(tmp_path, "experiments.layer_grads", {"depths": ["2"]}, 0.5)
  provenance.record_tool(tmp_path, "experiments.layer_grads", {"depths": ["4"]}, 1.0)
  recs = provenance.read(tmp_path)
  assert [r["flags"]["depths"] for r in recs] == [["2"], ["4"]] and recs[0] == first
  assert first["command"] == "python -m experiments.layer_grads --depths=2"
  assert first["action"] == "layer_grads" and first["git"]["commit"]
