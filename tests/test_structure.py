"""The package's import graph has layers, and nothing imports upward.

paths.py stands alone; model/ and data/ on it; objectives/ builds on model/, and cli.py (how
commands start and report errors) on data/; hf/ (the HF families: HF folders <-> our parameter
trees) on objectives/; train/ on those (its run_dir.py is the one reader of a run folder, its
pretrained.py the one loader of an encoder's parameters from a HF folder or a run, so the
trainer reads init_from itself); convert/ (export of a run as HF folders) and finetune/ on
train/; the entry points (main, demo) on top. A new subpackage or module must be
given a layer here.

Every import counts, `from encoder_jax import paths` and imports inside functions included,
except those under `if __name__ == "__main__":`: that block runs a module as a command, an
entry point above every layer (it starts through encoder_jax.cli).
"""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "encoder_jax"
LAYER = {"paths": 0, "model": 1, "data": 1, "objectives": 2, "cli": 2, "hf": 3, "train": 4,
         "convert": 5, "finetune": 5, "demo": 6, "main": 6}


def _is_main_block(node) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _imported_names(tree: ast.AST):
  """Every module an import of `tree` names, `from a import b` as both a and a.b, skipping
  the `if __name__ == "__main__":` blocks."""
  for node in ast.iter_child_nodes(tree):
    if _is_main_block(node):
      continue
    if isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    yield from _imported_names(node)


def imports() -> list[tuple[str, str, str]]:
  """(importing unit, imported unit, file) for every encoder_jax.* import across units."""
  out = set()
  for f in PACKAGE.rglob("*.py"):
    parts = f.relative_to(PACKAGE).parts
    unit = parts[0] if len(parts) > 1 else f.stem
    if unit == "__init__":
      continue
    for name in _imported_names(ast.parse(f.read_text())):
      if name.startswith("encoder_jax.") and name.split(".")[1] != unit:
        out.add((unit, name.split(".")[1], str(f.relative_to(PACKAGE))))
  return sorted(out)


def test_every_unit_has_a_layer():
  units = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or
           (p.suffix == ".py" and p.stem != "__init__")}
  assert units <= set(LAYER), f"give these a layer in tests/test_structure.py: {units - set(LAYER)}"


def test_nothing_imports_upward_or_sideways():
  found = imports()
  assert ("objectives", "model", "objectives/pretraining.py") in found  # the scan sees imports,
  assert ("train", "paths", "train/loop.py") in found  # `from encoder_jax import paths`,
  assert ("convert", "train", "convert/export.py") in found  # and what a command runs on
  assert not any(b == "cli" for a, b, f in found if f == "convert/export.py")  # (__main__)
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
