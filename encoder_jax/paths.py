"""The one path layer: every file a run reads or writes goes through etils.epath.

  workdir = paths.absolute("gs://bucket/runs/x")      # unchanged; a local path made absolute
  paths.write_atomic(workdir / "summary.json", text)   # whole or absent
  with paths.Appender(workdir / "metrics.jsonl") as f: f.write(row)
  files = paths.glob("gs://bucket/corpus/*.txt")       # sorted str paths
  paths.sync("corpus built")                           # a barrier across jax processes

etils.epath is what TFDS and Orbax use too: local paths go to the OS, `gs://` to gcsfs (and
`s3://` to s3fs), so a workdir, a corpus or a TFDS data_dir on a bucket works like a local
folder. What an object store lacks is handled here:

  * no working directory: `absolute` leaves URIs alone (`os.path.abspath("gs://b/x")` is the
    local folder `<cwd>/gs:/b/x`);
  * no rename (gcsfs copies and deletes) but atomic objects: `write_atomic` writes a local file
    under a temporary name and renames it, and writes an object directly;
  * no append: `Appender` appends to a local file, and on a bucket keeps the text and rewrites
    the whole object at each flush (metrics and logs are small);
  * no `**` in a bucket glob (gcsfs would list the whole bucket): `glob` refuses it there;
  * shared writers: Orbax's TensorStore and the other hosts write to the same bucket, so
    gcsfs's folder-listing cache (never expired by default, and consulted by exists() too)
    would miss their files; it is turned off here unless fsspec's config already sets it.
"""
from __future__ import annotations

import os
import posixpath
import re
import time

from etils import epath
import fsspec

# Before etils creates its (cached) gcsfs instance; FSSPEC_GCS_USE_LISTINGS_CACHE overrides.
fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)

PathLike = str | os.PathLike

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_uri(path: PathLike) -> bool:
  """True for `gs://...` and other `scheme://` paths, False for local ones."""
  return bool(_URI.match(os.fspath(path)))


def absolute(path: PathLike) -> epath.Path:
  """The path as epath.Path: a local one with `~` expanded and made absolute, a URI unchanged."""
  if is_uri(path):
    return epath.Path(path)
  return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def split_uri(path: PathLike) -> tuple[str, str]:
  """('gs://', 'bucket/dir/file') or ('', '/local/dir/file')."""
  s = os.fspath(path)
  m = _URI.match(s)
  return (m.group(0), s[m.end():]) if m else ("", s)


def relpath(path: PathLike, start: PathLike) -> str:
  """`path` relative to `start`, both local or both URIs (posix separators on a bucket)."""
  (sa, a), (sb, b) = split_uri(path), split_uri(start)
  if sa != sb:
    raise ValueError(f"{path} and {start} are on different file systems")
  return posixpath.relpath(a, b) if sa else os.path.relpath(a, b)


def commonpath(paths: list[str]) -> str:
  """The deepest folder holding every path (like os.path.commonpath, for URIs too)."""
  schemes = {split_uri(p)[0] for p in paths}
  if len(schemes) > 1:
    raise ValueError(f"paths on different file systems: {sorted(schemes)}")
  scheme = schemes.pop()
  rest = [split_uri(p)[1] for p in paths]
  if len(rest) == 1:
    return scheme + (posixpath if scheme else os.path).dirname(rest[0])
  return scheme + (posixpath if scheme else os.path).commonpath(rest)


