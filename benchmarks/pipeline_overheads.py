"""What the pipeline's own machinery costs on this machine (the measured half of two tests of tests/test_pipeline.py,
which check the behaviour: the heap settings reach the child processes; a rerun with nothing to do rewrites nothing).

    python benchmarks/pipeline_overheads.py [--repeats 10]
    python benchmarks/pipeline_overheads.py --cached-rerun [--home /tmp/smoke-home] [--preset smoke]

The first form measures what ``processes.KEPT_HEAP`` (and ``ONE_ARENA``) change: minor page faults per 64 MiB
allocated and freed again, in a fresh Python process under each ``GLIBC_TUNABLES`` (glibc reads them at a process's
start; elsewhere they do nothing). Without the settings glibc maps such a buffer afresh each time and faults every
page in again (64 MiB / 4 KiB = 16,384 faults); with them the freed memory is reused.

The second runs the pipeline as ``make test``'s smoke fixture runs it (``--retrain-stale``, book included), twice in
one DIFFEQFORMER_HOME, and prints each run's seconds: the first trains and executes what is missing (many minutes
from nothing), the second finds everything cached and pays the start-up, the plan (every config parsed and hashed)
and gathering the figures. ``--home`` keeps the runs
for the next measurement (default: a fresh temporary folder, removed afterwards).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diffeqformer import paths
from diffeqformer.pipeline import processes

FAULTS = """\
import resource, sys
repeats = int(sys.argv[1])
for i in range(3): b = bytearray(64 << 20); del b
r = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(repeats): b = bytearray(64 << 20); del b
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r) / repeats)
"""
"""A child process's minor page faults per 64 MiB allocated and freed, after three unmeasured rounds."""


def page_faults(tunables: str, repeats: int) -> float:
    """Minor page faults per 64 MiB allocation in a fresh process started with ``GLIBC_TUNABLES=tunables``."""
    out = subprocess.run([sys.executable, "-c", FAULTS, str(repeats)], capture_output=True, text=True, check=True,
                         env={**os.environ, "GLIBC_TUNABLES": tunables})
    return float(out.stdout)


def heap(repeats: int) -> None:
    libc = " ".join(platform.libc_ver()) or "unknown libc"
    print(f"{platform.machine()}, {os.cpu_count()} cores, {libc}: minor page faults per 64 MiB allocated and freed "
          f"({repeats} times, after 3)")
    kept = processes.keep_heap(None)
    for label, tunables in (("glibc defaults", ""), ("KEPT_HEAP (every process)", kept),
                            ("KEPT_HEAP + ONE_ARENA (pinned workers)", processes.keep_heap(kept, processes.ONE_ARENA))):
        print(f"  {label:40s} {page_faults(tunables, repeats):10,.0f}")


def pipeline_seconds(home: Path, preset: str) -> tuple[float, int]:
    """Seconds and exit code of one pipeline run in ``home``, as tests/smoke_pipeline.py runs it."""
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "diffeqformer.pipeline", "--preset", preset, "--retrain-stale"],
                         env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n", file=sys.stderr)
    return seconds, out.returncode


def cached_rerun(home: Path | None, preset: str) -> None:
    temporary = home is None
    home = Path(tempfile.mkdtemp(prefix="diffeqformer-rerun-")) if temporary else home.resolve()
    try:
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "data").exists():  # the corpus and its caches are inputs: the repository's, shared
            (home / "data").symlink_to(paths.DATA, target_is_directory=True)
        for name in ("first", "second (nothing to do)"):
            seconds, code = pipeline_seconds(home, preset)
            print(f"pipeline --preset {preset}, {name} run: {seconds:.1f} s (exit {code})", flush=True)
            if code != 0:
                sys.exit(code)
    finally:
        if temporary:
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="allocations measured per setting")
    parser.add_argument("--cached-rerun", action="store_true", help="time the pipeline twice in one home instead")
    parser.add_argument("--home", type=Path, help="DIFFEQFORMER_HOME of --cached-rerun (default: a temporary one)")
    parser.add_argument("--preset", default="smoke", help="preset of --cached-rerun")
    args = parser.parse_args()
    if args.cached_rerun:
        cached_rerun(args.home, args.preset)
    else:
        heap(args.repeats)


if __name__ == "__main__":
    main()
