"""Grid (g), large batches at equal tokens (experiments/large_batches.py): the points' tokens,
updates, learning rates and warm-ups; the base scale against RoBERTa's Table 3; the report's
perplexity; the dry run; and, through the trainer, that an accumulated point sees the x1
point's rows and masks and updates only at the end of its k micro-batches."""
import csv
import json
import math
import re

import pytest

from experiments import grids, large_batches as lb, report, runner


def _by_multiple(points, x1):
  out = {}
  for p in points:
    out.setdefault(int(p.labels["batch"]) // x1, []).append(p)
  return out


def test_demo_points_see_equal_tokens_and_scale_lr_and_warmup_with_the_batch():
  g = grids.get_grid("large_batches", "demo")
  assert grids.GRIDS["large_batches"] is grids.large_batches
  recipe = grids.resolve_config("size=tiny,objective=mlm,runlocal,block=alibi", {})
  lr1 = recipe.optim.learning_rate
  # the controls: x8 and x64 also at the x1 lr, x8 at x3 (~ the square-root rule), one
  # pre-training seed each
  scaled_lr = {16: lr1, 128: 7 * lr1, 1024: 12 * lr1}
  controls = [p for p in g.points
              if float(p.labels["lr"]) != pytest.approx(scaled_lr[int(p.labels["batch"])])]
  assert [p.name for p in controls] == ["seed=0,batch=128,lr=0.002", "seed=0,batch=128,lr=0.006",
                                        "seed=0,batch=1024,lr=0.002"]
  arms = _by_multiple([p for p in g.points if p not in controls], lb.DEMO_MICRO_BATCH)
  assert sorted(arms) == [1, 8, 64]
  # two pre-training seeds an arm, the seeds slowest (every arm's seed 0 runs first)
  assert [p.labels["seed"] for p in g.points] == ["0"] * 6 + ["1"] * 3
  tokens = set()
  for c in controls:  # only the learning rate differs from the scaled arm of its batch
    scaled = next(p for p in arms[int(c.labels["batch"]) // 16] if p.labels["seed"] == "0")
    assert c.overrides == {**scaled.overrides, "optim.learning_rate": float(c.labels["lr"])}
  for m, points in arms.items():
    assert sorted(int(p.labels["seed"]) for p in points) == [0, 1]
    for p in points:
      cfg = p.config()
      assert cfg.seed == int(p.labels["seed"]) and cfg.data.vocab == "demo"
      assert cfg.model.position_bias == recipe.model.position_bias == "alibi"
      # the same micro-batch and calls: same rows, same held-out batches, same FLOPs
      assert (cfg.data.batch_size, cfg.data.max_length) == (16, 64)
      assert cfg.optim.accumulation_steps == m and cfg.train.steps == p.steps
      tokens.add((p.steps * 16 * 64, p.total_flops))
      updates = p.steps // m
      assert updates * m == p.steps and updates == lb.DEMO_STEPS // m
      # the held-out evaluations fall on update boundaries, DEMO_EVALS of them
      assert cfg.train.eval_every % m == 0 and p.steps // cfg.train.eval_every == lb.DEMO_EVALS
      # the paper's ratios: x8 -> x7 (256 -> 2K: 1e-4 -> 7e-4), x64 -> x12 (see LR_RATIO)
      assert cfg.optim.learning_rate == pytest.approx(lr1 * {1: 1, 8: 7, 64: 12}[m])
      assert float(p.labels["lr"]) == pytest.approx(cfg.optim.learning_rate)
      # warm-up over the recipe's 100 updates of 16 rows, in tokens (rounded up to an update)
      warm_tokens = cfg.optim.warmup_steps * m * 16 * 64
      assert 100 * 16 * 64 <= warm_tokens < 100 * 16 * 64 + m * 16 * 64
    assert [(j.task, j.seeds) for j in points[0].finetune] == [
        ("rotten_tomatoes", 3), ("brown_pos", 3)]
  assert len(tokens) == 1  # every point: the same tokens and the same training FLOPs


def test_learning_rate_rule_extends_the_papers_trend():
  # Table 3: 1e-4 at 256, 7e-4 at 2K, 1e-3 at 8K
  assert lb.LR_RATIO[8] == 7 and lb.LR_RATIO[32] == 10
  assert lb.LR_EXPONENT == pytest.approx(math.log(10 / 7) / math.log(4))
  assert lb.LR_RATIO[64] == round(lb.LR_RATIO[32] * 2 ** lb.LR_EXPONENT) == 12
  with pytest.raises(ValueError, match="LR_RATIO"):
    lb.lr_of(1e-3, 16)


def test_base_points_are_the_papers_rows_at_equal_compute():
  g = grids.get_grid("large_batches", "base")
  assert [p.name for p in g.points] == ["batch=256,lr=0.0001", "batch=2048,lr=0.0007",
                                        "batch=8192,lr=0.001"]
  rows = []
  for p in g.points:
    cfg = p.config()
    k = cfg.optim.accumulation_steps
    assert cfg.data.batch_size <= lb.BASE_MICRO_BATCH and cfg.data.max_length == 512
    assert cfg.model.hidden_size == 768 and cfg.model.num_layers == 12
    assert cfg.objective.sentence_task == "none" and cfg.data.format == "full_sentences"
    assert cfg.optim.b2 == 0.98  # RoBERTa Section 3.1, for every batch alike
    for key in ("eval_every", "checkpoint_every", "log_every"):
      assert cfg.train[key] % k == 0, key  # periodic actions on update boundaries
    rows.append((cfg.data.batch_size * k, p.steps // k, cfg.optim.learning_rate,
                 cfg.optim.warmup_steps))
  # (batch, updates, lr, warm-up): Table 3's rows; BERT's 10k warm-up kept in tokens
  assert rows == [(256, 1_000_000, 1e-4, 10_000), (2048, 125_000, 7e-4, 1250),
                  (8192, 31_250, 1e-3, 313)]
  assert len({p.total_flops for p in g.points}) == 1
  with pytest.raises(ValueError, match="demo scale.*base scale"):
    grids.get_grid("large_batches", "gpu")


def test_dry_run_keeps_the_accumulation_and_makes_three_updates():
  d = grids.dry_run(grids.get_grid("large_batches"))
  # lr only changes numbers: one point per batch (the first, here the control at x1's lr)
  assert [p.name for p in d.points] == ["seed=0,batch=16,lr=0.002", "seed=0,batch=128,lr=0.002",
                                        "seed=0,batch=1024,lr=0.002"]
  for p, k in zip(d.points, (1, 8, 64)):
    cfg = p.config()
    assert cfg.optim.accumulation_steps == k and p.steps == 3 * k
    assert cfg.train.eval_every == cfg.train.checkpoint_every == 3 * k
    assert cfg.model.hidden_size == 32 and len(p.finetune) == 1


def _fabricate(grid, workdir, eval_loss):
  """What finished runs leave: eval rows at two points of the run, a summary, fine-tuning."""
  for p in grid.points:
    pdir = runner.point_dir(workdir, p)
    (pdir / "pretrain").mkdir(parents=True)
    loss = eval_loss[p.name]
    rows = [dict(step=p.steps // 2, split="eval", mlm_loss=loss + 1.0),
            dict(step=p.steps, split="train", mlm_loss=loss - 0.2),
            dict(step=p.steps, split="eval", mlm_loss=loss)]
    (pdir / "pretrain" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pdir / "pretrain" / "summary.json").write_text(json.dumps(dict(
        steps=p.steps, stop_reason="steps", final_eval=dict(
            mlm_at_mask_loss=loss, mlm_at_mask_accuracy=0.1, unigram_at_mask_loss=loss + 0.5,
            unigram_at_mask_accuracy=0.05))))
    for j in p.finetune:
      (pdir / j.dirname).mkdir()
      runs = [dict(test=dict(accuracy=0.7 + 0.01 * s)) for s in range(j.seeds)]
      (pdir / j.dirname / "results.json").write_text(json.dumps(dict(runs=runs)))


def test_report_gives_perplexity_over_seeds_and_its_differences(tmp_path):
  g = grids.get_grid("large_batches")
  losses = {p.name: {16: 5.0, 128: 5.5, 1024: 6.5}[int(p.labels["batch"])]
                    + 0.02 * int(p.labels["seed"]) for p in g.points}
  _fabricate(g, tmp_path / "runs", losses)
  files = report.write_report(g, tmp_path / "runs", tmp_path / "out")
  rows = list(csv.DictReader(open(files["csv"])))
  first = rows[0]
  assert first["point"] == "seed=0,batch=16,lr=0.002" and first["status"] == "done"
  assert float(first["eval_perplexity"]) == pytest.approx(math.exp(5.0))
  md = files["md"].read_text()
  assert "eval perplexity" in md and "perplexity of RoBERTa's Table 3" in md
  # over the two pre-training seeds: loss 5.00 and 5.02 -> median 5.01; perplexities e^5.00
  # and e^5.02, their median the mean of the two
  ppl = (math.exp(5.0), math.exp(5.02))
  assert (f"| 16 | 0.002 | 2 (done, done) | 5.0100 [5.0000, 5.0200] | "
          f"{sum(ppl) / 2:.4f} [{ppl[0]:.4f}, {ppl[1]:.4f}] |") in md
  # the held-out loss difference from the x1 arm: +0.5, its interval apart from 0 (*)
  assert re.search(r"^\| 128 \| 0\.014 \| \+0\.5000 \[\+0\.4\d+, \+0\.5\d+\]\* \|", md, re.M)
  assert re.search(r"^\| 1024 \| 0\.024 \| \+1\.5000 \[", md, re.M)
  assert files["heldout_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # a grid without perplexity keeps its report as it was
  plain = grids.get_grid("static_vs_dynamic")
  assert not plain.perplexity
  assert "eval perplexity" not in report.markdown(plain, report.collect(plain, tmp_path))


def test_accumulated_point_sees_the_x1_rows_and_masks_and_updates_once_per_k(tmp_path):
  """Through the trainer, on the dry run's x8 point: its first 8 calls see the same rows and
  masks as an x1 run at learning rate 0 (the same losses: the parameters do not move
  mid-accumulation), and the 9th call's loss differs (one update after 8 micro-batches)."""
  from encoder_jax.train.loop import train_and_evaluate
  p8 = grids.dry_run(grids.get_grid("large_batches")).points[1]
  losses = {}
  for name, over in (("x8", {}), ("x1_lr0", {"optim.accumulation_steps": 1,
                                             "optim.learning_rate": 1e-30})):
    # no warm-up: the first update is at the peak (a warm-up's first update is at lr 0)
    cfg = grids.resolve_config(p8.pretrain_arg, {
        **p8.overrides, **over, "optim.warmup_steps": 0, "train.steps": 9,
        "train.log_every": 1, "train.eval_every": 0, "train.eval_steps": 0,
        "train.checkpoint_every": 0})
    train_and_evaluate(cfg, str(tmp_path / name))
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text()
            .splitlines()]
    losses[name] = {r["step"]: r["mlm_loss"] for r in rows if r.get("split") == "train"}
  assert sorted(losses["x8"]) == list(range(1, 10))
  for step in range(1, 9):
    assert losses["x8"][step] == pytest.approx(losses["x1_lr0"][step], rel=1e-6), step
  assert abs(losses["x8"][9] - losses["x1_lr0"][9]) > 1e-4
