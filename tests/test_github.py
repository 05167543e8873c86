"""The repository's GitHub workflows (``.github/workflows``): actionlint finds nothing wrong in them, every ``make``
target they run is one of the Makefile's, the test workflow runs what ``.ci/run`` runs, and the book workflow
publishes the folder where the workflow builds the cpu preset's book."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from diffeqformer import paths
from diffeqformer.workflow import plan

WORKFLOWS = sorted((paths.REPO / ".github" / "workflows").glob("*.yml"))


def _steps(workflow: Path) -> list[dict]:
    return [step for job in yaml.safe_load(workflow.read_text())["jobs"].values() for step in job.get("steps", [])]


def _make_targets() -> set[str]:
    """The targets the Makefile defines (``name:`` at the start of a line, not a variable's ``:=``)."""
    text = (paths.REPO / "Makefile").read_text()
    return {m[1] for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M)}


def test_actionlint_finds_nothing_wrong():
    exe = Path(sys.executable).with_name("actionlint")
    exe = str(exe) if exe.exists() else shutil.which("actionlint")
    assert exe, "actionlint is not installed: it comes with the test extra (pip install -e '.[test]')"
    assert {w.name for w in WORKFLOWS} >= {"test.yml", "book.yml"}
    out = subprocess.run([exe, "-no-color", *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_make_target_a_workflow_runs_is_the_makefiles():
    targets = _make_targets()
    assert {"test", "book", "setup"} <= targets
    ran = set()
    for workflow in WORKFLOWS:
        for step in _steps(workflow):
            for m in re.finditer(r"\bmake\s+([\w-]+)", step.get("run", "")):
                assert m[1] in targets, f"{workflow.name} runs make {m[1]}, which the Makefile does not define"
                ran.add((workflow.name, m[1]))
    assert {("test.yml", "test"), ("book.yml", "book")} <= ran


def test_the_test_workflow_runs_what_ci_runs():
    ci = (paths.REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, flags=re.M)
    runs = [step["run"].strip() for step in _steps(paths.REPO / ".github" / "workflows" / "test.yml") if "run" in step]
    assert runs == ["make test"]


def test_the_book_workflow_publishes_the_cpu_book(monkeypatch):
    monkeypatch.setattr(paths, "HOME", paths.REPO)
    steps = _steps(paths.REPO / ".github" / "workflows" / "book.yml")
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert paths.REPO / upload["with"]["path"] == plan.folder("cpu") / "html"
    cached = next(s for s in steps if "runs" in s.get("with", {}).get("path", "").split())
    assert {"runs", ".snakemake", "data/cache"} <= set(cached["with"]["path"].split())
