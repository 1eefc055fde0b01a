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
  * The terminal shows the command's own lines: what it prints, the INFO messages of
    encoder_jax / experiments (plain, without absl's prefix) and every library's warnings.
    Every library's INFO (TFDS, Orbax, absl, ...) goes to a log file only,
    <cache>/logs/<command>-<date>-<time>-<pid>.log, whose path the first line names. Progress
    bars (tqdm, which TFDS uses) are off where stderr is not a terminal, so a redirected log
    holds no escape codes.
  * `--help` (and -h, --helpshort, --helpfull) print the flags and exit 0.
  * A command with a --workdir refuses one that is a file, and a start that fails with a user
    error leaves no workdir it created behind (nothing else was in it).
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


def _report(e: BaseException, verbose: bool, code: int, prefix: str = "",
            cause: BaseException | None = None) -> None:
  if verbose:
    traceback.print_exception(cause or e)
  _remove_created_workdir()
  print(f"error: {prefix}{message(e)}", file=sys.stderr)
  if not verbose:
    print(_HINT, file=sys.stderr)
  _exit(code)


_HELP_FLAGS = ("-h", "-help", "--help", "-?", "--helpshort", "-helpshort", "--helpfull",
               "-helpfull", "--helpxml", "-helpxml")


def _config_keys_message(flag: str, argv) -> str | None:
  """For `--<config flag>.a.b=v` naming a key the config lacks: which keys that level has.
  None when the config cannot be loaded or the level is not found."""
  name, _, dotted = flag.lstrip("-").split("=", 1)[0].partition(".")
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)
  if spec is None or not dotted:
    return None
  try:
    import importlib.util  # pylint: disable=g-import-not-at-top
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("_encoder_jax_config_keys", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    node = module.get_config(arg) if arg else module.get_config()
    *parents, leaf = dotted.split(".")
    for i, key in enumerate(parents):
      if key not in node:
        where = ".".join(parents[:i]) or "the config"
        return f"{where} has no key {key!r}; its keys: {', '.join(sorted(node.keys()))}"
      node = node[key]
    if leaf in node:
      return None
    where = ".".join(parents) or "the config"
    return f"{where} has no key {leaf!r}; its keys: {', '.join(sorted(node.keys()))}"
  except Exception:  # pylint: disable=broad-except  (only a better message is lost)
    return None


def _parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except SystemExit:
    # absl's --help prints the usage and exits 1; asking for help is not an error.
    if any(a.split("=")[0] in _HELP_FLAGS for a in argv[1:]):
      _exit(0)
    raise
  except Exception as e:  # pylint: disable=broad-except
    # flags.Error for --x=bad; config_flags raises KeyError/AttributeError/ValueError for a
    # bad --config.a.b or a config file whose get_config() refuses its argument.
    key = re.search(r"'(\w+)'", message(e))
    culprit = [a for a in argv[1:] if key and f".{key.group(1)}" in a.split("=")[0]]
    text = None
    if culprit and isinstance(e, (KeyError, AttributeError)) and "Did you mean" not in str(e):
      text = _config_keys_message(culprit[0], argv)
    prefix = f"bad flag {culprit[0]}: " if culprit else "bad flag: "
    if text is not None:
      _report(ValueError(text), _verbose(argv), 2, prefix=prefix, cause=e)
    _report(e, _verbose(argv), 2, prefix=prefix)


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


class _OwnInfo(py_logging.Filter):
  """The INFO (and DEBUG) records of encoder_jax and experiments: the command's own progress."""

  def filter(self, record):
    own = any(f"{os.sep}{pkg}{os.sep}" in record.pathname for pkg in ("encoder_jax", "experiments"))
    return own and record.levelno < py_logging.WARNING


class _AtLeast(py_logging.Filter):
  def __init__(self, level: int):
    super().__init__()
    self.level = level

  def filter(self, record):
    return record.levelno >= self.level


def log_file_path(name: str):
  """Where this process's full log goes: <cache>/logs/<name>-<date>-<time>-<pid>.log."""
  import time  # pylint: disable=g-import-not-at-top
  from encoder_jax.data.fetch import cache_root  # pylint: disable=g-import-not-at-top
  stamp = time.strftime("%Y%m%d-%H%M%S")
  return cache_root() / "logs" / f"{name}-{stamp}-{os.getpid()}.log"


def route_logs(name: str):
  """The terminal gets warnings and the command's own INFO lines; a file gets every INFO.

  absl's handler (on the root logger, absl's prefixed format) is kept for warnings and errors;
  a plain stderr handler shows encoder_jax's and experiments' own INFO messages; a file handler
  (created at the first record) takes every record at INFO and above, in absl's format.
  Returns the log file's path."""
  path = log_file_path(name)
  absl_handler = logging.get_absl_handler()
  absl_handler.addFilter(_AtLeast(py_logging.WARNING))
  own = py_logging.StreamHandler(sys.stderr)
  own.addFilter(_OwnInfo())
  own.setFormatter(py_logging.Formatter("%(message)s"))
  root = py_logging.getLogger()
  root.addHandler(own)
  path.parent.mkdir(parents=True, exist_ok=True)
  to_file = py_logging.FileHandler(path, delay=True, encoding="utf-8")
  to_file.setFormatter(logging.PythonFormatter())
  root.addHandler(to_file)
  if not sys.stderr.isatty():
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm reads it as its `disable` default
  return path


_created_workdir = None  # a --workdir this command created: removed if a start fails empty


def _check_workdir() -> None:
  """--workdir, where the command has one: refuse a file; remember whether it existed."""
  global _created_workdir
  if "workdir" not in flags.FLAGS or not flags.FLAGS.workdir:
    return
  workdir = flags.FLAGS.workdir
  if "://" in workdir:
    return
  if os.path.isfile(workdir):
    raise app.UsageError(f"--workdir={workdir} is a file; give a folder (created if absent), "
                         "e.g. --workdir=runs/my_run")
  if not os.path.exists(workdir):
    _created_workdir = os.path.abspath(workdir)


def _remove_created_workdir() -> None:
  """After a failed start: the workdir this command created, if it holds no file."""
  if _created_workdir is None or not os.path.isdir(_created_workdir):
    return
  if any(files for _, _, files in os.walk(_created_workdir)):
    return
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(_created_workdir, ignore_errors=True)


def enable_compilation_cache() -> None:
  """XLA's persistent compilation cache under the encoder_jax cache (before JAX is imported)."""
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    from encoder_jax.data.fetch import cache_root  # pylint: disable=g-import-not-at-top
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache_root() / "xla")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))


