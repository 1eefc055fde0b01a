"""mesh=auto's search (encoder_jax/train/layout.py) on a stand-in compiler: which candidates it
compiles, which it picks, when it warns, and how the choice reaches the config and a resumed
run. The real compiler's side (libtpu, a TPU topology) is tests/tpu/test_tpu_program.py's."""
import dataclasses
import json

import pytest

from configs import pretrain
from encoder_jax.train import layout as L


class FakeDevice:
  platform, device_kind = "tpu", "TPU v5 lite"  # 16 GiB a chip

  def __init__(self, i):
    self.id, self.coords = i, (i % 4, i // 4, 0)


DEVICES = [FakeDevice(i) for i in range(16)]


def _config(batch=8192, accumulation=1):
  c = pretrain.get_config("size=base,nsp=nsp")
  c.data.batch_size, c.optim.accumulation_steps = batch, accumulation
  c.train.update(dict(steps=1000, log_every=100, eval_every=500, checkpoint_every=500))
  return c


def _fake_price(state_gib=1.8, gib_per_row=0.045, fsdp_state_gib=0.3):
  """A compiler stand-in: memory = state + rows x per-row; time a device = fixed + per row,
  the fixed part larger for FSDP (its gathers) and for a replicated optimizer."""
  calls = []

  def price(self, config, layout, batch=None):
    c = L.configure(config, layout, len(self.devices), batch)
    calls.append((layout, batch))
    fsdp = layout.mesh == "1,-1,1"
    state = fsdp_state_gib if fsdp else state_gib * (0.6 if layout.optim_sharding == "zero1"
                                                     else 1.0)
    hbm = state + gib_per_row * layout.rows
    fixed = 8e-3 if fsdp else (7.6e-3 if layout.optim_sharding == "replicated" else 3e-3)
    est = fixed + 0.75e-3 * layout.rows
    p = L.Priced(layout, int(c.optim.accumulation_steps), fits=hbm <= L.HBM_MARGIN * 16,
                 hbm_gib=hbm, argument_gib=state, cap_gib=16.0, est_step_s=est,
                 est_mfu=0.55 * layout.rows * 0.75e-3 / est)
    if not p.fits:
      p.hbm_gib = p.argument_gib = None  # the compiler refuses: no buffer assignment
      p.est_step_s = p.est_mfu = None
    return p

  return price, calls


@pytest.fixture(autouse=True)
def _confirmed_as_priced(monkeypatch):
  """The stand-in compiler's accumulating programs need the memory they were priced at."""
  monkeypatch.setattr(L.Pricer, "confirm",
                      lambda self, config, p: dataclasses.replace(p, confirmed=True))


def test_picks_zero1_data_parallel_at_the_most_rows_that_fit(monkeypatch):
  price, calls = _fake_price()
  monkeypatch.setattr(L.Pricer, "price", price)
  choice = L.search(_config(), DEVICES, say=lambda _: None)
  b = choice.best
  # 14.4 GiB usable: 1.08 + 0.045 * 256 = 12.6 fits, 512 rows would not (24.1).
  assert (b.layout.mesh, b.layout.optim_sharding, b.layout.rows) == ("-1,1,1", "zero1", 256)
  assert b.accumulation == 2 and not b.layout.scan and b.layout.remat == "dots"
  assert len(calls) <= 6, calls  # probe, predict, confirm, + replicated and FSDP at 256
  assert {(c[0].optim_sharding, c[0].mesh) for c in calls} >= {("replicated", "-1,1,1"),
                                                               ("replicated", "1,-1,1")}
  assert choice.notes == []  # 512 rows a device are available and do not fit: no warning


def test_fsdp_when_the_replicated_state_does_not_fit(monkeypatch):
  price, _ = _fake_price(state_gib=30.0)  # a model whose replicated state exceeds 16 GiB
  monkeypatch.setattr(L.Pricer, "price", price)
  b = L.search(_config(), DEVICES, say=lambda _: None).best
  assert b.layout.mesh == "1,-1,1" and b.fits


def test_a_slice_too_large_for_the_batch_is_named_with_figures(monkeypatch):
  price, calls = _fake_price()
  monkeypatch.setattr(L.Pricer, "price", price)
  choice = L.search(_config(batch=256), DEVICES, say=lambda _: None)  # 16 rows a device
  assert choice.best.layout.rows == 16 and choice.best.accumulation == 1
  assert calls[-1][1] == 64 * 16  # the comparison: 4x the rows, a larger batch
  (note,) = choice.notes
  assert "too large for a global batch of 256" in note and "est MFU" in note
  assert "v5e-4 instead of this v5e-16" in note, note


def test_a_batch_the_slice_cannot_split_is_refused_with_the_fix():
  with pytest.raises(ValueError, match="cannot be split over the 16 devices.*multiple of 16"):
    L.search(_config(batch=8), DEVICES, say=lambda _: None)


def test_the_choice_reaches_the_config_with_steps_in_updates(monkeypatch):
  price, _ = _fake_price()
  monkeypatch.setattr(L.Pricer, "price", price)
  config = _config(batch=4096, accumulation=2)  # G = 8192 as the recipe gives it
  choice = L.search(config, DEVICES, say=lambda _: None)
  L.apply(config, L.record_of(choice, config))
  assert (config.mesh, config.optim_sharding) == ("-1,1,1", "zero1")
  assert (config.data.batch_size, config.optim.accumulation_steps) == (256 * 16, 2)
  assert (config.model.remat_policy, config.model.scan_layers) == ("dots", "False")
  # still 1000 optimizer updates of 8192 rows, logged/evaluated/saved as before
  assert config.train.steps == 1000  # recipe and layout both accumulate 2
  assert json.loads(config.layout)["global_batch"] == 8192


def test_steps_and_intervals_scale_with_the_accumulation():
  config = _config(batch=8192)
  record = {"layout": dataclasses.asdict(L.Layout("-1,1,1", "zero1", 128, "dots", False)),
            "accumulation": 4, "global_batch": 8192, "devices": 16}
  L.apply(config, record)
  assert config.data.batch_size == 2048 and config.optim.accumulation_steps == 4
  assert (config.train.steps, config.train.log_every, config.train.eval_every,
          config.train.checkpoint_every) == (4000, 400, 2000, 2000)


def test_a_resumed_run_reuses_its_recorded_layout_without_searching(monkeypatch, tmp_path):
  config = _config()
  record = {"layout": dataclasses.asdict(L.Layout("-1,1,1", "zero1", 256, "dots", False)),
            "accumulation": 2, "global_batch": 8192, "devices": 16}
  recorded = _config()
  recorded.layout = json.dumps(record)
  (tmp_path / "config.json").write_text(recorded.to_json())
  monkeypatch.setattr(L, "search", lambda *a, **k: pytest.fail("searched again"))
  L.settle(config, tmp_path, DEVICES, say=lambda _: None)
  assert config.data.batch_size == 4096 and config.optim.accumulation_steps == 2
  assert config.train.steps == 2000


def test_auto_keeps_its_meaning_off_tpus(monkeypatch):
  import jax
  monkeypatch.setattr(L, "search", lambda *a, **k: pytest.fail("searched on a CPU"))
  config = _config()
  L.settle(config, None, jax.devices(), say=lambda _: None)
  assert config.mesh == "auto" and config.layout == ""
  config.mesh = "1,-1,1"  # an explicit mesh is never searched, on a TPU either
  L.settle(config, None, DEVICES, say=lambda _: None)
  assert config.mesh == "1,-1,1"


def test_slice_names_and_rows():
  assert L.slice_name("TPU v5 lite", 4) == "v5e-4" and L.slice_name("TPU v5", 4) == "v5p-8"
  assert L.slice_name("TPU v4", 16) == "v4-32"
  assert L._allowed_rows(48) == [1, 2, 4, 8, 16, 48]


def test_an_accumulating_step_is_priced_from_its_k1_step_and_branches():
  """k micro-steps: the k-th runs the update (the step without accumulation plus the
  accumulation), the others skip it (less the update, plus the accumulation)."""
  emit, mean = L._accumulated(0.100, update_s=0.008, accumulate_s=0.001, k=4)
  assert emit == pytest.approx(0.101)
  assert mean == pytest.approx((0.101 + 3 * 0.093) / 4)


def test_a_choice_whose_accumulating_program_does_not_fit_is_dropped(monkeypatch):
  """Accumulating candidates are priced through their k=1 program plus the accumulator;
  the winner's own program is then compiled (`confirm`), and one that does not fit after all
  gives way to the next."""
  price, _ = _fake_price()
  monkeypatch.setattr(L.Pricer, "price", price)
  confirmed = []
  monkeypatch.setattr(L.Pricer, "confirm", lambda self, config, p: confirmed.append(
      p.layout.rows) or dataclasses.replace(p, confirmed=True, fits=p.layout.rows < 256))
  b = L.search(_config(), DEVICES, say=lambda _: None).best
  assert 256 in confirmed and b.layout.rows == 16 and b.confirmed and b.fits
