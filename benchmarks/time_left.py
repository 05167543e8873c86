"""How close the pipeline's time left comes to the truth: run a preset's pipeline, note the time at which each progress
line was printed, and set each line's "about m:ss left" against the time the pipeline then still took.

    python benchmarks/time_left.py --preset smoke [--home DIR] [--again] [--trace FILE]
    python benchmarks/time_left.py --replay tests/time_left_smoke.json

The first run starts from a fresh ``DIFFEQFORMER_HOME`` (a temporary folder, or ``--home``, emptied first; the
offline corpus's archive is copied in): nothing is measured there yet, so the estimate is learned while the pipeline
works. ``--again`` then deletes the runs, the executed notebooks, the figures and the book, keeps the pipeline's
``state.json`` (what the first run measured), and runs it once more: the estimate then starts from those timings.
For each run it prints every estimate beside the truth, and the error at the first line past a quarter, a half and
three quarters of the run. ``--trace`` writes what the first run did (each unit's and notebook's start and end, the
steps each run logged, the plan's costs) as JSON.

``--reference HOME`` trains nothing: it writes what a fresh build of the preset measured in ``HOME`` (its
``state.json``) as ``config/<preset>/notebook_seconds.json``, from which a build prices the notebooks it has not run
yet (``pipeline.progress.REFERENCE``).

``--replay`` trains nothing: it takes such a trace and computes, with the estimate of this checkout, the time left at
each moment a progress line was printed (each unit's and notebook's start) and at a quarter, a half and three
quarters of the recorded pipeline, against the time it then still took; ``tests/test_progress.py`` replays the same
trace (``replay``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EPOCH = 1.7e9
"""A trace's times are seconds since its pipeline's start; a replay puts that start here."""

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
LEFT = re.compile(r"\(([\d:]+) elapsed, (?:about ([\d:]+) left|estimating the time left)\)$")


def seconds(clock: str) -> float:
    """``m:ss`` or ``h:mm:ss`` as seconds."""
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return float(total)


def run_pipeline(preset: str, home: Path) -> tuple[float, list[tuple[float, str]]]:
    """Run the pipeline in a child process; (its wall time, each line it printed with the time since its start)."""
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "diffeqformer.pipeline", "--preset", preset], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append((time.time() - start, line.rstrip("\n")))
        print(line, end="", flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"the pipeline failed (exit {proc.returncode})")
    return time.time() - start, lines


def report(title: str, wall: float, lines: list[tuple[float, str]]) -> list[dict]:
    """Print each estimate against the truth, and the errors at the quarter points; return the rows."""
    rows = []
    for at, line in lines:
        m = LINE.match(line)
        left = LEFT.search(line) if m else None
        if left:
            estimate = seconds(left.group(2)) if left.group(2) else None
            rows.append({"at": at, "estimate": estimate, "truth": wall - at})
    print_rows(title, wall, rows)
    return rows


def print_rows(title: str, wall: float, rows: list[dict]) -> None:
    """Each estimate (``at``: seconds since the start, ``estimate``: None while estimating, ``truth``) with its error,
    and the error at the first estimate past a quarter, a half and three quarters of the run."""
    print(f"\n{title}: the pipeline took {wall:.0f} s (process start to end)")
    print("  at (s)   estimate (s)   truth (s)   error")
    for r in rows:
        error = "" if r["estimate"] is None else f"{(r['estimate'] - r['truth']) / r['truth']:+.0%}"
        estimate = "estimating" if r["estimate"] is None else f"{r['estimate']:.0f}"
        print(f"  {r['at']:6.0f}   {estimate:>12}   {r['truth']:9.0f}   {error}")
    for share in (0.25, 0.5, 0.75):
        r = next((r for r in rows if r["at"] >= share * wall), None)
        if r is None:
            continue
        if r["estimate"] is None:
            print(f"  first line past {share:.0%} of the run (at {r['at']:.0f} s): still estimating")
        else:
            print(f"  first line past {share:.0%} of the run (at {r['at']:.0f} s): estimate {r['estimate']:.0f} s, "
                  f"truth {r['truth']:.0f} s: {(r['estimate'] - r['truth']) / r['truth']:+.0%}")


def trace(preset: str, home: Path, wall: float, lines: list[tuple[float, str]], start_epoch: float) -> dict:
    """What the run did, for ``tests/test_progress.py`` to replay: the plan's units (members with key, hash, steps,
    FLOPs a step, pretrainings) and notebooks, each with its start and end, each unit's logged steps (time since the
    pipeline's start), the lanes, the book's time and the pipeline's."""
    os.environ["DIFFEQFORMER_HOME"] = str(home)
    from diffeqformer import runs
    from diffeqformer.pipeline import lanes, planning, progress

    result = planning.plan(preset)
    begun, ended = {}, {}
    for at, line in lines:
        m = LINE.match(line)
        if not m:
            continue
        i, what = int(m.group(1)) - 1, m.group(3)
        if what.startswith("done in"):
            ended[i] = at
        elif i not in begun:
            begun[i] = at
    groups: dict = {}
    for i, t in enumerate(result.trainings):
        groups.setdefault(t.population_key or ("alone", t.config), []).append(i)
    units = []
    for members in groups.values():
        first = result.trainings[members[0]]
        since = start_epoch + min(begun[i] for i in members)
        logged = []
        for line in runs.metrics_file(first.run_dir).read_text().splitlines():
            record = progress.parse_record(line)
            if record and record["time"] >= since:
                logged.append([record["step"], round(record["time"] - start_epoch, 3)])
        units.append({"members": [{"key": result.trainings[i].config, "hash": result.trainings[i].config_hash,
                                   "steps": result.trainings[i].steps, "flops": result.trainings[i].flops,
                                   "after": list(result.trainings[i].after)} for i in members],
                      "begin": min(begun[i] for i in members), "end": max(ended[i] for i in members),
                      "logged": logged})
    offset = len(result.trainings)
    notebooks = [{"name": j.name, "runs": j.runs, "begin": begun[offset + k], "end": ended[offset + k],
                  "alone": j.name in lanes.runs_alone(preset)} for k, j in enumerate(result.notebooks)]
    book = len(result.trainings) + len(result.notebooks)
    return {"preset": preset, "lanes": lanes.TRAIN_LANES, "wall": wall, "units": units, "notebooks": notebooks,
            "book": ended[book] - begun[book]}


