"""The values two builds of the book glued, compared notebook by notebook: what a reader's numbers and sentences are
in one build and not the other (a refactoring should leave every one the same).

    python benchmarks/glued_diff.py BASE_HOME HEAD_HOME [--preset cpu]

A home is a checkout (or ``DIFFEQFORMER_HOME``) whose ``make book`` finished. Executed notebooks are read from the
Snakemake workflow's folder (``_build/workflow/<preset>/notebooks/``) or, for a checkout from before it, from the
former engine's cache (``_build/pipeline/cache/<notebook>-<key>/notebook.ipynb``, the newest of each notebook).
Prints one line per glued name whose value differs, appears or disappears, and a count; exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diffeqformer.report.book import glued


def executed(home: Path, preset: str) -> dict[str, Path]:
    """Notebook name -> its executed copy in ``home``'s last build of ``preset``."""
    workflow = home / "_build" / "workflow" / preset / "notebooks"
    if workflow.is_dir():
        return {p.stem: p for p in sorted(workflow.glob("*.ipynb"))}
    found: dict[str, Path] = {}
    for p in sorted((home / "_build" / "pipeline" / "cache").glob("*/notebook.ipynb"), key=lambda p: p.stat().st_mtime):
        found[p.parent.name.rsplit("-", 1)[0]] = p  # the newest execution of each notebook
    if not found:
        raise SystemExit(f"error: {home} holds no executed notebooks of preset {preset!r}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("head", type=Path)
    parser.add_argument("--preset", default="cpu")
    args = parser.parse_args()
    base, head = executed(args.base, args.preset), executed(args.head, args.preset)
    differ = 0
    for nb in sorted(set(base) | set(head)):
        if nb not in base or nb not in head:
            print(f"{nb}: executed only in the {'head' if nb in head else 'base'} build")
            differ += 1
            continue
        a, b = (glued(json.loads(p.read_text())) for p in (base[nb], head[nb]))
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                differ += 1
                shown = (f"{side}: {v.get(name, '(not glued)')!s:.300}" for side, v in (("base", a), ("head", b)))
                print(f"{nb}.{name}:", *shown, sep="\n  ")
        print(f"{nb}: {len(a)} glued values in the base build, {len(b)} in the head build", file=sys.stderr)
    print(f"{differ} glued value(s) differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
