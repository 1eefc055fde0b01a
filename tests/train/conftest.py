"""The trainer tests' shared corpus and compilation cache (tests/train/loop_helpers.py)."""
import jax
import pytest

import loop_helpers


@pytest.fixture(scope="session")
def loop_base(tmp_path_factory):
  """Corpus files, a TFDS data_dir and an XLA cache shared by every trainer run of the session:
  all runs compile the same small programs."""
  return loop_helpers.make_env(tmp_path_factory.mktemp("loop"))


@pytest.fixture(scope="module")
def env(loop_base):
  """The persistent compilation cache on, for the modules that run the trainer only."""
  old = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                             "jax_persistent_cache_min_compile_time_secs")}
  jax.config.update("jax_compilation_cache_dir", loop_base["cache"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  yield loop_base
  for k, v in old.items():
    jax.config.update(k, v)
