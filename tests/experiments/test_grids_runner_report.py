"""experiments/: grid expansion, the runner's resume/skip logic, launch lines, and aggregation
on small fabricated result files (no training here: the runner's `execute` is faked)."""
import csv
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments import grids, provenance, report, runner
from experiments.grid import FinetuneJob, Grid, PointSpec, expand, flops_per_step, \
    resolve_config

REPO = pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ grid expansion


def test_expand_is_the_cartesian_product_in_axis_order_with_skips():
  pts = expand({"norm": ["post", "pre"], "lr": [1e-4, 1e-3]},
               lambda v: None if (v["norm"], v["lr"]) == ("pre", 1e-3) else PointSpec(
                   f"size=tiny,norm={v['norm']}", {"optim.learning_rate": v["lr"],
                                                   "train.steps": 10}))
  assert [p.name for p in pts] == ["norm=post,lr=0.0001", "norm=post,lr=0.001",
                                   "norm=pre,lr=0.0001"]
  assert pts[1].labels == {"norm": "post", "lr": "0.001"}
  cfg = pts[2].config()
  assert cfg.model.norm_first and cfg.optim.learning_rate == 1e-4 and cfg.train.steps == 10
  assert pts[0].pretrain_flags() == ["--config=configs/pretrain.py:size=tiny,norm=post",
                                     "--config.optim.learning_rate=0.0001",
                                     "--config.train.steps=10"]


def test_bad_grids_are_refused():
  with pytest.raises(ValueError, match="no values"):
    expand({"lr": []}, lambda v: PointSpec("size=tiny"))
  with pytest.raises(ValueError, match="no such config field"):
    resolve_config("size=tiny", {"optim.learnin_rate": 1.0})
  with pytest.raises(ValueError, match="directory name"):
    expand({"w": ["10%"]}, lambda v: PointSpec("size=tiny", {"train.steps": 1}))
  p = expand({"a": ["x"]}, lambda v: PointSpec("size=tiny", {"train.steps": 1}))[0]
  with pytest.raises(ValueError, match="duplicate"):
    Grid("g", "t", (p, p))
  with pytest.raises(ValueError, match="matches no point"):
    Grid("g", "t", (p,)).select("nomatch")


@pytest.mark.parametrize("scale", grids.SCALES)
def test_electra_grid_is_at_equal_flops(scale):
  g = grids.electra_vs_mlm(scale)
  objectives = ["mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm"]
  assert list(dict.fromkeys(p.labels["objective"] for p in g.points)) == objectives
  budget = g.points[0].config().train.flops_budget
  for p in g.points:
    assert p.config().train.flops_budget == budget
    # the step count spends the budget, to within one step
    assert budget <= p.total_flops < budget + p.flops_per_step
    assert p.flops_per_step == flops_per_step(p.config())
  # ELECTRA's generator (1/4 width) and RTD head cost differ from MLM's: steps differ
  assert len({p.steps for p in g.points}) > 1
  if scale in ("demo", "gpu"):  # two pre-training seeds for the finding's arms, the demo recipe
    seeds = {o: sorted(int(p.labels["seed"]) for p in g.points if p.labels["objective"] == o)
             for o in objectives}
    assert seeds["mlm"] == seeds["electra"] == [0, 1] and seeds["replace_mlm"] == [0]
    cfg = g.select("objective=electra,seed=1")[0].config()
    assert cfg.seed == 1 and cfg.model.position_bias == "alibi" and cfg.data.vocab == "demo"
  else:
    assert "seed" not in g.points[0].labels and g.points[0].name == "objective=mlm"


def test_grid_flops_count_the_configs_vocab(tmp_path):
  """The demo grids use the 8,192-token demo vocab: a counter that assumed BERT's 30,522 would
  give them ~3x the decoder FLOPs and the wrong equal-compute step counts."""
  from experiments.grid import resolve_config, vocab_size_of
  cfg = resolve_config("size=tiny,runlocal", {})
  assert vocab_size_of("demo") == 8192 and vocab_size_of("demo:4096") == 4096
  assert vocab_size_of("minilm") == 30522
  (tmp_path / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(300)))
  assert vocab_size_of(str(tmp_path / "vocab.txt")) == 300
  assert flops_per_step(cfg) == flops_per_step(cfg, 8192) < flops_per_step(cfg, 30522)


