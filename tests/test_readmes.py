"""The READMEs are executable: every command of README.md's and launch/README.md's bash blocks
runs here, as its block shows it, and prints what the README says it prints.

How a block is run (`run_block`): its commands in order, as one bash script in the repo (so a
variable a line sets is seen by the next), on a small corpus this test writes: six Moby-Dick
chapters as plain-text files (real prose, several documents), the README's `my_text/`. Paths
the README writes to are moved into a temporary folder (`runs/` -> <tmp>/runs/, `my_text/` ->
<tmp>/my_text/, gs://my-bucket -> a local folder), so a user's own runs are never touched.
Then `RULES` says per command what else this CPU run changes, and nothing else changes:

  * flags appended for speed (a few steps, small batches): the README's own step overrides
    stay on the line, later flags win;
  * a CPU dry run where a command needs a pod, a GPU or the internet, and the README says so
    next to it (e.g. `DRY_RUN=1` for launch/tpu_pod.sh prints each gcloud command; the
    training command it would run on every TPU worker is then run here, on one CPU process);
  * `.ci/run` for the README's test command (CI runs it; a test cannot run its own suite).

A line `#> text` under a command in a README is what that command prints: its output must
contain `text`. Every README command must be claimed by exactly one rule and every rule must
claim a README command, so a command added to a README without a way to check it, or a rule
left behind by a deleted command, fails here.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
from typing import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = ("README.md", "launch/README.md")
CHAPTERS = (1, 2, 3, 4, 5, 6)  # Moby-Dick chapters written as my_text/chapter_<n>.txt


@dataclasses.dataclass
class Command:
  file: str
  block: int  # index of the bash block in its file
  text: str  # the command, continuation lines joined, its trailing comment removed
  comment: str  # that comment
  expect: list[str]  # the `#> ...` lines under it


_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def parse(name: str) -> list[list[Command]]:
  """The bash blocks of README `name`, as lists of commands."""
  blocks = []
  for b, m in enumerate(_BLOCK.finditer((ROOT / name).read_text())):
    commands: list[Command] = []
    logical = re.sub(r"\\\n\s*", " ", m.group(1))
    for line in logical.splitlines():
      stripped = line.strip()
      if stripped.startswith("#>"):
        assert commands, f"{name} block {b}: '#>' before any command"
        commands[-1].expect.append(stripped[2:].strip())
      elif stripped and not stripped.startswith("#"):
        at = re.search(r"\s{2,}#", stripped)  # a comment after a command: two spaces, then #
        text, comment = (stripped[:at.start()], stripped[at.end():]) if at else (stripped, "")
        commands.append(Command(name, b, text.strip(), comment.strip(), []))
    blocks.append(commands)
  return blocks


def all_commands() -> list[Command]:
  return [c for f in FILES for block in parse(f) for c in block]


# ------------------------------------------------------------------------------------ rules


@dataclasses.dataclass(frozen=True)
class Rule:
  """How this test runs the README commands `pattern` matches (re.search on the command)."""
  pattern: str
  why: str  # what the CPU run changes, and why
  append: str = ""  # flags added at the end
  replace: Callable[[str], str] | None = None  # the CPU dry run: the command -> what runs
  in_ci: bool = False  # not run here: .ci/run runs it verbatim
  offline: str = ""  # not run here: it needs what this machine lacks (the README says so)
  timeout: int = 900

  def matches(self, c: Command) -> bool:
    return re.search(self.pattern, c.text) is not None


# A few steps of a small batch, evaluated once on one batch: what every training command gets.
FAST_TRAIN = ("--config.train.steps=4 --config.data.batch_size=8 --config.train.log_every=2 "
              "--config.train.eval_every=4 --config.train.eval_steps=1 "
              "--config.train.checkpoint_every=4")
FAST_FINETUNE = ("--config.max_train_examples=64 --config.max_eval_examples=64 "
                 "--config.epochs=1 --config.log_every=2")


WIKIPEDIA = "tfds:wikipedia/20230601.en:text"
MY_TEXT = "files:my_text/*.txt"


def _pod_train_here(command: str) -> str:
  """launch/tpu_pod.sh train, dry: print the gcloud command, then run the command it would run
  on every worker here (one process on this CPU, the venv's python, --distributed=none), for a
  tiny model and a few steps."""
  command = command.replace("size=base", "size=tiny")
  return (f"DRY_RUN=1 {command} {FAST_TRAIN} > \"$SANDBOX/pod.txt\" && "
          "cat \"$SANDBOX/pod.txt\" && eval \"$(\"$PY\" \"$SANDBOX/remote.py\" "
          "\"$SANDBOX/pod.txt\")\"")


RULES = (
    Rule(r"^bash run\.sh test$", "the suite itself: CI runs it (.ci/run)", in_ci=True),
    Rule(r"^bash run\.sh demo$", "the main job, shortened: 40 pre-training steps, one "
         "fine-tuning seed on the sentiment task",
         append="--config.train.steps=40 --config.train.eval_every=40 "
                "--config.train.checkpoint_every=40 --config.train.eval_steps=4 "
                "--config.train.log_every=20 --seeds=1 --tasks=rotten_tomatoes "
                "--inits=pretrained,random"),
    Rule(r"encoder_jax\.data\.build .*my_text", "as shown"),
    Rule(r"encoder_jax\.main --mode=pretrain .*--workdir=runs/x ", "a few steps",
         append=FAST_TRAIN),
    Rule(r"encoder_jax\.main --mode=pretrain .*--workdir=runs/x_rope_glu ", "a few steps",
         append=FAST_TRAIN),
    Rule(r"encoder_jax\.main --mode=pretrain .*objective=electra", "a few steps",
         append=FAST_TRAIN),
    Rule(r"encoder_jax\.finetune\.main .*init=ckpt:runs/x", "64 training rows, one epoch",
         append=FAST_FINETUNE),
    Rule(r"encoder_jax\.convert\.export --workdir=runs/", "as shown"),
    Rule(r"encoder_jax\.data\.train_vocab --kind=bpe", "as shown"),
    Rule(r"encoder_jax\.main --mode=pretrain .*recipe=roberta", "a few steps", append=FAST_TRAIN),
    Rule(r"^bash run\.sh tb runs$", "started in the background and asked for the run's "
         "curves over HTTP", replace=lambda c: f"{c} > \"$SANDBOX/tb.log\" 2>&1 & server=$!; "
         "\"$PY\" \"$SANDBOX/tb_check.py\" $TB_PORT x; code=$?; kill $server; exit $code"),
    Rule(r"encoder_jax\.main --mode=similarity", "as shown"),
    Rule(r"experiments\.run --grid=(?!all)", "its CPU dry run (--dry_run: a few steps of a "
         "1 x 32 encoder, one fine-tuning seed on 16 rows) of the grid's first point, in one "
         "process (--in_process)",
         replace=lambda c: f"{c} --dry_run --in_process --only={shlex.quote(_first_point(c))} "
                           "--workdir=\"$SANDBOX/grids\" --out=\"$SANDBOX/grid_results\""),
    Rule(r"experiments\.run --grid=all --scale=base --action=plan", "as shown"),
    Rule(r"compile_check --tpu_topology", "the same slice and mesh for a tiny model",
         replace=lambda c: c.replace("size=base", "size=tiny")),
    Rule(r"tpu_aot --rows=ci$", "CI compiles these rows (.ci/run, with --check)",
         in_ci=True),
    Rule(r"tpu_aot (--with_reference )?--update_readme", "its quick version: a tiny BERT on "
         "v5e-4 without the scanned twin and without the peers (the HF peer's own venv), the "
         "table written into a copy of launch/README.md",
         replace=lambda c: c.replace("--with_reference ", "").replace(
             "--update_readme=launch/README.md", "--rows=smoke --noestimate --out=\"$SANDBOX/aot\" "
             "--update_readme=\"$SANDBOX/launch_README.md\"")),
    # launch/README.md: the pod (dry), the corpus on a CPU VM, two local processes
    Rule(r"^export PROJECT=", "as shown (gs://my-bucket is a local folder)"),
    Rule(r"tpu_pod\.sh (create|install|delete)$", "DRY_RUN=1: prints its gcloud commands",
         replace=lambda c: f"DRY_RUN=1 {c}"),
    Rule(r"^pip install 'tensorflow-datasets\[wikipedia\]", "", offline="needs the internet"),
    Rule(r"^tfds build wikipedia", "", offline="needs the internet"),
    Rule(r"encoder_jax\.data\.build .*--source=tfds:wikipedia", "Wikipedia -> my_text/",
         replace=lambda c: c.replace(WIKIPEDIA, MY_TEXT)),
    Rule(r"^DATA=", "Wikipedia -> my_text/", replace=lambda c: c.replace(WIKIPEDIA, MY_TEXT)),
    Rule(r"tpu_pod\.sh train", "DRY_RUN=1, then the workers' command on this CPU: a tiny "
         "model, a few steps", replace=_pod_train_here),
    Rule(r"^for i in 0 1; do .*--distributed=explicit", "a free port; one evaluation batch",
         replace=lambda c: c.replace("127.0.0.1:12355", "127.0.0.1:$PORT2").replace(
             " & done", " --config.train.eval_steps=1 & done")),
)


def _first_point(command: str) -> str:
  """--only's regular expression for the first point of the grid the command names."""
  from experiments import grids  # pylint: disable=g-import-not-at-top
  name = re.search(r"--grid=(\w+)", command).group(1)
  return f"^{re.escape(grids.get_grid(name, 'demo').points[0].name)}$"


def rule_for(c: Command) -> Rule:
  claimed = [r for r in RULES if r.matches(c)]
  assert len(claimed) == 1, (f"{c.file} block {c.block}: {c.text!r} is claimed by "
                             f"{len(claimed)} rules of tests/test_readmes.py (needs exactly 1)")
  return claimed[0]


# ------------------------------------------------------------------------------- the runs


def test_every_command_has_exactly_one_rule_and_every_rule_a_command():
  commands = all_commands()
  assert len(commands) > 10
  for c in commands:
    rule_for(c)
  for r in RULES:
    assert any(r.matches(c) for c in commands), f"rule {r.pattern!r} matches no README command"


def test_commands_not_run_here_say_why_in_the_readme():
  for c in all_commands():
    if rule_for(c).offline:
      assert rule_for(c).offline in c.comment, (
          f"{c.file}: `{c.text}` is not run by the tests ({rule_for(c).offline}); "
          "its line must say so in a comment")


def test_commands_ci_runs_are_in_ci():
  ci = (ROOT / ".ci" / "run").read_text()
  for c in all_commands():
    if rule_for(c).in_ci:
      assert c.text in ci, f"{c.file}: {c.text!r} is said to run in CI but .ci/run lacks it"


TB_CHECK = """
import json, sys, time, urllib.request
port, run = sys.argv[1], sys.argv[2]
deadline, seen = time.time() + 300, "no answer"  # (TensorBoard starts slowly on a busy CPU)
while time.time() < deadline:
  try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags") as r:
      tags = json.load(r)
    seen = sorted(tags)
    if "train/loss" in tags.get(run + "/tensorboard", {}):
      print(f"TensorBoard serves {run}: " + ", ".join(sorted(tags[run + "/tensorboard"])))
      sys.exit(0)
  except OSError as e:
    seen = repr(e)
  time.sleep(0.5)
sys.exit(f"TensorBoard on port {port} never showed {run}'s train/loss (last: {seen})")
"""

# The command a `DRY_RUN=1 launch/tpu_pod.sh train` line would run on every worker, rewritten
# for this CPU: the venv's python, no multi-host discovery.
REMOTE = """
import shlex, sys
line = open(sys.argv[1]).read().strip().splitlines()[-1]
words = shlex.split(line)
remote = next(w for w in words if w.startswith("--command="))[len("--command="):]
remote = remote.replace("cd encoder_jax && .venv/bin/python", sys.executable)
remote = remote.replace("--distributed=auto", "--distributed=none")
print(remote.split(" 2>&1 | tee")[0])
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
  """<tmp>/my_text/chapter_<n>.txt: Moby-Dick chapters (the demo corpus's), one per file."""
  from encoder_jax.data import fetch  # pylint: disable=g-import-not-at-top
  base = tmp_path_factory.mktemp("readme")
  text_dir = base / "my_text"
  text_dir.mkdir()
  folder = fetch.extract_artifact("moby_dick") / "package" / "data"
  for n in CHAPTERS:
    rec = json.loads((folder / f"chapter_{n}.json").read_text())
    (text_dir / f"chapter_{n}.txt").write_text(rec["text"] + "\n")
  (base / "tb_check.py").write_text(TB_CHECK)
  (base / "remote.py").write_text(REMOTE)
  (base / "launch_README.md").write_text((ROOT / "launch" / "README.md").read_text())
  return base


def rewrite(command: str, sandbox: pathlib.Path) -> str:
  """README paths -> the sandbox's (module docstring)."""
  out = re.sub(r"(?<![\w/.$-])runs(?=/|\s|$)", f"{sandbox}/runs", command)
  out = re.sub(r"(?<![\w/.$-])my_text/", f"{sandbox}/my_text/", out)
  return out.replace("gs://my-bucket", f"{sandbox}/bucket")


def script_for(commands: list[Command], sandbox: pathlib.Path, logs: pathlib.Path) -> str:
  lines = ["set -u", f"cd {shlex.quote(str(ROOT))}", f"export SANDBOX={shlex.quote(str(sandbox))}",
           f"export TB_PORT={_free_port()} PORT2={_free_port()}",
           f"export ENCODER_JAX_VENV={shlex.quote(str(pathlib.Path(sys.executable).parents[1]))}",
           f"export DEMO_WORKDIR={shlex.quote(str(sandbox / 'runs' / 'demo'))}",
           f"export PY={shlex.quote(sys.executable)}"]
  for i, c in enumerate(commands):
    rule = rule_for(c)
    if rule.in_ci or rule.offline:
      continue
    command = rule.replace(c.text) if rule.replace else c.text
    command = rewrite(command, sandbox) + (f" {rule.append}" if rule.append else "")
    if re.fullmatch(r"(export\s+)?\w+=\S.*", command) and "bash " not in command:
      lines.append(command)  # an assignment: the block's later lines read it
      continue
    log = shlex.quote(str(logs / f"{i}.log"))
    lines.append(f"timeout {rule.timeout} bash -c {shlex.quote(command)} > {log} 2>&1; "
                 f"echo $? > {shlex.quote(str(logs / f'{i}.rc'))}")
  return "\n".join(lines) + "\n"


def run_block(commands: list[Command], sandbox: pathlib.Path, name: str) -> None:
  logs = sandbox / "logs" / name
  logs.mkdir(parents=True)
  script = script_for(commands, sandbox, logs)
  (logs / "script.sh").write_text(script)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  subprocess.run(["bash", str(logs / "script.sh")], env=env, check=True, timeout=3600)
  for i, c in enumerate(commands):
    rule = rule_for(c)
    if rule.in_ci or rule.offline or not (logs / f"{i}.rc").exists():
      continue
    out = (logs / f"{i}.log").read_text()
    code = int((logs / f"{i}.rc").read_text())
    assert code == 0, f"{c.file}: `{c.text}` exited {code}:\n{out[-3000:]}"
    for want in c.expect:
      assert want in out, f"{c.file}: `{c.text}` did not print {want!r}:\n{out[-3000:]}"
    assert "\x1b[" not in out, f"{c.file}: `{c.text}` wrote terminal escape codes"


_HELP = re.compile(r"`(?:python -m )?((?:encoder_jax|experiments)?[\w.]*\w) --help`")


def help_examples() -> list[str]:
  """The modules of the `... --help` examples the READMEs cite inline, as `python -m` names."""
  found = set()
  for name in FILES:
    for m in _HELP.finditer((ROOT / name).read_text()):
      module = m.group(1)
      if not module.startswith(("encoder_jax", "experiments")):
        module = f"encoder_jax.{module}"
      found.add(module)
  return sorted(found)


def test_the_help_examples_the_readmes_cite_exit_0():
  modules = help_examples()
  assert "encoder_jax.data.build" in modules and "encoder_jax.demo" in modules, modules
  for module in modules:
    got = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and "--" in got.stdout, f"{module} --help:\n{got.stderr[-2000:]}"


def _blocks(name: str) -> list:
  return [pytest.param(b, id=f"{name}:{i}") for i, b in enumerate(parse(name)) if b]


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.parametrize("commands", _blocks("README.md") + _blocks("launch/README.md"))
def test_readme_block_runs_as_shown(sandbox, commands, request):
  run_block(commands, sandbox, re.sub(r"\W+", "_", request.node.callspec.id))