def replay_units(trace: dict, root: Path) -> list:
    from diffeqformer.pipeline.planning import Training

    units = []
    for u in trace["units"]:
        members = []
        for m in u["members"]:
            run_dir = root / re.sub(r"\W+", "_", m["key"])
            members.append(Training(m["key"], root / "config.yaml", m["key"], run_dir, m["hash"], False,
                                    after=tuple(m["after"]), steps=m["steps"], flops=m["flops"]))
        units.append(members)
    return units


def replay(trace: dict, at: float, root: Path, timings: dict | None = None) -> float | None:
    """The pipeline's time left at ``at`` seconds into the pipeline of ``trace``, as its progress line computes it
    (the lanes' schedule played forward, then the book), from ``timings`` of an earlier build (default: none): the
    runs' logs as they then stood are written below ``root``, ``Costs`` is told what had finished, and the schedule
    holds what was running and what was still to do."""
    from diffeqformer.pipeline import lanes, progress
    from diffeqformer.pipeline.planning import NotebookJob

    costs = progress.Costs(trace["preset"], json.loads(json.dumps(timings)) if timings else None)
    units = replay_units(trace, root)
    jobs = [NotebookJob(n["name"], root / f"{n['name']}.ipynb", {}, n["runs"], key="replayed")
            for n in trace["notebooks"]]
    for unit, u in zip(units, trace["units"]):
        unit[0].run_dir.mkdir(parents=True, exist_ok=True)
        (unit[0].run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": step, "time": EPOCH + t}) + "\n" for step, t in u["logged"] if t <= at))
    done = sorted((u["end"], k) for k, u in enumerate(trace["units"]) if u["end"] <= at)
    for end, k in done:
        costs.began(units[k], EPOCH + trace["units"][k]["begin"])
        costs.ended(units[k], EPOCH + end)
    for job, n in zip(jobs, trace["notebooks"]):
        if n["end"] <= at:
            costs.notebook_done(job, n["end"] - n["begin"])
    offset = sum(len(unit) for unit in units)
    pending_units = [unit for unit, u in zip(units, trace["units"]) if u["begin"] > at]
    pending_notebooks = [(offset + k, job) for k, (job, n) in enumerate(zip(jobs, trace["notebooks"]))
                         if n["begin"] > at]
    finished = {t.config for _, k in done for t in units[k]}
    alone = frozenset(n["name"] for n in trace["notebooks"] if n["alone"])
    schedule = lanes._Schedule(pending_units, pending_notebooks, finished, alone)
    for unit, u in zip(units, trace["units"]):
        if u["begin"] <= at < u["end"]:
            costs.began(unit, EPOCH + u["begin"])
            schedule.begun[id(unit)] = unit, EPOCH + u["begin"]
    for k, (job, n) in enumerate(zip(jobs, trace["notebooks"])):
        if n["begin"] <= at < n["end"]:
            item = (offset + k, job)
            schedule.begun[id(item)] = item, EPOCH + n["begin"]
            schedule.running_alone |= n["alone"]
    schedule.running = len(schedule.begun)
    left = schedule.time_left(costs, trace["lanes"], EPOCH + at)
    return None if left is None else left + costs.book_seconds()


def replay_report(path: Path) -> None:
    """Print the replayed estimates of the trace at ``path`` against the truth (``--replay``): at each moment a
    progress line was printed (a unit or a notebook began), then at exactly a quarter, a half and three quarters."""
    recorded = json.loads(path.read_text())
    wall = recorded["wall"]
    moments = sorted({u["begin"] for u in recorded["units"]} | {n["begin"] for n in recorded["notebooks"]})
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"at": at, "estimate": replay(recorded, at, Path(tmp) / str(k)), "truth": wall - at}
                for k, at in enumerate(moments)]
        quarters = [{"at": share * wall, "estimate": replay(recorded, share * wall, Path(tmp) / f"q{share}"),
                     "truth": (1 - share) * wall} for share in (0.25, 0.5, 0.75)]
    print_rows(f"replay of {path} ({recorded['preset']}, {recorded['lanes']} lanes)", wall, rows)
    print("  at exactly a quarter, a half and three quarters:")
    for r in quarters:
        error = "estimating" if r["estimate"] is None else (
            f"estimate {r['estimate']:.0f} s, truth {r['truth']:.0f} s: "
            f"{(r['estimate'] - r['truth']) / r['truth']:+.0%}")
        print(f"  at {r['at'] / wall:.0%} ({r['at']:.0f} s): {error}")