def test_nsp_grid_formats_and_equal_tokens():
  g = grids.nsp_formats("demo")
  assert len(g.points) == 4 * 4  # four formats x four pre-training seeds
  cfgs = {p.labels["format"]: p.config() for p in g.points}
  assert cfgs["segment_pair+nsp"].objective.sentence_task == "nsp"
  assert cfgs["full_sentences"].objective.sentence_task == "none"
  assert cfgs["doc_sentences"].data.format == "doc_sentences"
  # half-full SENTENCE-PAIR rows get twice the batch at 128 tokens (RoBERTa kept tokens equal)
  assert cfgs["sentence_pair+nsp"].data.batch_size == 2 * cfgs["full_sentences"].data.batch_size
  assert len({c.train.steps for c in cfgs.values()}) == 1


def test_norm_grid_is_lr_x_warmup_x_norm_at_eight_layers():
  g = grids.norm_lr_warmup("demo")
  # lr x warm-up x norm, two pre-training seeds without warm-up, one with
  assert len(g.points) == 2 * 2 * 2 + 2 * 2
  cfg = g.select("lr=0.001,warmup=0,norm=post,seed=1")[0].config()
  assert cfg.model.num_layers == 8 and not cfg.model.norm_first and cfg.seed == 1
  assert cfg.optim.warmup_steps == 0 and cfg.optim.learning_rate == 1e-3
  pre = g.select(r"lr=0.003,warmup=10pct,norm=pre")[0].config()
  assert pre.model.norm_first and pre.optim.warmup_steps == pre.optim.total_steps // 10
  assert not [p for p in g.points if "10pct" in p.name and "seed=1" in p.name]
  assert all(f.task in ("rotten_tomatoes", "brown_pos") and f.seeds >= 3
             for p in g.points for f in p.finetune)


def test_static_vs_dynamic_grid_repeats_static_masks():
  g = grids.static_vs_dynamic("demo")
  arms = {(p.labels["masking"], p.labels["seed"]): p.config() for p in g.points}
  assert set(arms) == {(m, s) for m in ("dynamic", "static_x2", "static_x1") for s in "01"}
  assert arms["dynamic", "0"].objective.masking == "dynamic"
  st = arms["static_x2", "1"]
  assert st.objective.masking == "static" and st.objective.dupe_factor == 2 and st.seed == 1
  assert st.data.source == "demo:moby_dick"
  base = grids.static_vs_dynamic("base")
  assert [p.name for p in base.points] == ["masking=dynamic", "masking=static_x10"]
  assert base.points[1].config().objective.dupe_factor == 10


# ------------------------------------------------------------------ runner: resume and skip


def _tiny_grid(finetune=(FinetuneJob("rotten_tomatoes", seeds=2),)):
  return Grid("g", "a test grid", expand(
      {"objective": ["mlm", "electra"]},
      lambda v: PointSpec(f"size=tiny,objective={v['objective']}",
                          {"train.steps": 8, "data.max_length": 16, "data.batch_size": 2},
                          finetune)))


