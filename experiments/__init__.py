"""Ablation grids as code, a resumable runner and a report generator (see README, Experiments).

  grid.py     Point / Grid / expand: a grid is the cartesian product of its axes
  grids.py    the grids: electra_vs_mlm, generator_size, nsp_formats, norm_lr_warmup,
              static_vs_dynamic (demo, gpu and base scales)
  runner.py   executes points in sequence (finished ones skipped, killed ones resumed), one
              subprocess per job or in process, or prints launch commands for a TPU pod / SLURM
  report.py   results.csv + results.md + loss-vs-FLOPs and downstream-vs-FLOPs plots
  provenance.py  what produced a results folder (commit, command, configs, host, versions),
              one record per invocation in <results>/provenance.json
  run.py      the CLI: python -m experiments.run --grid=<name> [--action=...]
"""