def glob(pattern: PathLike) -> list[str]:
  """Sorted paths matching `pattern` (`*`, `?`, `[...]`; `**` locally only), as strings.

  A pattern without wildcards gives itself when it exists, else nothing."""
  scheme, rest = split_uri(pattern)
  if not scheme:
    rest = os.path.abspath(os.path.expanduser(rest))
  parts = rest.split("/")
  first = next((i for i, p in enumerate(parts) if _GLOB_CHARS.search(p)), None)
  if first is None:
    path = epath.Path(scheme + rest)
    return [os.fspath(path)] if path.exists() else []
  if scheme and any("**" in p for p in parts):
    raise ValueError(f"{pattern}: '**' is not supported on {scheme} paths (it would list the "
                     "whole bucket); name the folders, e.g. gs://bucket/corpus/*/*.txt")
  base = scheme + ("/".join(parts[:first]) or "/")
  hidden_ok = parts[-1].startswith(".")  # like the shell and glob.glob: '*' skips dot files
  return sorted(os.fspath(p) for p in epath.Path(base).glob("/".join(parts[first:]))
                if hidden_ok or not p.name.startswith("."))


FOLDER_MARK = ".folder"


def make_folder(path: PathLike) -> epath.Path:
  """mkdir -p. A bucket has no empty folders, and gcsfs will not rename into one that holds
  nothing, so there an empty FOLDER_MARK object makes it exist."""
  path = epath.Path(path)
  if not is_uri(path):
    path.mkdir(parents=True, exist_ok=True)
  elif not path.exists():
    (path / FOLDER_MARK).write_bytes(b"")
  return path


def write_atomic(path: PathLike, data: str | bytes) -> None:
  """Writes `path` so that a reader sees the old content or the new, never a part."""
  path = epath.Path(path)
  if is_uri(path):  # an object is replaced when its upload completes
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    return
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
  tmp.replace(path)


class Appender:
  """A text file written by appending: a local file opened in append mode, or on a bucket the
  whole text rewritten at each flush, at most every `min_interval_s` seconds (close() always
  writes). Lines written are kept on a crash up to the last flush."""

  def __init__(self, path: PathLike, *, min_interval_s: float = 0.0):
    self.path = epath.Path(path)
    self.remote = is_uri(self.path)
    self.min_interval_s = min_interval_s
    self._last = 0.0
    self._dirty = False
    if self.remote:
      self._text = self.path.read_text() if self.path.exists() else ""
      self._file = None
    else:
      self._file = self.path.open("a")

  def write(self, text: str) -> None:
    if self.remote:
      self._text += text
      self._dirty = True
    else:
      self._file.write(text)

  def flush(self, force: bool = False) -> None:
    if not self.remote:
      self._file.flush()
      return
    if self._dirty and (force or time.monotonic() - self._last >= self.min_interval_s):
      self.path.write_text(self._text)
      self._dirty, self._last = False, time.monotonic()

  def close(self) -> None:
    if self.remote:
      self.flush(force=True)
    elif self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self) -> "Appender":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def files_under(folder: PathLike) -> list[str]:
  """Every file below `folder`, as sorted paths relative to it."""
  folder = epath.Path(folder)
  scheme = split_uri(folder)[0]
  out = []
  for root, _, names in folder.walk():
    root = os.fspath(root)
    if scheme and not is_uri(root):  # gcsfs walks without the scheme: 'bucket/dir'
      root = scheme + root
    out += [relpath(posixpath.join(root, n) if scheme else os.path.join(root, n), folder)
            for n in names]
  return sorted(out)


def copy_tree(src: PathLike, dst: PathLike, *, last: tuple[str, ...] = ()) -> list[str]:
  """Copies every file under `src` to the same place under `dst` (any file systems, streamed),
  the files named in `last` after all others; returns the relative paths copied."""
  import shutil  # pylint: disable=g-import-not-at-top
  src, dst = epath.Path(src), epath.Path(dst)
  rels = sorted(files_under(src), key=lambda r: (r in last, r))
  for rel in rels:
    target = dst / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    with (src / rel).open("rb") as r, target.open("wb") as w:
      shutil.copyfileobj(r, w, 16 << 20)
  return rels


def is_primary() -> bool:
  """True in JAX process 0 (the one that writes run-level files), and without jax.distributed."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def sync(name: str) -> None:
  """Waits until every JAX process reaches the barrier `name` (nothing with one process)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)
