"""The gpu scale of the grids (sizing, recipe), the generator-size grid, the base grids'
generator, dry runs, the in-process executor, and bench/gpu_grids.sh --dry_run end to end."""
import csv
import json
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import grids, provenance, report, runner
from experiments.grid import flops_per_step

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_gpu_scale_fits_its_budget_by_the_stated_estimate():
  """The four main grids at --scale=gpu fit bench/gpu_grids.sh's 9 minutes under the sizing
  assumptions in experiments/grids.py (GPU_*); raising steps or points past it fails here."""
  total = grids.GPU_STARTUP_S + sum(grids.gpu_seconds(grids.get_grid(n, "gpu"))
                                    for n in grids.GPU_GRIDS)
  assert total <= grids.GPU_BUDGET_S == 540
  # the estimate is not all start-up: at least a sixth of it trains
  flops = sum(p.total_flops for n in grids.GPU_GRIDS for p in grids.get_grid(n, "gpu").points)
  assert flops / (grids.gpu_peak_flops() * grids.GPU_MFU) > total / 6


@pytest.mark.parametrize("name", grids.GPU_GRIDS)
def test_gpu_points_are_electra_small_in_bf16_with_fp32_params(name):
  g = grids.get_grid(name, "gpu")
  for p in g.points:
    cfg = p.config()
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.embedding_size) == (12, 256, 128)
    assert cfg.model.dtype == "bfloat16" and cfg.model.param_dtype == "float32"
    assert cfg.model.norm_first == (p.labels.get("norm", "pre") == "pre")
    assert cfg.data.max_length == 128 and cfg.data.batch_size in (128, 256)
    assert cfg.train.eval_every == cfg.train.checkpoint_every == p.steps
    assert 2e14 < p.total_flops < 1e16
    assert [j.task for j in p.finetune] == ["rotten_tomatoes", "brown_pos"]
    assert all(j.seeds >= 3 for j in p.finetune)
  # two pre-training seeds for every arm the finding is about: >= ~1e15 FLOPs per such arm
  seeds = {}
  for p in g.points:
    arm = tuple(v for k, v in p.labels.items() if k != "seed")
    seeds[arm] = seeds.get(arm, 0) + p.total_flops
  # (norm_lr_warmup is the first 200 steps of its schedule by design: where post-LN breaks)
  assert max(seeds.values()) >= (4e14 if name == "norm_lr_warmup" else 7e14)


def test_gpu_static_masking_repeats_masks_as_bert_did():
  g = grids.static_vs_dynamic("gpu")
  p = g.select("masking=static_x5,seed=1")[0]
  cfg = p.config()
  assert cfg.objective.masking == "static" and cfg.objective.dupe_factor == 5
  assert cfg.data.source == "demo:moby_dick" and cfg.seed == 1
  # ~0.31M tokens of Moby-Dick (the demo grid's 2,400 steps x 1,024 = 8 epochs): ~20 epochs,
  # so each of the 5 static masks is seen ~4 times (BERT: 40 epochs / 10 copies)
  epochs = p.steps * 128 * 128 / (2400 * 8 * 128 / 8)
  assert 3 <= epochs / 5 <= 5


@pytest.mark.parametrize("scale", grids.SCALES)
def test_generator_size_grid(scale):
  from encoder_jax.model.electra import generator_config
  from encoder_jax.train.setup import model_config
  g = grids.get_grid("generator_size", scale)
  assert grids.GRIDS["generator_size"] is grids.generator_size
  gens = list(dict.fromkeys(p.labels["gen"] for p in g.points))
  assert gens == ["1_4", "1_2", "1"]
  by_gen = {}
  for p in g.points:
    cfg = p.config()
    assert cfg.objective.objective == "electra"
    disc = model_config(cfg, 8192)
    gen = generator_config(disc, cfg.objective.gen_hidden_frac, cfg.objective.gen_layers_frac)
    by_gen.setdefault(p.labels["gen"], []).append((p, gen, disc))
  for label, frac in (("1_4", 4), ("1_2", 2), ("1", 1)):
    for p, gen, disc in by_gen[label]:
      assert gen.hidden_size * frac == disc.hidden_size and gen.num_layers == disc.num_layers
  # equal steps (the paper's Figure 3), so a wider generator spends more FLOPs
  assert len({p.steps for p in g.points}) == 1
  flops = [by_gen[k][0][0].flops_per_step for k in gens]
  assert flops == sorted(flops) and flops[-1] > 1.5 * flops[0]
  if scale == "demo":
    assert [p.name for p in g.points][:2] == ["gen=1_4,seed=0", "gen=1_4,seed=1"]
  else:
    assert g.points[0].name == "gen=1_4"