def write_reference(preset: str, home: Path) -> None:
    """``config/<preset>/notebook_seconds.json`` (``progress.REFERENCE``) from the timings that a fresh build of
    ``preset`` saved in ``home``: each notebook's seconds and the book's, with the machine, the commit and the date
    they were measured at."""
    import platform

    from diffeqformer.pipeline import progress

    timings = json.loads((home / "_build" / "pipeline" / "state.json").read_text())["timings"]
    notebooks = {key.split("/", 1)[1]: round(seconds, 1) for key, seconds in sorted(timings["notebooks"].items())
                 if key.startswith(f"{preset}/")}
    if not notebooks or preset not in timings["book"]:
        raise SystemExit(f"{home} holds no build of the {preset} preset (its notebooks and book measured)")
    # the checkout whose build it was: the one holding home (make test's smoke home), else this one
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=home, capture_output=True, text=True)
    if commit.returncode != 0:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    record = {"preset": preset, "measured": time.strftime("%Y-%m-%d"), "commit": commit.stdout.strip(),
              "machine": f"{models[0] if models else platform.machine()}, {os.cpu_count()} CPU cores, "
                         f"{memory:.0f} GiB",
              "notebooks": notebooks, "book": round(timings["book"][preset], 1)}
    path = REPO / "config" / preset / progress.REFERENCE
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}: {len(notebooks)} notebooks and the book")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--home", type=Path,
                        help="the DIFFEQFORMER_HOME to use (emptied first); default: a temporary one")
    parser.add_argument("--again", action="store_true", help="then run again from the first run's timings")
    parser.add_argument("--trace", type=Path, help="write the first run's trace (JSON) here")
    parser.add_argument("--replay", type=Path, help="train nothing: replay this trace with this checkout's estimate")
    parser.add_argument("--reference", type=Path, metavar="HOME",
                        help="train nothing: write config/<preset>/notebook_seconds.json from what a fresh build of "
                             "the preset measured in HOME (its state.json)")
    args = parser.parse_args()
    if args.replay:
        replay_report(args.replay)
        return
    if args.reference:
        write_reference(args.preset, args.reference)
        return
    home = args.home or Path(tempfile.mkdtemp(prefix="diffeqformer-time-left-"))
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(REPO / "data" / "raw", home / "data" / "raw")
    start_epoch = time.time()
    wall, lines = run_pipeline(args.preset, home)
    report("fresh home", wall, lines)
    if args.trace:
        args.trace.write_text(json.dumps(trace(args.preset, home, wall, lines, start_epoch), indent=1) + "\n")
        print(f"trace written to {args.trace}")
    if args.again:
        for name in ("runs", "figures", "_build/html", "_build/pipeline/cache"):
            shutil.rmtree(home / name, ignore_errors=True)
        wall, lines = run_pipeline(args.preset, home)
        report("again, from the first run's timings", wall, lines)
    if args.home is None:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
