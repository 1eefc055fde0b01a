"""experiments.crossing on fabricated runs of grid electra_curve whose answers are known: where
a curve reaches its level, the fitted lines and where they meet, and the bootstrap."""
import json
import math
import pathlib

import numpy as np
import pytest

from experiments import crossing, grids, report, runner


def test_first_crossing_interpolates_in_log_flops():
  xs, ys = [1e10, 1e11, 1e12], [1.0, 0.98, 0.90]
  # 0.95 is 3/8 of the way from 0.98 to 0.90: 10 ** (11 + 3/8)
  assert crossing.first_crossing(xs, ys, 0.95, below=True) == pytest.approx(10 ** 11.375)
  assert crossing.first_crossing(xs, [0.0, 0.05, 0.3], 0.1, below=False) == pytest.approx(
      10 ** (11 + 0.05 / 0.25))
  assert crossing.first_crossing(xs, [0.5, 0.4, 0.3], 0.95, below=True) == 1e10  # at once
  assert math.isnan(crossing.first_crossing(xs, ys, 0.5, below=True))  # never


def test_power_laws_meet_only_when_electras_error_falls_faster():
  # log10 error: MLM -0.05x - 0.45, ELECTRA -0.25x + 2.5: equal at x = 14.75
  assert crossing.crossing((-0.05, -0.45), (-0.25, 2.5), 13.8) == pytest.approx(14.75)
  assert math.isinf(crossing.crossing((-0.25, 2.5), (-0.05, 0.5), 13.8))  # falls slower
  assert crossing.crossing((-0.05, -0.45), (-0.25, 2.0), 13.8) == 13.8  # ahead already
  # reaching a level: a falling line gets there, a flat one never, one below it already has
  assert crossing.reach(-0.25, 2.5, -1.0, 13.8) == pytest.approx(14.0)
  assert math.isinf(crossing.reach(0.0, -0.5, -1.0, 13.8))
  assert crossing.reach(-0.25, 2.5, -0.5, 13.8) == 13.8


def test_percentiles_keep_never_as_never():
  """Resamples without a crossing are inf; interpolated percentiles would turn the upper end
  into nan, and the report must say "never" there."""
  a = np.array([13.0] * 90 + [np.inf] * 10)
  assert crossing._pct(a) == (13.0, math.inf)
  assert crossing._flops_text(crossing._pct(a)[1]) == "never"


def test_bootstrap_without_noise_returns_the_fit_and_resamples_whole_seeds():
  log_flops = np.array([12.0, 12.5, 13.0, 13.5])
  law = lambda a, b, shift=0.0: 1 - 10 ** (a * log_flops + b + shift)
  grid3 = lambda acc: np.broadcast_to(np.asarray(acc)[None, :, None], (2, 4, 3)).copy()
  scores = {"mlm": grid3(law(-0.05, -0.45)), "electra": grid3(law(-0.25, 2.5))}
  out = crossing.bootstrap(scores, log_flops, resamples=50)
  assert np.allclose(out["crossing"], 14.75)
  assert np.allclose(out["deficit"][:, 0], law(-0.05, -0.45)[0] - law(-0.25, 2.5)[0])
  # one ELECTRA seed's error 10^0.1 x higher everywhere: 0, 1 or 2 draws of it move the whole
  # curve (drawing single points would give many more values)
  noisy = {"mlm": scores["mlm"], "electra": scores["electra"].copy()}
  noisy["electra"][1] = law(-0.25, 2.5, 0.1)[:, None]
  out = crossing.bootstrap(noisy, log_flops, resamples=2000)
  assert len(set(np.round(out["deficit"][:, 0], 9))) == 3
  assert len(set(np.round(out["crossing"], 9))) == 3
  # fine-tuning seeds are resampled too: noise only between them still spreads the deficit
  ft_noise = {"mlm": scores["mlm"], "electra": scores["electra"] + np.array([-0.01, 0, 0.01])}
  d = crossing.bootstrap(ft_noise, log_flops, resamples=500)["deficit"][:, 0]
  assert d.std() > 0.002