class FakeExecutor:
  """Stands in for the subprocesses: writes what encoder_jax.main / finetune.main would."""

  def __init__(self, diverge=(), fail_once=(), crash_pretrain=()):
    self.calls, self.diverge, self.fail_once = [], set(diverge), set(fail_once)
    self.crash_pretrain = set(crash_pretrain)

  def __call__(self, cmd, log):
    self.calls.append(cmd)
    wd = pathlib.Path(next(a for a in cmd if a.startswith("--workdir="))[10:])
    wd.mkdir(parents=True, exist_ok=True)
    point = wd.parent.name
    if cmd[2] == "encoder_jax.main":
      if point in self.crash_pretrain:  # killed mid-run: a checkpoint, no summary
        (wd / "checkpoints" / "4").mkdir(parents=True, exist_ok=True)
        self.crash_pretrain.discard(point)
        return -9
      reason = "non_finite" if point in self.diverge else "steps"
      rows = [dict(step=s, split="train", loss=9.0 - s / 4, mlm_loss=9.0 - s / 4)
              for s in (4, 8)] + [dict(step=8, split="eval", loss=7.1, mlm_loss=7.1)]
      (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
      (wd / "summary.json").write_text(json.dumps(dict(
          steps=8, stop_reason=reason, total_wall_s=3.0,
          final_eval=dict(mlm_accuracy=0.25))))
      return 1 if reason == "non_finite" else 0
    if point in self.fail_once:
      self.fail_once.discard(point)
      return 1
    seeds = int(next(a for a in cmd if a.startswith("--config.seeds="))[15:])
    runs = [dict(test=dict(accuracy=0.6 + 0.1 * s, score=0.6 + 0.1 * s), dev={})
            for s in range(seeds)]
    (wd / "results.json").write_text(json.dumps(dict(runs=runs)))
    return 0


def test_runner_runs_everything_once_then_skips(tmp_path):
  grid, fake = _tiny_grid(), FakeExecutor()
  out = runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  assert out == {"objective=mlm": "done", "objective=electra": "done"}
  assert [c[2] for c in fake.calls] == ["encoder_jax.main", "encoder_jax.finetune.main"] * 2
  assert any("--config.seeds=2" in a for a in fake.calls[1])
  assert any(a.startswith("--config=configs/finetune.py:task=rotten_tomatoes,init=ckpt:")
             and a.endswith("objective=mlm/pretrain/checkpoints,run=small") for a in fake.calls[1])
  n = len(fake.calls)
  again = runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  assert again == out and len(fake.calls) == n  # nothing re-ran


def test_killed_point_resumes_and_failed_finetune_is_redone(tmp_path):
  grid = _tiny_grid()
  fake = FakeExecutor(crash_pretrain={"objective=mlm"})
  with pytest.raises(RuntimeError, match="Re-run the same command to resume"):
    runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  assert runner.status(tmp_path, grid.points[0]) == "partial"
  assert runner.status(tmp_path, grid.points[1]) == "todo"
  fake.fail_once = {"objective=electra"}
  with pytest.raises(RuntimeError, match="fine-tuning objective=electra"):
    runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  # the resumed pre-training ran again with the same workdir (the trainer restores from it)
  pre = [c for c in fake.calls if c[2] == "encoder_jax.main"]
  assert pre[0] == pre[1]
  n_pre = len(pre)
  out = runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  assert out == {"objective=mlm": "done", "objective=electra": "done"}
  # the finished pre-training of objective=electra was not redone, only its fine-tuning
  assert len([c for c in fake.calls if c[2] == "encoder_jax.main"]) == n_pre
  assert fake.calls[-1][2] == "encoder_jax.finetune.main"


def test_diverged_point_is_a_result_and_is_not_finetuned(tmp_path):
  grid = _tiny_grid()
  fake = FakeExecutor(diverge={"objective=electra"})
  out = runner.run_grid(grid, tmp_path, execute=fake, echo=lambda s: None)
  assert out["objective=electra"] == "diverged"
  assert [c[2] for c in fake.calls].count("encoder_jax.finetune.main") == 1


def test_changed_point_definition_is_refused_then_redone_on_request(tmp_path):
  fake = FakeExecutor()
  runner.run_grid(_tiny_grid(), tmp_path, execute=fake, echo=lambda s: None,
                  points=_tiny_grid().points[:1])
  # same name, more seeds: finished work of another definition must not be silently reused
  changed = _tiny_grid(finetune=(FinetuneJob("rotten_tomatoes", seeds=3),))
  (tmp_path / "objective=mlm" / "ft_rotten_tomatoes" / "results.json").unlink()
  with pytest.raises(RuntimeError, match="different definition"):
    runner.run_grid(changed, tmp_path, execute=fake, echo=lambda s: None,
                    points=changed.points[:1])
  assert (tmp_path / "objective=mlm" / "pretrain" / "summary.json").exists()  # untouched
  out = runner.run_grid(changed, tmp_path, execute=fake, echo=lambda s: None,
                        points=changed.points[:1], rerun_changed=True)
  assert out == {"objective=mlm": "done"}


def test_keep_going_reports_a_failure_and_continues(tmp_path):
  fake = FakeExecutor(fail_once={"objective=mlm"})
  out = runner.run_grid(_tiny_grid(), tmp_path, execute=fake, echo=lambda s: None,
                        keep_going=True)
  assert out == {"objective=mlm": "partial", "objective=electra": "done"}


def test_launch_lines_for_pod_and_slurm():
  g = grids.electra_vs_mlm("base", "files:gs://b/wiki/*.txt")
  pod = runner.launch_commands(g, "runs/x", "tpu_pod")
  pre = [l for l in pod if "launch/tpu_pod.sh train" in l]
  assert len(pre) == 5 and all("data.source=files:gs://b/wiki/*.txt" in l for l in pre)
  assert any("init=ckpt:$BUCKET/runs/electra_vs_mlm.objective=electra/checkpoints" in l
             for l in pod)
  slurm = runner.launch_commands(g, "runs/x", "slurm")
  assert sum("sbatch --parsable" in l for l in slurm) == 5  # one per objective
  assert sum("--dependency=afterok:$jid" in l for l in slurm) == 5 * 9
  with pytest.raises(ValueError, match="launcher"):
    runner.launch_commands(g, "runs/x", "k8s")


# ------------------------------------------------------------------ aggregation


def test_report_aggregates_fabricated_runs(tmp_path):
  grid = _tiny_grid()
  runner.run_grid(grid, tmp_path / "runs", execute=FakeExecutor(diverge={"objective=electra"}),
                  echo=lambda s: None)
  files = report.write_report(grid, tmp_path / "runs", tmp_path / "out")
  rows = list(csv.DictReader(open(files["csv"])))
  assert [r["point"] for r in rows] == ["objective=mlm", "objective=electra"]
  mlm, electra = rows
  assert mlm["status"] == "done" and electra["status"] == "diverged"
  assert float(mlm["flops"]) == pytest.approx(8 * grid.points[0].flops_per_step)
  assert float(mlm["final_train_curve"]) == 7.0 and float(mlm["final_eval_curve"]) == 7.1
  # two seeds scored 0.6 and 0.7: median 0.65, spread [0.6, 0.7]
  assert float(mlm["rotten_tomatoes_median"]) == pytest.approx(0.65)
  assert float(mlm["rotten_tomatoes_min"]) == pytest.approx(0.6)
  assert int(mlm["rotten_tomatoes_seeds"]) == 2 and electra["rotten_tomatoes_seeds"] == "0"
  md = files["md"].read_text()
  assert "| mlm | done | 8 |" in md and "0.6500 [0.6000, 0.7000], 2" in md
  for key in ("loss_png", "downstream_png"):
    assert files[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_marks_points_at_the_unigram_baseline_and_pools_pretraining_seeds(tmp_path):
  grid = Grid("g", "seeds", expand(
      {"objective": ["mlm"], "seed": [0, 1]},
      lambda v: PointSpec("size=tiny,objective=mlm", {"train.steps": 8, "seed": v["seed"]},
                          (FinetuneJob("rotten_tomatoes", seeds=2),))))
  runner.run_grid(grid, tmp_path, execute=FakeExecutor(), echo=lambda s: None)
  for point, gap in (("objective=mlm,seed=0", 0.5), ("objective=mlm,seed=1", 0.05)):
    path = tmp_path / point / "pretrain" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final_eval"] |= dict(mlm_at_mask_loss=6.0, mlm_at_mask_accuracy=0.2,
                                  unigram_at_mask_loss=6.0 + gap, unigram_at_mask_accuracy=0.05)
    path.write_text(json.dumps(summary))
  rows = report.collect(grid, tmp_path)
  assert [r["status"] for r in rows] == ["done", "stalled"]  # 0.05 nats: never left it
  assert rows[0]["gap_at_mask"] == pytest.approx(0.5)
  md = report.markdown(grid, rows)
  # both pre-training seeds' fine-tuning scores (0.6, 0.7 each) pooled: n = 4
  assert "| mlm | 2 (done, stalled) |" in md and "0.6500 [0.6000, 0.7000], 4" in md


def test_hierarchical_bootstrap_keeps_between_seed_noise_and_marks_real_differences():
  rng = np.random.default_rng(0)
  # no noise at all: every resample is the mean
  assert np.allclose(report.hierarchical_means([[0.7, 0.7], [0.7, 0.7]], 100, rng), 0.7)
  # two pre-training seeds far apart, no fine-tuning noise: resamples are 0.6, 0.7 or 0.8
  # (drawing the seeds, not pooling 4 scores as if independent: that would give 5 values)
  m = report.hierarchical_means([[0.6, 0.6], [0.8, 0.8]], 4000, rng)
  assert sorted(set(np.round(m, 6))) == pytest.approx([0.6, 0.7, 0.8])
  # an arm's difference from the first arm, with * where the interval excludes 0
  grid = Grid("g", "diff", expand({"arm": ["a", "b", "c"], "seed": [0, 1]}, lambda v: PointSpec(
      "size=tiny,objective=mlm", {"train.steps": 8, "seed": v["seed"]})))
  base = {"a": 0.70, "b": 0.75, "c": 0.70}
  rows = [dict(arm=p.labels["arm"], seed=p.labels["seed"], status="done",
               gap_at_mask=1.0 + 0.1 * int(p.labels["seed"]),
               _pos_scores=[base[p.labels["arm"]] + d for d in (-0.01, 0.0, 0.01)])
          for p in grid.points]
  lines = report.difference_table(grid, rows, ["pos"], resamples=2000)
  assert lines[1] == "#### Differences from arm=a"
  b, c = lines[-2], lines[-1]
  assert b.startswith("| b | +0.0000 [") and "| +0.0500 [+0.04" in b and b.endswith("]* |")
  assert c.startswith("| c | +0.0000 [") and not c.endswith("* |")
  assert report.difference_table(grid, rows[:1], ["pos"]) == []  # one arm: nothing to compare
  # an arm with one finished seed gets no interval; the reference stays the grid's first arm
  # even when its runs are missing (then there is no table)
  one = report.difference_table(grid, rows[:5], ["pos"], resamples=200)
  assert one[-1].startswith("| c | – (1 seed) |")
  assert report.difference_table(grid, rows[2:], ["pos"]) == []


def test_electra_points_are_judged_by_the_discriminator_against_its_prior(tmp_path):
  """An RTD point stalls when its discriminator ends near the binary entropy of the replaced
  share, whatever its generator does (a 1/4-width generator may stay near unigram)."""
  grid = Grid("g", "rtd", expand(
      {"objective": ["electra"], "seed": [0, 1, 2]},
      lambda v: PointSpec("size=tiny,objective=electra", {"train.steps": 8, "seed": v["seed"]},
                          ())))
  runner.run_grid(grid, tmp_path, execute=FakeExecutor(), echo=lambda s: None)
  prior = report.binary_entropy(0.16)
  assert prior == pytest.approx(0.43967, abs=1e-5)  # -(0.16 ln 0.16 + 0.84 ln 0.84)
  # seed 0: discriminator 0.85 of its prior, generator on the plateau (0.02 nats): learned.
  # seed 1: discriminator 0.98 of its prior, generator well off the plateau: stalled.
  # seed 2: every chosen token replaced (share 1, no prior to beat; a 3-step ELECTRA-15%
  # run): the ratio is undefined, so it is not judged done.
  for seed, ratio, gap, share in ((0, 0.85, 0.02, 0.16), (1, 0.98, 0.6, 0.16),
                                  (2, 0.5, 0.6, 1.0)):
    path = tmp_path / f"objective=electra,seed={seed}" / "pretrain" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final_eval"] |= dict(disc_loss=ratio * prior, disc_replaced_frac=share,
                                  gen_at_mask_loss=6.0, gen_at_mask_accuracy=0.1,
                                  unigram_at_mask_loss=6.0 + gap, unigram_at_mask_accuracy=0.05)
    path.write_text(json.dumps(summary))
  rows = report.collect(grid, tmp_path)
  assert [r["status"] for r in rows] == ["done", "stalled", "stalled"]
  assert rows[0]["disc_vs_prior"] == pytest.approx(0.85) and math.isnan(rows[2]["disc_vs_prior"])
  md = report.markdown(grid, rows)
  assert "disc loss / prior entropy" in md and "0.9150 [0.8500, 0.9800]" in md


