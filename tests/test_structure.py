"""The package's import graph has layers, and nothing imports upward.

model/ and data/ stand alone; objectives/ builds on model/; train/ on those three (its
run_dir.py is the one reader of a run folder); convert/ (HF families, and loading an encoder
from any source: a HF folder or a run) on train/; pretrain.py (loads init_from's sources
through convert/, then runs the trainer) and finetune/ beside each other on convert/; the
entry points (main, demo, cli) on top. A new subpackage or module must be given a layer here.
"""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "encoder_jax"
LAYER = {"model": 0, "data": 0, "paths": 0, "objectives": 1, "train": 2, "convert": 3,
         "finetune": 4, "pretrain": 4, "cli": 5, "demo": 5, "main": 5}


def imports() -> list[tuple[str, str, str]]:
  """(importing unit, imported unit, file) for every encoder_jax.* import across units."""
  out = []
  for f in PACKAGE.rglob("*.py"):
    parts = f.relative_to(PACKAGE).parts
    unit = parts[0] if len(parts) > 1 else f.stem
    if unit == "__init__":
      continue
    for node in ast.walk(ast.parse(f.read_text())):
      names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
               [a.name for a in node.names] if isinstance(node, ast.Import) else [])
      for name in names:
        if name.startswith("encoder_jax.") and name.split(".")[1] != unit:
          out.append((unit, name.split(".")[1], str(f.relative_to(PACKAGE))))
  return out


def test_every_unit_has_a_layer():
  units = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or
           (p.suffix == ".py" and p.stem != "__init__")}
  assert units <= set(LAYER), f"give these a layer in tests/test_structure.py: {units - set(LAYER)}"


def test_nothing_imports_upward_or_sideways():
  found = imports()
  assert ("objectives", "model", "objectives/pretraining.py") in found  # the scan sees imports
  bad = [(a, b, f) for a, b, f in found if LAYER[b] >= LAYER[a]]
  assert not bad, f"imports against the layering (importer, imported, file): {bad}"


def test_finetune_reuses_the_training_machinery():
  """Fine-tuning takes its state, optimizer, mesh and shardings from train/ instead of copies:
  it imports them, and defines none of its own."""
  import re
  used = {(f, b) for a, b, f in imports() if a == "finetune"}
  trainer = "finetune/trainer.py"
  assert (trainer, "train") in used
  text = (PACKAGE / trainer).read_text()
  for name in ("sharding", "step", "build_optimizer"):
    assert re.search(rf"from encoder_jax\.train(\.\w+)? import .*\b{name}\b", text), name
  # the state and the step come from train/step.py (the step body itself: tests/finetune/
  # test_one_step.py records the maker's calls)
  assert "step_lib.TrainState(" in text and "step_lib.make_step(" in text
  for f in (PACKAGE / "finetune").glob("*.py"):
    src = f.read_text()
    assert not re.search(r"^(class TrainState|def (state_shardings|batch_sharding|make_mesh|"
                         r"build_optimizer))\b", src, re.M), f
    assert "Mesh(" not in src and "NamedSharding(mesh, P(" not in src, f