def test_base_electra_grid_uses_electra_bases_one_third_generator():
  from encoder_jax.model.electra import generator_config
  from encoder_jax.train.setup import model_config
  for p in grids.electra_vs_mlm("base").points:
    cfg = p.config()
    assert cfg.objective.gen_hidden_frac == pytest.approx(1 / 3)
    if p.labels["objective"] == "electra":  # 256 wide, 4 heads of 64 for the 768-wide base
      gen = generator_config(model_config(cfg, 30522), cfg.objective.gen_hidden_frac)
      assert (gen.hidden_size, gen.num_heads, gen.ffn_size) == (256, 4, 1024)
  for scale in ("demo", "gpu"):  # Small-sized models keep ELECTRA-Small's 1/4
    cfg = grids.electra_vs_mlm(scale).select("objective=electra,seed=0")[0].config()
    assert cfg.objective.gen_hidden_frac == 0.25


def test_dry_run_keeps_one_point_per_code_path_and_shrinks_it():
  g = grids.electra_vs_mlm("gpu")
  d = grids.dry_run(g)
  # seeds only change numbers: the first seed of each objective stays, in grid order
  assert [p.name for p in d.points] == [f"objective={o},seed=0" for o in (
      "mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm")]
  assert {p.labels["objective"] for p in d.points} == {p.labels["objective"] for p in g.points}
  n = grids.dry_run(grids.norm_lr_warmup("gpu"))  # lr and warm-up values share a program
  assert [(p.labels["lr"], p.labels["warmup"], p.labels["norm"]) for p in n.points] == [
      ("0.001", "0", "post"), ("0.001", "0", "pre")]
  # ... and the dry run as a whole still takes both branches of the schedule: no warm-up stays
  # none (these points), a warm-up becomes one step (the other grids' points)
  warmups = {p.config().optim.warmup_steps
             for name in grids.GPU_GRIDS for p in grids.dry_run(grids.get_grid(name, "gpu")).points}
  assert warmups == {0, 1}
  by_name = {p.name: p for p in g.points}
  # each point fine-tunes one task, taking turns: every task and every checkpoint is exercised
  assert [[(j.task, j.seeds, j.overrides["max_train_examples"]) for j in b.finetune]
          for b in d.points] == [[("rotten_tomatoes", 1, 16)], [("brown_pos", 1, 16)]] * 2 + [
              [("rotten_tomatoes", 1, 16)]]
  for b in d.points:
    a = by_name[b.name]
    cfg = b.config()
    assert b.steps == 3 and cfg.model.num_layers == 1 and cfg.model.dtype == "float32"
    # the whole demo corpus shrinks to its Moby-Dick part; a point's own corpus stays (below)
    assert a.config().data.source == "demo" and cfg.data.source == "demo:moby_dick"
    assert cfg.objective.objective == a.config().objective.objective
    assert cfg.train.flops_budget == a.config().train.flops_budget
    assert b.flops_per_step == flops_per_step(cfg) < a.flops_per_step / 1000
  own = grids.dry_run(grids.electra_vs_mlm("base", data_source="files:/corpus/*.txt"))
  assert {p.config().data.source for p in own.points} == {"files:/corpus/*.txt"}


def test_gpu_plan_prints_the_estimate():
  g = grids.static_vs_dynamic("gpu")
  lines = report.gpu_plan_lines(g, grids.GPU_MFU)
  assert len(lines) == 2 + len(g.points) + 1 and "H200" in lines[0]
  assert lines[-1].startswith("| **all** |") and report.duration(grids.gpu_seconds(g)) in lines[-1]


def test_finetune_config_in_process_matches_the_command(tmp_path):
  from configs import finetune as finetune_lib
  p = grids.dry_run(grids.nsp_formats("gpu")).points[1]
  (job,) = p.finetune
  cfg = runner.finetune_config(p, job, tmp_path)
  cmd = runner.finetune_command(p, job, tmp_path)
  ref = finetune_lib.get_config(next(a for a in cmd if a.startswith("--config=")).partition(":")[2])
  assert cfg.init == ref.init and cfg.task == "brown_pos" and cfg.pooling == "mean"
  assert (cfg.seeds, cfg.max_train_examples, cfg.epochs) == (1, 16, 1)
  assert "--config.seeds=1" in cmd and "--config.max_train_examples=16" in cmd


