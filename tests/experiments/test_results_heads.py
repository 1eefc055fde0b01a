"""Every committed results.md opens with the commit that produced it (a grid's or a stand-alone
tool's), and that commit is one its provenance.json records: a table without its code is a
number nobody can reproduce."""
import pathlib
import re
import subprocess

from experiments import provenance

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "results"
HEAD = re.compile(r"\*\*Produced by\*\* commit `([0-9a-f]{7,40})`")


def test_every_results_md_opens_with_a_recorded_commit():
  found = sorted(RESULTS.glob("*/results.md"))
  assert len(found) >= 10  # the scan sees the committed results
  bad = []
  for md in found:
    head = HEAD.match(md.read_text())
    if head is None:
      bad.append(f"{md.parent.name}: first line {md.read_text().splitlines()[0][:60]!r}")
      continue
    commits = [r.get("git", {}).get("commit", "") for r in provenance.read(md.parent)]
    if commits and not any(c.startswith(head.group(1)) for c in commits):
      bad.append(f"{md.parent.name}: {head.group(1)} is not in its provenance.json {commits}")
  assert not bad, "results.md without its commit first:\n" + "\n".join(bad)


def test_a_tool_s_results_md_opens_with_its_newest_invocation(tmp_path, monkeypatch):
  """A stand-alone tool's records (record_tool) name the commit, as a grid's runs do."""
  monkeypatch.setattr("sys.argv", ["layer_grads.py", "--depths=2"])
  provenance.record_tool(tmp_path, "experiments.layer_grads", {"depths": ["2"]}, 0.5)
  line = provenance.produced_by(provenance.read(tmp_path))
  head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                        cwd=RESULTS).stdout.strip()
  assert HEAD.match(line) and head.startswith(HEAD.match(line).group(1)), line
  assert line.endswith("`python -m experiments.layer_grads --depths=2`.") and " UTC: " in line


def test_committed_records_name_no_folder_of_the_machine():
  """Paths inside the repository are recorded relative to it (provenance.in_repo); no committed
  provenance.json holds an absolute path of the machine that ran it."""
  repo = RESULTS.parents[1]
  assert provenance.in_repo(repo / "experiments" / "runs" / "g", repo) == "experiments/runs/g"
  assert provenance.in_repo(repo, repo) == "." and provenance.in_repo("runs/x", repo) == "runs/x"
  bad = [f"{p.relative_to(RESULTS)}: {m}" for p in sorted(RESULTS.rglob("provenance.json"))
         for m in set(re.findall(r'"(?:cwd|workdir|out)": "(/[^"]*)"', p.read_text()))]
  assert not bad, "absolute paths in committed records:\n" + "\n".join(bad)
