"""The book job, ``python -m diffeqformer.workflow.build --preset P --output RECORD``: the book's sources staged
(chapters, the executed notebooks as the reader sees them, the GPU edition, the pages the workflow writes), built by
Jupyter Book with warnings as errors, and every notebook's figures gathered (no figure saved by two notebooks); then
both renamed into the preset's folder."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import paths
from ..report import book as report, verdicts
from . import edition
from .jobs import check_figures, swap_in
from .pages import generated_pages
from .plan import folder, load

BOOK_FILES = ("_config.yml", "_toc.yml")


def stage(preset: str, src: Path, figures: Path) -> None:
    """The book's sources in ``src`` (chapters, ``_config.yml``, ``_toc.yml``, the executed notebooks as the reader
    sees them, the GPU edition, the generated pages) and every notebook's figures in ``figures``."""
    work, made = folder(preset), load(preset)
    for name in BOOK_FILES:
        shutil.copy(paths.REPO / name, src / name)
    shutil.copytree(paths.BOOK, src / "book", ignore=lambda where, names: [
        n for n in names if n in ("_generated", "_build") or (Path(where) == paths.BOOK and (
            n == edition.EDITION.name or n.startswith(f".{edition.EDITION.name}.")))])
    (src / "notebooks").mkdir()
    figures.mkdir()
    saved_by: dict[str, str] = {}
    executed = {job["name"]: json.loads((work / "notebooks" / f"{job['name']}.ipynb").read_text())
                for job in made["notebooks"]}
    here = {nb: report.glued(notebook) for nb, notebook in executed.items()}
    judged = verdicts.holm_verdicts(here)
    for nb, notebook in executed.items():
        view = report.reader_view(notebook, verdicts.opening_markdown(nb, judged, preset))
        (src / "notebooks" / f"{nb}.ipynb").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
        for name in check_figures(work / "notebook-figures" / nb, nb):
            if name in saved_by:
                raise SystemExit(f"error: figure {name!r} is saved by both {saved_by[name]} and {nb}")
            saved_by[name] = nb
        for f in (work / "notebook-figures" / nb).iterdir():
            shutil.copy(f, figures / f.name)
    edition.stage(src)
    generated = src / "book" / "_generated"
    generated.mkdir(parents=True, exist_ok=True)
    for name, text in generated_pages(made, here).items():
        (generated / name).write_text(text)


def jupyter_book(src: Path, out: Path) -> None:
    """``jupyter-book build`` with warnings as errors, nitpicky, into ``out``; the notebooks are not executed. A
    failed build stops the job with each warning and the lines that explain it."""
    exe = Path(sys.executable).with_name("jupyter-book")
    args = ["build", str(src), "--path-output", str(out), "--warningiserror", "--nitpick", "--keep-going", "--quiet"]
    proc = subprocess.run([str(exe) if exe.exists() else "jupyter-book", *args], capture_output=True, text=True,
                          cwd=src)
    if proc.returncode != 0:
        text = (proc.stdout + proc.stderr).strip().splitlines()
        starts = [i for i, line in enumerate(text) if "WARNING" in line or "ERROR" in line]
        shown = []
        for i in starts:  # each warning with the lines after it (an autodoc import error's traceback)
            block = text[i:next((j for j in starts if j > i), len(text))]
            shown += block if len(block) <= 25 else block[:20] + ["    ..."] + block[-5:]
        raise SystemExit("error: the book build failed:\n" + "\n".join((shown or text)[-80:]))


def book(preset: str, output: Path) -> None:
    """Stage, build and gather (``stage``, ``jupyter_book``), then rename the book and the figures into the preset's
    folder (``html/``, ``figures/``) and write the job's record, ``output``."""
    work = folder(preset)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix=".book-", dir=work) as staging:
        staging = Path(staging)
        (staging / "src").mkdir()
        stage(preset, staging / "src", staging / "figures")
        jupyter_book(staging / "src", staging / "out")
        swap_in(staging / "out" / "_build" / "html", work / "html")
        swap_in(staging / "figures", work / "figures")
    paths.write_atomic(output, json.dumps({"preset": preset, "seconds": time.time() - start}) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.build", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    book(args.preset, args.output)