def test_in_process_calls_log_echo_and_report_failures(tmp_path, capsys):
  """Output goes to the job's log, progress lines to the echo (print itself here: the tee
  must not feed the echo back into the log); an error is exit 1 with its traceback logged,
  a divergence (FloatingPointError, already in the summary) is not echoed as an error."""
  ip = runner.InProcess(echo=print)
  log = tmp_path / "job.log"

  def job():
    print("step 1/3 | loss 9.0")
    print("absl noise")
  assert ip._call("a job", job, log) == 0
  out = capsys.readouterr().out
  assert "    step 1/3 | loss 9.0" in out and "noise" not in out
  assert "absl noise" in log.read_text() and "# in process: a job" in log.read_text()

  def bad():
    raise ValueError("data.vocab='x' does not exist")
  assert ip._call("bad", bad, log) == 1
  assert "Error: ValueError: data.vocab='x'" in capsys.readouterr().out
  assert "Traceback" in log.read_text()

  def diverge():
    raise FloatingPointError("step 3: non-finite loss")
  assert ip._call("nan", diverge, log) == 1
  assert "Error" not in capsys.readouterr().out
  with pytest.raises(ValueError, match="not both"):
    runner.run_grid(grids.static_vs_dynamic("gpu"), tmp_path, execute=lambda c, l: 0,
                    in_process=True)


def test_in_process_preemption_stops_the_grid_run(tmp_path, monkeypatch):
  """SIGTERM inside a point's training (the trainer saves and returns "preempted") ends the
  grid run with exit 0 instead of moving on to the next point; the point stays resumable."""
  from encoder_jax.train import loop
  calls = []

  def preempted(config, workdir):
    calls.append(workdir)
    pathlib.Path(workdir).mkdir(parents=True)
    (pathlib.Path(workdir) / "summary.json").write_text(json.dumps({"stop_reason": "preempted"}))
  monkeypatch.setattr(loop, "train_and_evaluate", preempted)
  g = grids.dry_run(grids.static_vs_dynamic("gpu"))
  with pytest.raises(SystemExit) as stop:
    runner.run_grid(g, tmp_path, in_process=True, keep_going=True, echo=lambda s: None)
  assert stop.value.code == 0 and len(calls) == 1
  assert runner.status(tmp_path, g.points[0]) == "partial"


@pytest.mark.slow
def test_gpu_grids_script_dry_run_end_to_end(tmp_path):
  """bash bench/gpu_grids.sh --dry_run: one point per code path of each of the four grids
  pre-trains (3 steps) and fine-tunes in one process on CPU, and the four reports are
  written."""
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  proc = subprocess.run(["bash", "bench/gpu_grids.sh", "--dry_run", f"--workdir={tmp_path}/runs",
                         f"--out={tmp_path}/out"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for name in grids.GPU_GRIDS:
    out = tmp_path / "out" / f"{name}_gpu_dry_run"
    rows = list(csv.DictReader(open(out / "results.csv")))
    full = grids.get_grid(name, "gpu").points
    kept = [p.name for p in grids.dry_run(grids.get_grid(name, "gpu")).points]
    assert [r["point"] for r in rows] == kept and 0 < len(kept) <= len(full)
    for i, r in enumerate(rows):  # 3 steps leave every point on the plateau: "stalled"
      assert r["status"] in ("done", "stalled") and r["steps"] == "3", r
      # the points take turns at the two tasks, one fine-tuning seed each
      assert (r["rotten_tomatoes_seeds"], r["brown_pos_seeds"]) == (
          ("1", "0") if i % 2 == 0 else ("0", "1")), r
    # what produced it heads the report, from the record the run appended (experiments.provenance)
    md = (out / "results.md").read_text()
    assert md.startswith("**Produced by** commit ") and "\n### " in md
    (rec,) = provenance.read(out)
    assert rec["action"] == "run" and rec["grid"]["name"] == name
    assert [p["name"] for p in rec["points"]] == kept
    assert (out / "loss_vs_flops.png").exists() and (out / "downstream_vs_flops.png").exists()
    pdir = tmp_path / "runs" / f"{name}_gpu_dry_run" / rows[0]["point"]
    assert "# in process: python -m encoder_jax.main" in (pdir / "pretrain.log").read_text()
    assert json.loads((pdir / "pretrain" / "summary.json").read_text())["stop_reason"] == "steps"
  assert "bench/gpu_grids.sh:" in proc.stdout and "4 grids in" in proc.stdout