def _fabricate(workdir: pathlib.Path, mlm_law, electra_law, exit_flops: float):
  """Runs of grid electra_curve whose POS error rates follow power laws in FLOPs (log10 error
  = a * log10 FLOPs + b, fine-tuning seeds 1e-3 apart in log10 error) and whose ELECTRA
  discriminator's held-out ratio falls linearly in log FLOPs through 0.95 at exit_flops."""
  grid = grids.get_grid("electra_curve")
  for p in grid.points:
    obj, pdir = p.labels["objective"], pathlib.Path(runner.point_dir(workdir, p))
    every = p.overrides["train.eval_every"]
    rows = []
    for step in range(every, p.steps + 1, every):
      flops = step * p.flops_per_step
      r = {"step": step, "split": "eval", "unigram_at_mask_loss": 6.7}
      if obj == "electra":
        ratio = 0.95 - 0.1 * (math.log10(flops) - math.log10(exit_flops))
        r |= {"disc_loss": ratio * report.binary_entropy(0.15), "disc_replaced_frac": 0.15,
              "gen_at_mask_loss": 6.5}
      else:
        r["mlm_at_mask_loss"] = 6.7 - 0.5 * step / p.steps
      rows.append(r)
    (pdir / "pretrain").mkdir(parents=True)
    (pdir / "pretrain" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pdir / "pretrain" / "summary.json").write_text(json.dumps({"stop_reason": "steps",
                                                                "steps": p.steps}))
    a, b = mlm_law if obj == "mlm" else electra_law
    for job in p.finetune:
      step = job.step_of(p) or p.steps
      y = a * math.log10(step * p.flops_per_step) + b
      runs = [{"test": {"accuracy": 1 - 10 ** (y + d)}} for d in (-0.001, 0.0, 0.001)]
      (pdir / job.dirname).mkdir()
      (pdir / job.dirname / "results.json").write_text(json.dumps({"runs": runs}))
  return grid


def test_analysis_of_fabricated_runs_finds_the_planted_exit_and_crossing(tmp_path):
  grid = _fabricate(tmp_path / "runs", (-0.05, -0.45), (-0.25, 2.5), exit_flops=2e13)
  text = crossing.analyse(tmp_path / "runs", tmp_path / "out", resamples=200,
                          random_scores=[0.89, 0.9, 0.91])
  assert "fine-tuned the same way: brown_pos 0.9000 (mean; [0.8900, 0.9100]" in text
  # ELECTRA's law reaches error 0.1 (log10 -1) at x = (-1 - 2.5) / -0.25 = 14
  assert f"random init's mean at **{10 ** 14.0:.2g} FLOPs**" in text
  for p in grid.points:
    assert runner.status(tmp_path / "runs", p) == "done"
  # the two laws meet at x = 14.75
  assert f"They meet at **{10 ** 14.75:.2g} FLOPs**" in text
  assert f"mlm's error x{10 ** -0.05:.3f} per 10x" in text
  assert f"electra's error x{10 ** -0.25:.3f} per 10x" in text
  exits = [line for line in text.splitlines() if line.startswith("| electra |")]
  assert len(exits) == 2 and all(f"| {2e13:.3g} |" in line for line in exits)
  assert "the lines meet in 100.0% of them" in text
  assert "Under another law, straight lines in accuracy" in text  # how much the law decides
  assert (tmp_path / "out" / "crossing.png").stat().st_size > 10_000
  rows = (tmp_path / "out" / "downstream.csv").read_text().splitlines()
  assert len(rows) == 1 + 4 * 4 * 3  # 4 runs x 4 checkpoints x 3 fine-tuning seeds


def test_analysis_says_when_electra_falls_further_behind(tmp_path):
  _fabricate(tmp_path / "runs", (-0.25, 2.5), (-0.05, 0.5), exit_flops=1e15)
  text = crossing.analyse(tmp_path / "runs", tmp_path / "out", resamples=100)
  assert "They do not meet" in text and "meet in 0.0% of them" in text
  assert "interval of the crossing [never, never]" in text
  assert "| electra | 0 | – |" in text  # never left its prior within the run