def test_stall_threshold_marks_runs_that_never_left_the_plateau(tmp_path):
  g = _tiny_grid(finetune=())
  g = Grid(g.name, g.title, g.points, stall_loss=7.0)  # the fake eval loss is 7.1
  runner.run_grid(g, tmp_path, execute=FakeExecutor(), echo=lambda s: None)
  assert {r["status"] for r in report.collect(g, tmp_path)} == {"stalled"}
  g2 = Grid(g.name, g.title, g.points, stall_loss=7.5)
  assert {r["status"] for r in report.collect(g2, tmp_path)} == {"done"}


def test_report_of_an_unstarted_grid_shows_todo(tmp_path):
  rows = report.collect(_tiny_grid(), tmp_path)
  assert [r["status"] for r in rows] == ["todo", "todo"]
  assert math.isnan(rows[0]["final_train_curve"])


def test_cli_plan_writes_nothing_tracked_and_help_exits_0(tmp_path):
  """A plan (as the README runs it: no --out, no --workdir) goes under the ignored run folder:
  the tracked tree, experiments/results/ included, is exactly as before."""
  def tracked_state():
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
  before = tracked_state()
  got = subprocess.run([sys.executable, "-m", "experiments.run", "--grid=electra_vs_mlm",
                        "--scale=base", "--action=plan"], cwd=REPO,
                       capture_output=True, text=True, check=True)
  assert "objective=replace_mlm" in got.stdout and "6.4e+19" in got.stdout
  assert "v4-32" in got.stdout
  assert tracked_state() == before, "experiments.run --action=plan changed the tracked tree"
  plan_dir = REPO / "experiments" / "runs" / "electra_vs_mlm_base"
  assert f"wrote {plan_dir / 'plan.md'}" in got.stdout
  # the plan records what computed it (experiments.provenance), and says so under its title
  rec = provenance.read(plan_dir)[-1]
  assert rec["action"] == "plan" and rec["grid"]["scale"] == "base"
  assert rec["command"] == ("python -m experiments.run --grid=electra_vs_mlm --scale=base "
                            "--action=plan")
  assert rec["git"]["commit"] == _git_head() and "status_before" not in rec["points"][0]
  assert f"Planned at commit `{_git_head()[:12]}`" in (plan_dir / "plan.md").read_text()
  help_run = subprocess.run([sys.executable, "-m", "experiments.run", "--helpfull"], cwd=REPO,
                            capture_output=True, text=True)
  assert help_run.returncode == 0, help_run.stderr
  for flag in ("--grid", "--action", "--only", "--launcher", "keep_going", "--plan_mfu"):
    assert flag in help_run.stdout


