"""The main job's report (encoder_jax.demo): the learning curve and the verdicts it prints."""
import json

import pytest

from encoder_jax import demo


def _run_dir(tmp_path, accs):
  """A pre-training workdir as the trainer leaves it: config.json and metrics.jsonl with a
  train row every 100 steps (0.1 s a step) and an eval row every 1,000."""
  (tmp_path / "config.json").write_text(json.dumps({"data": {"batch_size": 8,
                                                             "max_length": 128}}))
  rows, t0 = [], 1000.0
  for step in range(100, 100 * 10 * len(accs) + 1, 100):
    rows.append(dict(step=step, split="train", time=t0 + 0.1 * step, step_time_s=0.1, loss=6.0))
    if step % 1000 == 0:
      acc = accs[step // 1000 - 1]
      rows.append(dict(step=step, split="eval", time=t0 + 0.1 * step + 2.0, mlm_accuracy=acc,
                       mlm_loss=6.0 - 10 * acc, mlm_at_mask_accuracy=acc - 0.05,
                       unigram_accuracy=0.056, unigram_loss=6.7))
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return tmp_path


def test_learning_curve_tokens_minutes_and_the_25_percent_line(tmp_path):
  curve = demo.learning_curve(_run_dir(tmp_path, [0.16, 0.21, 0.26, 0.27]))
  assert [c["step"] for c in curve] == [1000, 2000, 3000, 4000]
  assert curve[1]["tokens"] == 2000 * 8 * 128
  # minutes count from the first step: the first train row (step 100) minus 100 x 0.1 s
  assert curve[0]["minutes"] == pytest.approx((0.1 * 1000 + 2.0) / 60)
  assert curve[2]["nats_below_unigram"] == pytest.approx(6.7 - (6.0 - 2.6))
  text = "\n".join(demo.curve_lines(curve))
  assert "reached at step 3000 (3.07M tokens" in text
  assert "not reached" in "\n".join(demo.curve_lines(curve[:2]))
  demo.plot_curve(curve, tmp_path / "curve.png", "t")
  assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def _ft(lo, hi):
  return {"summary": {"test/accuracy": {"median": (lo + hi) / 2, "min": lo, "max": hi}}}


@pytest.mark.parametrize("pre,verdict", [((0.80, 0.82), "above"), ((0.70, 0.79), "overlapping"),
                                         ((0.60, 0.65), "below")])
def test_report_compares_the_checkpoint_with_random_init_by_range(pre, verdict):
  text = demo.report({"steps": 10, "final_eval": {}},
                     {"brown_pos": {"pretrained": _ft(*pre), "random": _ft(0.75, 0.78)}}, 3)
  assert f"Checkpoint vs random init: {verdict}" in text
  assert "| this run's checkpoint |" in text and "| random init, same shape |" in text


def test_a_finished_run_evaluated_again_adds_no_point_to_the_curve(tmp_path):
  run = _run_dir(tmp_path, [0.16, 0.21])
  rows = (run / "metrics.jsonl").read_text().splitlines()
  again = dict(json.loads(rows[-1]), time=99999.0)  # the re-run's eval of the last step
  assert again["split"] == "eval" and again["step"] == 2000
  (run / "metrics.jsonl").write_text("\n".join(rows + [json.dumps(again)]) + "\n")
  curve = demo.learning_curve(run)
  assert [c["step"] for c in curve] == [1000, 2000]
  assert curve[-1]["minutes"] == pytest.approx((0.1 * 2000 + 2.0) / 60)  # the original row
