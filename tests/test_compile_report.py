"""`pytest --compile-report=PATH` (tests/conftest.py): where a cold run's compile time goes, per
test file and per jitted function, merged over the xdist workers."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_compile_report_names_the_files_and_programs_that_compiled(tmp_path):
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"))  # cold: compiles
  report = tmp_path / "report.tsv"
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
       "tests/train/test_optim.py::test_global_norm_clipping",
       "tests/train/test_optim.py::test_schedules", f"--compile-report={report}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  files, functions = report.read_text().split("\n\n")[:2]
  assert files.splitlines()[0] == "compile_s\tprograms\ttest file"
  seconds, programs, name = files.splitlines()[1].split("\t")
  assert name == "tests/train/test_optim.py" and float(seconds) > 0 and int(programs) > 0
  assert functions.splitlines()[0] == "compile_s\tprograms\tjitted function"
  assert sum(int(line.split("\t")[1]) for line in functions.splitlines()[1:]) == int(programs)
  assert not list(tmp_path.glob("report.tsv.gw*"))  # the workers' shares were merged