def test_runner_end_to_end_with_real_subprocesses(tmp_path):
  """One real point (a few steps of a 1-layer encoder on the demo corpus): the runner's
  commands work as printed, the report reads what the trainer wrote, a re-run skips it."""
  grid = Grid("e2e", "runner smoke", expand({"norm": ["pre"]}, lambda v: PointSpec(
      f"size=tiny,norm={v['norm']}",
      {"model.num_layers": 1, "data.max_length": 32, "data.batch_size": 4,
       "train.steps": 6, "train.log_every": 2, "train.eval_every": 6, "train.eval_steps": 1,
       "train.checkpoint_every": 3, "optim.warmup_steps": 2})))
  lines = []
  assert runner.run_grid(grid, tmp_path, echo=lines.append) == {"norm=pre": "done"}
  assert any("step 6/6" in l for l in lines), lines
  rows = report.collect(grid, tmp_path)
  assert rows[0]["steps"] == 6 and rows[0]["final_eval_curve"] > 0
  assert rows[0]["flops"] == pytest.approx(6 * grid.points[0].flops_per_step)
  again = []
  runner.run_grid(grid, tmp_path, echo=again.append)
  assert again == ["[1/1] norm=pre: done, skipped"]


def test_override_variant_changes_every_point_and_its_flops():
  from experiments.grid import parse_override, with_overrides
  assert parse_override("data.batch_size=32") == ("data.batch_size", 32)
  assert parse_override("optim.learning_rate=1e-3") == ("optim.learning_rate", 1e-3)
  assert parse_override("data.source=files:/x/*.txt") == ("data.source", "files:/x/*.txt")
  with pytest.raises(ValueError, match="KEY=VALUE"):
    parse_override("train.steps")
  g = grids.norm_lr_warmup("demo")
  v = with_overrides(g, {"data.batch_size": 32, "data.max_length": 128}, name="norm_long")
  assert v.name == "norm_long" and [p.name for p in v.points] == [p.name for p in g.points]
  for a, b in zip(g.points, v.points):
    assert b.config().data.batch_size == 32 and b.config().optim.learning_rate == \
        a.config().optim.learning_rate
    assert b.flops_per_step > 3.9 * a.flops_per_step  # 4x the tokens per step


