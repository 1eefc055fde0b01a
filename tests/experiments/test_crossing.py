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


def test_lines_meet_only_when_electra_rises_faster():
  assert crossing.crossing((0.01, 0.80), (0.05, 0.40)) == pytest.approx(10.0)
  assert math.isnan(crossing.crossing((0.05, 0.80), (0.01, 0.40)))
  assert math.isnan(crossing.crossing((0.02, 0.80), (0.02, 0.40)))


def test_bootstrap_without_noise_returns_the_fit_and_resamples_whole_seeds():
  log_flops = np.array([12.0, 12.5, 13.0, 13.5])
  line = lambda a, b: np.broadcast_to((a * log_flops + b)[None, :, None], (2, 4, 3))
  scores = {"mlm": line(0.01, 0.78), "electra": line(0.05, 0.26)}
  out = crossing.bootstrap(scores, log_flops, resamples=50)
  assert np.allclose(out["crossing"], 13.0)  # 0.01x + 0.78 = 0.05x + 0.26 at x = 13
  assert np.allclose(out["deficit"][:, 0], 0.78 + 0.12 - 0.26 - 0.6)
  # one seed far off: resamples that draw it twice move the whole curve, not one point
  noisy = {"mlm": scores["mlm"].copy(), "electra": scores["electra"].copy()}
  noisy["electra"][1] -= 0.1
  out = crossing.bootstrap(noisy, log_flops, resamples=2000)
  # 0, 1 or 2 draws of the low seed lower ELECTRA's whole line by 0, 0.05 or 0.1
  assert sorted(set(np.round(out["deficit"][:, 0], 6))) == pytest.approx([0.04, 0.09, 0.14])
  assert sorted(set(np.round(out["crossing"], 6))) == pytest.approx([13.0, 14.25, 15.5])


def _fabricate(workdir: pathlib.Path, mlm_line, electra_line, exit_flops: float):
  """Runs of grid electra_curve with straight-line POS against log10 FLOPs and an ELECTRA
  discriminator whose held-out ratio falls linearly in log FLOPs through 0.95 at exit_flops."""
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
    a, b = mlm_line if obj == "mlm" else electra_line
    for job in p.finetune:
      step = job.step_of(p) or p.steps
      acc = a * math.log10(step * p.flops_per_step) + b
      runs = [{"test": {"accuracy": acc + d}} for d in (-0.002, 0.0, 0.002)]
      (pdir / job.dirname).mkdir()
      (pdir / job.dirname / "results.json").write_text(json.dumps({"runs": runs}))
  return grid


def test_analysis_of_fabricated_runs_finds_the_planted_exit_and_crossing(tmp_path):
  grid = _fabricate(tmp_path / "runs", (0.02, 0.65), (0.10, -0.40), exit_flops=2e13)
  text = crossing.analyse(tmp_path / "runs", tmp_path / "out", resamples=200,
                          random_scores=[0.88, 0.887, 0.89])
  assert "fine-tuned the same way: brown_pos 0.8870 [0.8800, 0.8900]" in text
  # ELECTRA's line 0.10x - 0.40 reaches the random init's mean 0.8857 at x = 12.857
  assert f"random init's mean (0.8857) at **{10 ** ((0.40 + 0.88567) / 0.10):.2g} FLOPs**" in text
  for p in grid.points:
    assert runner.status(tmp_path / "runs", p) == "done"
  # the lines 0.02x + 0.65 and 0.10x - 0.40 meet at x = 13.125
  assert f"They meet at **{10 ** 13.125:.2g} FLOPs**" in text
  assert "+2.00 points per 10x" in text and "+10.00 points per 10x" in text
  exits = [line for line in text.splitlines() if line.startswith("| electra |")]
  assert len(exits) == 2 and all(f"| {2e13:.3g} |" in line for line in exits)
  assert "so the lines meet, in 100.0% of them" in text
  assert (tmp_path / "out" / "crossing.png").stat().st_size > 10_000
  rows = (tmp_path / "out" / "downstream.csv").read_text().splitlines()
  assert len(rows) == 1 + 4 * 4 * 3  # 4 runs x 4 checkpoints x 3 fine-tuning seeds


def test_analysis_says_when_electra_falls_further_behind(tmp_path):
  _fabricate(tmp_path / "runs", (0.05, 0.30), (0.01, 0.60), exit_flops=1e15)
  text = crossing.analyse(tmp_path / "runs", tmp_path / "out", resamples=100)
  assert "They do not meet" in text and "In none of 100 bootstrap resamples" in text
  assert "| electra | 0 | – |" in text  # never left its prior within the run