def run(main: Callable[[list[str]], None], name: str) -> None:
  """absl's app.run(main) with the start, stop and error behaviour of the module docstring."""
  signal.signal(signal.SIGTERM, _raise_preempted)
  log_path = route_logs(name)
  # On stderr, like the error lines: stdout stays the command's output (e.g. --report tables).
  home = os.path.expanduser("~")
  shown = "~" + str(log_path)[len(home):] if str(log_path).startswith(home + os.sep) else log_path
  print(f"{name}: starting (importing JAX, reading the flags; library logs: {shown}) ...",
        file=sys.stderr, flush=True)
  verbose = _verbose(sys.argv)
  if not verbose:
    logging.get_absl_logger().addFilter(_HideOrbaxTracebacks())
  enable_compilation_cache()

  def checked_main(argv):
    if not any(a.startswith(("--verbosity", "-v=")) for a in argv):
      logging.set_verbosity(logging.INFO)  # (the terminal still sees only route_logs' share)
    try:
      _check_workdir()
      main(argv)
    except Preempted:
      raise
    except Exception as e:  # pylint: disable=broad-except
      if not isinstance(e, _user_errors()):
        _remove_created_workdir()
        raise
      _report(e, verbose, 2 if isinstance(e, app.UsageError) else 1)

  try:
    app.run(checked_main, flags_parser=_parse_flags)
  except Preempted:
    print(f"{name}: SIGTERM outside the training loop; stopped with nothing left "
          "half-written (a restart begins or resumes as usual)", file=sys.stderr, flush=True)
    _exit(0)