def test_finetune_command_of_a_multi_axis_point_reaches_its_checkpoint(tmp_path):
  """Point folders hold commas ("objective=mlm,seed=0"): the fine-tuning job's config argument
  must still give the whole checkpoint path as init and the run preset as run."""
  from configs import finetune as finetune_config
  g = grids.electra_vs_mlm("demo")
  point = g.select("objective=mlm,seed=1")[0]
  cmd = runner.finetune_command(point, point.finetune[1], tmp_path)
  arg = next(a for a in cmd if a.startswith("--config="))
  cfg = finetune_config.get_config(arg.partition(":")[2])
  assert cfg.init == f"ckpt:{tmp_path / 'objective=mlm,seed=1' / 'pretrain' / 'checkpoints'}"
  assert cfg.task == "brown_pos" and cfg.pooling == "mean"  # the run=demo preset applied


def test_learning_curve_jobs_fine_tune_their_own_checkpoint(tmp_path):
  """electra_curve: MLM and ELECTRA at one FLOPs budget, each fine-tuned on POS from the
  checkpoints at 1/4, 1/2, 3/4 of its run and at its end; those steps are saved and kept, the
  jobs get their own folders and report columns, and the dry run drops them."""
  from configs import finetune as finetune_config
  g = grids.get_grid("electra_curve")
  assert [p.name for p in g.points] == ["seed=0,objective=mlm", "seed=0,objective=electra",
                                        "seed=1,objective=mlm", "seed=1,objective=electra"]
  budget = 2 * 8400 * g.points[0].flops_per_step
  for p in g.points:
    assert p.total_flops == pytest.approx(budget, rel=3e-4)
    cfg = p.config()
    every = cfg.train.checkpoint_every
    assert p.steps == 4 * every and cfg.train.keep >= 6 and cfg.train.eval_every > 0
    steps = [j.step_of(p) for j in p.finetune]
    assert steps == [every, 2 * every, 3 * every, 0, 0]  # 0: the newest (final) checkpoint
    assert [j.key for j in p.finetune] == ["brown_pos_at0.25", "brown_pos_at0.5",
                                           "brown_pos_at0.75", "rotten_tomatoes", "brown_pos"]
    cmd = runner.finetune_command(p, p.finetune[1], tmp_path)
    init = finetune_config.get_config(
        next(a for a in cmd if a.startswith("--config=")).partition(":")[2]).init
    assert init == f"ckpt:{tmp_path / p.name / 'pretrain' / 'checkpoints' / str(2 * every)}"
    assert f"--workdir={tmp_path / p.name / 'ft_brown_pos_at0.5'}" in cmd
  with pytest.raises(ValueError, match="checkpoint_every"):  # a step the run does not save
    FinetuneJob("brown_pos", at_fraction=0.3).step_of(g.points[0])
  with pytest.raises(ValueError, match=r"\(0, 1\]"):
    FinetuneJob("brown_pos", at_fraction=0)
  # a final-checkpoint job's record is what it was before at_fraction existed: old runs resume
  assert "at_fraction" not in runner.point_record(g.points[0])["finetune"][-1]
  assert runner.point_record(g.points[0])["finetune"][0]["at_fraction"] == 0.25
  assert all(j.at_fraction == 1 for p in grids.dry_run(g).points for j in p.finetune)
  with pytest.raises(ValueError, match="demo-scale"):
    grids.get_grid("electra_curve", "gpu")


