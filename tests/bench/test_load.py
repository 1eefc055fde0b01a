"""bench/train_step.py's honesty about load: other processes' CPU use is measured apart from
the benchmark's own workers, and a loaded machine gets no 'vs HF' ratio."""
import os

from absl import flags
from absl.testing import flagsaver

from bench import systems, train_step


def test_foreign_load_subtracts_our_own_processes():
  hz = os.sysconf("SC_CLK_TCK")
  clock, busy, own = [0.0], [0], {}

  meter = systems.ForeignLoad(lambda: [11, 12], read_stat=lambda: busy[0],
                              read_pid=lambda pid: own.get(pid, 0), clock=lambda: clock[0])
  # 2 s: the machine busy for 3 core-seconds, 2.5 of them ours (this process + two workers)
  clock[0], busy[0] = 2.0, 3 * hz
  own.update({os.getpid(): hz // 2, 11: hz, 12: hz})
  assert abs(meter.cores() - 0.25) < 1e-9
  # next interval: only our workers busy -> nothing foreign (never negative)
  clock[0], busy[0] = 3.0, 4 * hz
  own[11] += hz + 5
  assert meter.cores() == 0.0
  # the real /proc readers on this machine
  real = systems.ForeignLoad(lambda: [])
  c = real.cores()
  assert c is None or c >= 0.0


def test_verdict_and_the_table_withhold_ratios_on_a_loaded_machine(capsys):
  assert systems.quiet_verdict([0.05, 0.1], 2, 0.1)[0]
  quiet, line = systems.quiet_verdict([0.05, 0.9, 0.1], 2, 0.1)
  assert not quiet and "max 0.90 of 2 cores" in line and "LOADED" in line
  assert systems.quiet_verdict([None], 2, 0.1)[0]
  row = dict(size="mini", batch="32x128", name="ours", label="ours", step_s=1.0, tps=4096.0,
             cpu_tps=2048.0, spread=0.05, flops=1e9, info={}, load="1 1 1", peak=2e11,
             peaks=(2e11, 1.8e11, 2.1e11), foreign=(0.05, 0.9), ratio=1.7, cpu_ratio=1.6)
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["train_step"])
  with flagsaver.flagsaver(max_foreign_load=0.1):
    train_step.print_table([row], 3, 1)
  out = capsys.readouterr().out
  assert "1.70x" not in out and "loaded" in out and "LOADED" in out
  assert "median 200 GFLOP/s [180, 210]" in out
  with flagsaver.flagsaver(max_foreign_load=0.1, allow_loaded=True):
    train_step.print_table([row], 3, 1)
  assert "1.70!" in capsys.readouterr().out
  with flagsaver.flagsaver(max_foreign_load=0.5):  # 0.9 of 2 cores is within 50%
    train_step.print_table([row], 3, 1)
  out = capsys.readouterr().out
  assert "1.70x" in out and ": quiet" in out
