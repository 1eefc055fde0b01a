"""What produced a grid's results: one record per invocation, kept in the results folder.

  provenance.record(out, grid, action="run", scale="demo", workdir=workdir)  # appends one
  provenance.read(out)                     # every record so far, oldest first
  provenance.point_config(records[-1], "objective=mlm,seed=0")  # the point's ConfigDict again

`experiments.run` calls `record` before it runs, plans or reports a grid, so a grid that
resumes over several invocations (a kill, a reboot, a code change in between) keeps one record
for each, in `<out>/provenance.json` (a JSON list, appended to; indented so a commit's diff
shows the new record). A record holds:
  * git: the commit (`git rev-parse HEAD`), whether the tree was dirty, which tracked files
    differed from it and a hash of that diff; "unknown" when git or the repository is not
    there;
  * the date (UTC), the command line and working directory, the action and scale;
  * the grid's name and title, its base pre-training configs (configs/pretrain.py's full
    ConfigDict per pre-training argument, as JSON), each point's overrides, fine-tuning jobs,
    steps and FLOPs, and (runs) each point's state before the invocation (`runner.status`),
    so which invocation ran which point can be read off; the fine-tuning configs
    (configs/finetune.py's full ConfigDict per distinct job);
  * the host (CPU model from /proc/cpuinfo, core counts, NVIDIA GPUs, platform, Python), the
    environment variables that change numerics (JAX_PLATFORMS, XLA_FLAGS, ...) and the
    versions of jax, jaxlib, flax, optax and numpy.
The report (`experiments.report.write_report`) prints the commit and date at the top of
results.md from these records (`summary_lines`); a stand-alone tool's results.md opens
with `produced_by` of its own records (`record_tool`).
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
from typing import Any, Mapping, Sequence

from experiments.grid import Grid, Point

FILENAME = "provenance.json"
REPO = pathlib.Path(__file__).resolve().parents[1]
GIT = "git"  # the executable (tests point it at one that does not exist)
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")
ENV_VARS = ("JAX_PLATFORMS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "TPU_NAME",
            "JAX_ENABLE_X64", "JAX_DEFAULT_MATMUL_PRECISION")
UNKNOWN = "unknown"
# A point not in these states before a `run` invocation was (re)run by it.
_FINISHED = ("done", "diverged")


def _git(repo: os.PathLike | str, *args: str) -> bytes:
  # --no-optional-locks: a query never rewrites the index under a concurrent git user.
  return subprocess.run([GIT, "--no-optional-locks", "-C", str(repo), *args],
                        capture_output=True, check=True, timeout=60).stdout


def git_state(repo: os.PathLike | str = REPO) -> dict[str, Any]:
  """{"commit": HEAD's hash, "dirty": bool, "modified": tracked files that differ from HEAD
  (staged or not), and with a dirty tree "diff_sha256": the hash of `git diff HEAD`}; every
  field "unknown" where git or the repository is missing."""
  try:
    commit = _git(repo, "rev-parse", "HEAD").decode().strip()
    modified = sorted(f for f in _git(repo, "diff", "--name-only", "-z", "HEAD", "--")
                      .decode(errors="replace").split("\0") if f)
    diff = _git(repo, "diff", "--binary", "HEAD", "--") if modified else b""
  except (OSError, subprocess.SubprocessError):
    return {"commit": UNKNOWN, "dirty": UNKNOWN, "modified": UNKNOWN}
  state = {"commit": commit, "dirty": bool(modified), "modified": modified}
  if modified:  # tells two runs from the same dirty tree from runs of different edits
    state["diff_sha256"] = hashlib.sha256(diff).hexdigest()
  return state


_PINNED: dict[str, dict[str, Any]] = {}


def pin_git_state(repo: os.PathLike | str = REPO) -> dict[str, Any]:
  """Records `repo`'s git state now, at a program's start, for every later record of this
  process: the code a long run loaded is the tree's at its start, not at its end (a commit
  made while a grid runs must not be credited with its results)."""
  _PINNED[str(repo)] = git_state(repo)
  return _PINNED[str(repo)]


def process_git_state(repo: os.PathLike | str = REPO) -> dict[str, Any]:
  """The state `pin_git_state` recorded for `repo`, or the current one where none was."""
  return _PINNED.get(str(repo)) or git_state(repo)


def host() -> dict[str, Any]:
  """The CPU model (/proc/cpuinfo's "model name"), logical cores, the cores this process may
  use, the OS and Python."""
  cpu = ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f
                  if line.startswith("model name")), "")
  except OSError:
    pass
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"cpu": cpu or platform.processor() or UNKNOWN, "cores": os.cpu_count(),
          "usable_cores": usable, "gpus": _gpus(), "machine": platform.machine(),
          "platform": platform.platform(), "python": platform.python_version()}


def _gpus() -> list[str]:
  """NVIDIA GPUs by name (nvidia-smi; [] without it). Not through JAX: starting a backend here
  would take GPU memory from the jobs the runner starts."""
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return []
  return [line.strip() for line in out.splitlines() if line.strip()]


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str]:
  out = {}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


def _jsonable(x: Any) -> Any:
  return json.loads(json.dumps(x, default=str))


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _finetune_configs(points: Sequence[Point]) -> tuple[list[dict], dict[tuple, int]]:
  """configs/finetune.py's ConfigDict of every distinct fine-tuning job (what the runner
  builds, runner.finetune_config), with the checkpoint path written as a pattern."""
  from experiments import runner
  configs, index = [], {}
  for p in points:
    for job in p.finetune:
      key = _job_key(job)
      if key in index:
        continue
      config = runner.finetune_config(p, job, "<workdir>")
      config.init = "ckpt:<workdir>/<point>/pretrain/checkpoints"
      index[key] = len(configs)
      configs.append(_jsonable(config.to_dict()))
  return configs, index


def _job_key(job) -> tuple:
  return (job.task, job.seeds, job.run, json.dumps(_jsonable(dict(job.overrides)),
                                                   sort_keys=True))


def in_repo(path: os.PathLike | str, repo: os.PathLike | str = REPO) -> str:
  """`path` relative to the repository when it lies inside it ("." for its root), so committed
  records name no folder of the machine they ran on; other paths as given."""
  text = str(path)
  if not os.path.isabs(text):
    return text
  try:
    return str(pathlib.Path(text).resolve().relative_to(pathlib.Path(repo).resolve()))
  except ValueError:
    return text


def make_record(grid: Grid, *, action: str, scale: str = "", workdir=None, out=None,
                points: Sequence[Point] | None = None, argv: Sequence[str] | None = None,
                repo: os.PathLike | str = REPO) -> dict[str, Any]:
  """One invocation's record (see the module docstring). `points`: the ones this invocation
  works on (--only), default all; `workdir`: where the points run, for their state before it
  (None: not read, e.g. for a plan)."""
  from experiments import runner
  from experiments.grid import resolve_config
  selected = {p.name for p in (points or grid.points)}
  argv = list(sys.argv if argv is None else argv)
  command = argv
  if argv and pathlib.Path(argv[0]).name == "run.py" and pathlib.Path(
      argv[0]).parent.name == "experiments":
    command = ["python", "-m", "experiments.run", *argv[1:]]
  ft_configs, ft_index = _finetune_configs(grid.points)
  rows = []
  for p in grid.points:
    row = {"name": p.name, "labels": dict(p.labels), "pretrain_arg": p.pretrain_arg,
           "overrides": _jsonable(dict(p.overrides)),
           "finetune": [{"task": j.task, "seeds": j.seeds, "run": j.run,
                         "overrides": _jsonable(dict(j.overrides)),
                         "config": ft_index[_job_key(j)]} for j in p.finetune],
           "steps": p.steps, "flops_per_step": p.flops_per_step, "total_flops": p.total_flops,
           "selected": p.name in selected}
    if workdir is not None:
      row["status_before"] = runner.status(workdir, p)
    rows.append(row)
  return {
      "action": action, "date": _now(), "command": shlex.join(command),
      "argv": [in_repo(a, repo) for a in argv], "cwd": in_repo(os.getcwd(), repo),
      "grid": {"name": grid.name, "title": grid.title, "scale": scale,
               "workdir": None if workdir is None else in_repo(workdir, repo),
               "out": None if out is None else in_repo(out, repo)},
      "git": process_git_state(repo), "host": host(), "packages": package_versions(),
      "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
      "pretrain_configs": {arg: _jsonable(resolve_config(arg, {}).to_dict())
                           for arg in dict.fromkeys(p.pretrain_arg for p in grid.points)},
      "finetune_configs": ft_configs,
      "points": rows,
  }


def read(out_dir: os.PathLike | str) -> list[dict[str, Any]]:
  """Every record in <out_dir>/provenance.json, oldest first ([] when there is none)."""
  path = pathlib.Path(out_dir) / FILENAME
  if not path.exists():
    return []
  try:
    records = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e}); nothing was appended. Repair it or move "
                     "it away (it is the record of what produced these results).") from e
  if not isinstance(records, list):
    raise ValueError(f"{path}: expected a JSON list of records, got {type(records).__name__}.")
  return records


def record(out_dir: os.PathLike | str, grid: Grid, **kwargs) -> dict[str, Any]:
  """Appends this invocation's record (make_record's arguments) to <out_dir>/provenance.json,
  creating the folder and file if needed; returns the record. The file is replaced whole
  (written beside it, then renamed), so a kill never leaves half a list."""
  out = pathlib.Path(out_dir)
  return _append(out, make_record(grid, out=out, **kwargs))


def _append(out: pathlib.Path, rec: dict[str, Any]) -> dict[str, Any]:
  """rec added to <out>/provenance.json, which is replaced whole (written beside, renamed)."""
  out.mkdir(parents=True, exist_ok=True)
  records = read(out) + [rec]
  tmp = out / (FILENAME + ".tmp")
  tmp.write_text(json.dumps(records, indent=1) + "\n")
  os.replace(tmp, out / FILENAME)
  return rec


def record_tool(out_dir: os.PathLike | str, module: str, flag_values: Mapping[str, Any],
                minutes: float) -> dict[str, Any]:
  """Appends one invocation of a stand-alone experiment (`python -m <module>`, not a grid) to
  <out_dir>/provenance.json: the command, its flags, the tree the process started from
  (`pin_git_state`), host, package versions and minutes. Returns the record."""
  rec = {"action": module.rsplit(".", 1)[-1], "date": _now(),
         "command": shlex.join(["python", "-m", module, *sys.argv[1:]]),
         "flags": _jsonable(dict(flag_values)), "git": process_git_state(), "host": host(),
         "packages": package_versions(), "minutes": minutes, "cwd": in_repo(os.getcwd())}
  return _append(pathlib.Path(out_dir), rec)


def point_config(rec: Mapping[str, Any], name: str):
  """Point `name`'s pre-training ConfigDict rebuilt from a record alone: its base config with
  its overrides applied (what experiments.grid.resolve_config built when it ran)."""
  import ml_collections
  p = next((p for p in rec["points"] if p["name"] == name), None)
  if p is None:
    raise KeyError(f"no point {name!r} in this record: {[q['name'] for q in rec['points']]}")
  config = ml_collections.ConfigDict(rec["pretrain_configs"][p["pretrain_arg"]])
  for key, value in p["overrides"].items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


def _short(git: Mapping[str, Any]) -> str:
  commit = git.get("commit", UNKNOWN)
  text = f"`{commit[:12]}`" if commit != UNKNOWN else "unknown"
  if git.get("dirty") is True:
    n = len(git.get("modified", []))
    text += f" (tree dirty: {n} tracked file{'s' if n != 1 else ''} modified)"
  elif git.get("dirty") == UNKNOWN:
    text += " (tree state unknown)"
  return text


def _date(rec: Mapping[str, Any]) -> str:
  """'2026-12-04 18:37:10 UTC' from an ISO date (the records' own) or from one written so."""
  date = rec.get("date", UNKNOWN)
  if date.endswith("Z"):  # ISO: 2026-12-04T18:37:10Z
    date = date[:-1].replace("T", " ", 1) + " UTC"
  return date


def planned_line(rec: Mapping[str, Any]) -> str:
  """The line under a plan's title: the commit and date it was computed at."""
  return (f"Planned at commit {_short(rec.get('git', {}))}, {_date(rec)} "
          f"(the grid's configs: {FILENAME}).")


# Grid actions that compute nothing: a results.md is produced by the `run`s of a grid or by a
# stand-alone tool's invocations (record_tool; their action is the tool's name).
_NOT_PRODUCING = ("report", "plan", "launch", "status")


def produced_by(records: Sequence[Mapping[str, Any]]) -> str:
  """The first line of every results.md: the commit and date of the newest invocation that
  produced results (a grid's `run`, a tool's), its command, and every commit the runs span."""
  runs = [r for r in records if r.get("action") not in _NOT_PRODUCING]
  if not runs:
    return ("**Produced by** an unknown commit: no `run` invocation of this grid is recorded "
            f"in {FILENAME} (the report was written from runs already on disk).")
  last = runs[-1]
  commits = list(dict.fromkeys(r.get("git", {}).get("commit", UNKNOWN) for r in runs))
  return (f"**Produced by** commit {_short(last['git'])}, {_date(last)}: "
          f"`{last.get('command', '')}`"
          + (f" (the runs span {len(commits)} commits: "
             + ", ".join(f"`{c[:12]}`" if c != UNKNOWN else "unknown" for c in commits)
             + ")" if len(commits) > 1 else "") + ".")


def summary_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """The head of a grid's results.md: `produced_by`, then one line per recorded invocation."""
  lines = [produced_by(records)]
  if records:
    lines += ["", f"Every invocation ({FILENAME} has each one's full config, host and jax / "
              "flax / optax versions):", "",
              "| date (UTC) | action | commit | points left to run | command |",
              "|---|---|---|---|---|"]
    for r in records:
      pts = r.get("points", [])
      if r.get("action") == "run":
        todo = [p for p in pts if p.get("selected") and p.get("status_before") not in _FINISHED]
        ran = f"{len(todo)} of {len(pts)}"
      else:
        ran = "–"
      command = r.get("command", "").replace("|", "\\|")  # a table cell
      lines.append(f"| {_date(r).replace(' UTC', '')} | {r.get('action', '?')} | "
                   f"{_short(r.get('git', {}))} | {ran} | `{command}` |")
  return lines