def test_report_has_a_column_per_learning_curve_job(tmp_path):
  g = grids.get_grid("electra_curve")
  fake = FakeExecutor()
  runner.run_grid(g, tmp_path, points=g.points[:2], execute=fake, echo=lambda s: None)
  assert sum(c[2] == "encoder_jax.finetune.main" for c in fake.calls) == 10
  rows = report.collect(g, tmp_path, g.points[:2])
  assert rows[0]["brown_pos_at0.25_seeds"] == 3 and rows[0]["brown_pos_seeds"] == 3
  assert "brown_pos_at0.75 test/accuracy" in report.markdown(g, rows)


# ------------------------------------------------------------------ provenance


def _git_head() -> str:
  return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                        check=True).stdout.strip()


def _plain(config) -> dict:
  return json.loads(json.dumps(config.to_dict(), default=str))


def test_provenance_records_commit_and_config_and_appends_each_invocation(tmp_path):
  """A grid resumed over two invocations keeps both records in its results folder: the repo's
  commit and dirty files, the command, each point's config (rebuilt from the record alone it is
  the config that ran), the host and package versions; results.md opens with the commit."""
  import flax
  import jax
  grid, out, runs = _tiny_grid(), tmp_path / "out", tmp_path / "runs"
  argv = [str(REPO / "experiments" / "run.py"), "--grid=g", f"--out={out}"]
  def modified():
    return set(subprocess.run(["git", "diff", "--name-only", "HEAD", "--"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.split())
  before = modified()
  first = provenance.record(out, grid, action="run", scale="demo", workdir=runs, argv=argv)
  after = modified()  # (others may edit the tree meanwhile: the record lies between the two)
  assert first["git"]["commit"] == _git_head()
  assert before & after <= set(first["git"]["modified"]) <= before | after
  assert first["git"]["dirty"] == bool(first["git"]["modified"])
  assert first["git"]["modified"] == sorted(first["git"]["modified"])
  assert first["command"] == f"python -m experiments.run --grid=g --out={out}"
  assert first["grid"]["name"] == "g" and first["grid"]["workdir"] == str(runs)
  assert first["host"]["cores"] == os.cpu_count() and first["host"]["cpu"] != "unknown"
  assert first["packages"]["jax"] == jax.__version__
  assert first["packages"]["flax"] == flax.__version__ and first["packages"]["optax"]
  assert [p["status_before"] for p in first["points"]] == ["todo", "todo"]

  (rec,) = provenance.read(out)  # from disk: everything survives JSON
  assert rec == json.loads(json.dumps(first))
  # the base config (the ConfigDict's every leaf) and the overrides give back each point's
  # config; the overrides matter (the tiny grid's 8 steps are not the default)
  assert set(rec["pretrain_configs"]) == {"size=tiny,objective=mlm", "size=tiny,objective=electra"}
  for p in grid.points:
    assert _plain(provenance.point_config(rec, p.name)) == _plain(p.config())
    assert p.config().train.steps == 8 != rec["pretrain_configs"][p.pretrain_arg]["train"]["steps"]
  (ft,) = rec["finetune_configs"]  # one job, shared by both points: its full config, once
  assert (ft["task"], ft["seeds"]) == ("rotten_tomatoes", 2) and "learning_rate" in ft
  assert [j["config"] for p in rec["points"] for j in p["finetune"]] == [0, 0]

  # the second invocation (after a partial run) appends; the first record stays as it was
  runner.run_grid(grid, runs, execute=FakeExecutor(), echo=lambda s: None,
                  points=grid.points[:1])
  provenance.record(out, grid, action="run", scale="demo", workdir=runs, argv=argv)
  records = provenance.read(out)
  assert len(records) == 2 and records[0] == rec
  assert [p["status_before"] for p in records[1]["points"]] == ["done", "todo"]

  runner.run_grid(grid, runs, execute=FakeExecutor(), echo=lambda s: None)
  md = report.write_report(grid, runs, out)["md"].read_text()
  head = md.splitlines()[0]
  assert head.startswith(f"**Produced by** commit `{_git_head()[:12]}`")
  assert records[1]["date"].replace("T", " ").replace("Z", " UTC") in head
  assert "| run | " in md and "| 2 of 2 |" in md and "| 1 of 2 |" in md


def test_provenance_without_git_says_unknown(tmp_path, monkeypatch):
  grid = _tiny_grid(finetune=())
  # not a repository (tmp_path), then no git at all: recorded as unknown, never an error
  assert provenance.git_state(tmp_path) == {"commit": "unknown", "dirty": "unknown",
                                            "modified": "unknown"}
  monkeypatch.setattr(provenance, "GIT", "git-that-does-not-exist")
  rec = provenance.record(tmp_path, grid, action="report", workdir=tmp_path, argv=["x"])
  assert rec["git"]["commit"] == "unknown" and rec["finetune_configs"] == []
  lines = provenance.summary_lines(provenance.read(tmp_path))
  assert lines[0].startswith("**Produced by** an unknown commit")
  assert any("| report | unknown (tree state unknown) | – | `x` |" in line for line in lines)


def test_a_pinned_git_state_is_what_later_records_name(tmp_path):
  """A commit made while a long run goes on is not credited with its results: the records of
  a process that pinned its state at the start name the tree of the start."""
  repo = tmp_path / "repo"
  repo.mkdir()
  git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)
  git("init", "-q")
  git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "one")
  first = provenance.pin_git_state(repo)
  git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "two")
  try:
    assert provenance.git_state(repo)["commit"] != first["commit"]
    assert provenance.process_git_state(repo) == first
    rec = provenance.make_record(grids.get_grid("static_vs_dynamic", "demo"), action="plan",
                                 repo=repo)
    assert rec["git"]["commit"] == first["commit"]
  finally:
    provenance._PINNED.pop(str(repo))
