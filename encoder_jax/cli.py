"""How encoder_jax's commands start, stop and report errors.

  def main(argv): ...
  if __name__ == "__main__":
    cli.run(main, "encoder_jax.main")

  * The first line is printed before JAX is imported (well within 2 s of the start), saying
    what the command is doing; the trainer then prints each start-up stage.
  * SIGTERM at any point exits 0. Before the training loop takes the signal over (imports,
    corpus build, restore) the work is abandoned with a line saying so: corpus builds and
    checkpoint saves write to temporary names and rename, so nothing is left half-written.
    Inside the loop the trainer saves a checkpoint first (encoder_jax.train.loop).
  * A user error (bad flag or config value, missing path, unusable checkpoint, failed save,
    divergence) prints `error: <message>`, which names the input and the fix, and a hint: no
    traceback, and Orbax's logged tracebacks are hidden too. `--verbose` or
    ENCODER_JAX_VERBOSE=1 shows them. Error exits use os._exit: threads Orbax started for a
    failed save wait forever, and a normal interpreter exit would wait for them (a batch job
    would sit until its wall-clock limit).
  * XLA's persistent compilation cache is on (<cache>/xla, 2 GiB, least recently used out;
    JAX_COMPILATION_CACHE_DIR moves it), so a restarted run skips most of its compile time.
"""
from __future__ import annotations

import logging as py_logging
import os
import re
import signal
import sys
import traceback
from typing import Callable

from absl import app, flags, logging

_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "On errors, print the traceback (and Orbax's error logs) instead of one "
    "line; ENCODER_JAX_VERBOSE=1 does the same.")

_HINT = "(--verbose or ENCODER_JAX_VERBOSE=1 shows the traceback)"


class Preempted(BaseException):
  """SIGTERM before the training loop took the signal over. A BaseException, so library code
  that catches Exception cannot swallow it."""


def _raise_preempted(*_):
  raise Preempted()


def _verbose(argv) -> bool:
  env = os.environ.get("ENCODER_JAX_VERBOSE", "").lower() not in ("", "0", "false")
  return env or any(a in ("--verbose", "--verbose=true", "--verbose=True", "--verbose=1")
                    for a in argv)


def _exit(code: int):
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def message(e: BaseException) -> str:
  """The part of an exception a person needs: at most four lines, no traceback."""
  text = str(e).strip() or type(e).__name__
  if "Error whilst parsing config file" in text:  # ml_collections embeds a traceback: keep
    text = [line for line in text.splitlines() if line.strip()][-1].strip()  # its last line
  if isinstance(e, (KeyError, AttributeError)) and text[:1] == text[-1:] == "'":
    text = text[1:-1]  # config overrides raise KeyError reprs: "'stepz'\nDid you mean ..."
  text = text.replace("\\n", " ").replace("\\'", "'")
  lines = text.splitlines()
  return "\n".join(lines[:4]) + (" ..." if len(lines) > 4 else "")


def _user_errors() -> tuple[type[BaseException], ...]:
  from encoder_jax.data.fetch import FetchError  # pylint: disable=g-import-not-at-top
  return (ValueError, OSError, FloatingPointError, KeyError, FetchError, app.UsageError)


def _report(e: BaseException, verbose: bool, code: int, prefix: str = "") -> None:
  if verbose:
    traceback.print_exception(e)
  print(f"error: {prefix}{message(e)}", file=sys.stderr)
  if not verbose:
    print(_HINT, file=sys.stderr)
  _exit(code)


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    # flags.Error for --x=bad; config_flags raises KeyError/AttributeError/ValueError for a
    # bad --config.a.b or a config file whose get_config() refuses its argument.
    key = re.search(r"'(\w+)'", message(e))
    culprit = [a for a in argv[1:] if key and f".{key.group(1)}" in a.split("=")[0]]
    _report(e, _verbose(argv), 2, prefix=f"bad flag {culprit[0]}: " if culprit else "bad flag: ")


class _HideOrbaxTracebacks(py_logging.Filter):
  """Orbax logs a failed save with full tracebacks from its threads; the command reports the
  error itself in one line."""

  def filter(self, record):
    return not (record.levelno >= py_logging.ERROR and "orbax" in record.pathname)


def loaded_config(name: str = "config"):
  """FLAGS.<name> (an ml_collections config file flag), or a UsageError naming the file when it
  could not be loaded (config_flags defers that error to the first attribute access)."""
  config = flags.FLAGS[name].value
  try:
    if config is not None:
      config.keys()
    return config
  except OSError as e:
    from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
    raise app.UsageError(f"--{name}={config_flags.get_config_filename(flags.FLAGS[name])} could "
                         f"not be loaded: {str(e).strip().splitlines()[-1].strip()}") from e


def enable_compilation_cache() -> None:
  """XLA's persistent compilation cache under the encoder_jax cache (before JAX is imported)."""
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    from encoder_jax.data.fetch import cache_root  # pylint: disable=g-import-not-at-top
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache_root() / "xla")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))


def run(main: Callable[[list[str]], None], name: str) -> None:
  """absl's app.run(main) with the start, stop and error behaviour of the module docstring."""
  signal.signal(signal.SIGTERM, _raise_preempted)
  # On stderr, like the error lines: stdout stays the command's output (e.g. --report tables).
  print(f"{name}: starting (importing JAX, reading the flags) ...", file=sys.stderr, flush=True)
  verbose = _verbose(sys.argv)
  if not verbose:
    logging.get_absl_logger().addFilter(_HideOrbaxTracebacks())
  enable_compilation_cache()

  def checked_main(argv):
    try:
      main(argv)
    except Preempted:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if not isinstance(e, _user_errors()):
        raise
      _report(e, verbose, 2 if isinstance(e, app.UsageError) else 1)

  try:
    app.run(checked_main, flags_parser=_parse_flags)
  except Preempted:
    print(f"{name}: SIGTERM outside the training loop; stopped with nothing left "
          "half-written (a restart begins or resumes as usual)", file=sys.stderr, flush=True)
    _exit(0)
