"""Test-wide JAX settings: 8 fake CPU devices, XLA optimisation level 0, strict rank promotion.

XLA_FLAGS must be set before jax is imported anywhere, so it lives here (pytest imports
conftest.py first); subprocesses started by tests inherit it. Level 0: compiling, not running,
is most of the suite's time, and at level 0 tests/model, tests/finetune and tests/convert
take a third less time (177 s -> 121 s on 2 cores) while a step runs about half as fast; the
parity tolerances hold at both levels. The tests that train for hundreds of steps compile at
level 2 instead (full_xla_optimization below). Fusion emitters off: XLA:CPU's newer (MLIR)
fusion emitters compile a BERT-mini train step in 3.5 s, the older ones in 1.4 s (its first
call took 0.75 s instead of 0.59); tests/train/test_sharding.py and
tests/model/test_block_switches.py compiled in 152 s with them, 86 s without (cold, 2 cores).
"""
import functools
import os
import pathlib

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    " --xla_cpu_use_fusion_emitters=false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's persistent compilation cache for every program the suite compiles, in this process, its
# xdist workers and the trainers the tests start as subprocesses (all inherit the variables):
# one folder per machine, beside the encoder_jax data cache the tests also use (the rule of
# encoder_jax.data.fetch.cache_root, which cannot be imported before JAX is set up here). A
# program compiled once is loaded, not recompiled, by the next test or the next run of the suite;
# a changed program has a new key (its HLO, the compile options and XLA_FLAGS are hashed), so a
# broken piece still compiles and fails. Kept under CACHE_LIMIT by pytest_sessionstart below.
CACHE_DIR = os.path.join(
    os.environ.get("ENCODER_JAX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "encoder_jax"), "xla-tests")
CACHE_LIMIT = 1 << 30  # bytes; one run of the whole suite writes ~60 MB
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No size limit inside JAX (see pytest_sessionstart), stated so that the trainers the tests start
# keep to it: encoder_jax.cli sets one when none is given, and a process with a limit fails to
# write into a folder whose entries were written without one (it looks for their "-atime" files).
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
# MFU on CPU divides by a peak measured once per machine and cached for the user's runs
# (encoder_jax.train.flops.cpu_peak); the suite states one instead, so that a figure measured
# while the tests load both cores never becomes that cached peak. Tests of the cache unset it.
os.environ.setdefault("ENCODER_JAX_CPU_PEAK", "1e11")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_sessionstart(session):
  """Prunes the suite's compilation cache (the folder chosen above, not one a user set) to half
  of CACHE_LIMIT when it has grown past it, oldest entries first, once per run. Not JAX's own
  limit (jax_compilation_cache_max_size): that one scans and stats the whole folder on every
  write, and the suite's ~3,400 programs then took minutes more to cache than to compile."""
  if hasattr(session.config, "workerinput") or os.environ["JAX_COMPILATION_CACHE_DIR"] != CACHE_DIR:
    return  # (an xdist worker: the controller prunes)
  files = [(st.st_mtime, st.st_size, f) for f in pathlib.Path(CACHE_DIR).glob("*")
           if f.is_file() and (st := f.stat())]
  total = sum(size for _, size, _ in files)
  if total > CACHE_LIMIT:
    for _, size, f in sorted(files):
      if total <= CACHE_LIMIT // 2:
        break
      f.unlink(missing_ok=True)
      total -= size


def pytest_xdist_auto_num_workers(config):
  """`-n auto`: one worker per core, at most 4. Each worker holds its own JAX runtime and
  compiled programs (up to ~3 GiB at the largest tests), so more workers than that only add
  memory pressure; XLA compilation, most of the suite's time, is single-threaded."""
  del config
  return max(1, min(os.cpu_count() or 1, 4))


def pytest_collection_modifyitems(config, items):
  """Files with `slow` tests run first, then the rest from the largest file down. Workers take
  whole files (`--dist loadfile`) in this order (pytest.ini turns off xdist's own reorder,
  which sorts files by test count alone and so left the few-but-long learnability files for
  last, one worker running them alone for minutes): the long files start while the short
  ones fill the other worker. Tests keep their order inside a file."""
  del config
  files: dict[str, list] = {}
  for item in items:
    files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
  order = sorted(files.values(), key=lambda tests: (
      not any(t.get_closest_marker("slow") for t in tests), -len(tests)))
  items[:] = [t for tests in order for t in tests]


def _jit_with(options: dict):
  """jax.jit patched, for the test's duration, to compile with XLA `options` (a per-program
  option overrides XLA_FLAGS). Only for tests whose jits are top-level: JAX refuses
  compiler_options on a nested jit."""
  real = jax.jit

  def jit(fun=None, /, **kwargs):
    kwargs.setdefault("compiler_options", options)
    return real(fun, **kwargs) if fun is not None else functools.partial(jit, **kwargs)

  with pytest.MonkeyPatch.context() as m:
    m.setattr(jax, "jit", jit)
    yield


@pytest.fixture
def fusion_emitters():
  """XLA:CPU's newer fusion emitters, which the suite turns off (see above): for a test that
  compares two different programs to the last bits, which the rounding of the older emitters
  does not meet (optax.MultiSteps' update against the branching step: up to 6e-6 apart after
  Adam magnifies a near-zero gradient's last bits, where the newer emitters give 1e-7)."""
  yield from _jit_with({"xla_cpu_use_fusion_emitters": True})


@pytest.fixture
def full_xla_optimization():
  """XLA optimisation level 2 instead of the suite's level 0: for the tests that train for
  hundreds of steps, where running the step costs more than compiling it (a whole 800-step
  run of the 64-wide model, measured: 94 s at level 0, 50 s at level 3). Level 2, not XLA's
  default 3: test_rtd_learns.py + test_learns_context.py, cold, took 311 CPU seconds instead
  of 363 (compiling faster, running as fast). With the newer fusion emitters (at level 3 the
  older ones took test_rtd_learns.py's compiles from 133 s to 353 s)."""
  yield from _jit_with({"xla_backend_optimization_level": 2,
                        "xla_cpu_use_fusion_emitters": True})


def pytest_addoption(parser):
  parser.addoption(
      "--compile-report", metavar="PATH", default="",
      help="Write PATH (tab-separated, largest first): per test file, the seconds XLA spent "
           "compiling in the test processes and how many programs it compiled, then the same "
           "per jitted function name. Run it with the compilation cache empty "
           "(JAX_COMPILATION_CACHE_DIR=<an empty folder>) to see where a cold run's time "
           "goes; programs compiled by subprocesses the tests start are not counted.")


_COMPILES: dict[tuple[str, str], list] = {}  # (test file, function name) -> [seconds, count]


def pytest_configure(config):
  if not config.getoption("--compile-report"):
    return
  current = {"file": "(collection)"}
  config._compile_report_current = current

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      acc = _COMPILES.setdefault((current["file"], kwargs.get("fun_name", "?")), [0.0, 0])
      acc[0] += duration
      acc[1] += 1
  jax.monitoring.register_event_duration_secs_listener(listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  current = getattr(item.config, "_compile_report_current", None)
  if current is not None:
    current["file"] = item.nodeid.split("::", 1)[0]
  yield


def pytest_sessionfinish(session):
  path = session.config.getoption("--compile-report")
  if not path:
    return
  import json
  worker = getattr(session.config, "workerinput", {}).get("workerid")
  if worker is not None:  # an xdist worker: its share, merged by the controller
    pathlib.Path(f"{path}.{worker}").write_text(json.dumps(
        [[f, name, s, n] for (f, name), (s, n) in _COMPILES.items()]))
    return
  rows = [[f, name, s, n] for (f, name), (s, n) in _COMPILES.items()]
  for part in pathlib.Path(path).parent.glob(pathlib.Path(path).name + ".gw*"):
    rows += json.loads(part.read_text())
    part.unlink()
  lines = []
  for title, key in (("test file", 0), ("jitted function", 1)):
    total: dict[str, list] = {}
    for row in rows:
      acc = total.setdefault(row[key], [0.0, 0])
      acc[0] += row[2]
      acc[1] += row[3]
    lines += [f"compile_s\tprograms\t{title}"]
    lines += [f"{s:.1f}\t{n}\t{k}" for k, (s, n) in sorted(total.items(), key=lambda x: -x[1][0])]
    lines.append("")
  pathlib.Path(path).write_text("\n".join(lines))
