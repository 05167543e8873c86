"""Where the unit tests' time goes: per test file and per test, CPU seconds (the test's process and the processes it
started), XLA compilation in the test's process and wall seconds.

    DIFFEQFORMER_TEST_COSTS=/tmp/costs.jsonl make test      # tests/conftest.py appends a line per test
    python benchmarks/test_costs.py /tmp/costs.jsonl [--top 40]

CPU seconds are the measure to compare between two runs on a shared machine: a test's wall time grows with whatever
else runs beside it (the other pytest worker, other work), its CPU time much less. "compile" is XLA's compilation in
the test's own process; a test that trains in subprocesses shows their whole cost under "children".
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cpu(record: dict) -> float:
    return record["cpu_s"] + record["children_cpu_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("costs", type=Path, help="the JSON-lines file DIFFEQFORMER_TEST_COSTS named")
    parser.add_argument("--top", type=int, default=40, help="how many of the costliest tests to list")
    args = parser.parse_args(argv)
    records = load(args.costs)
    files: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        f = files[r["test"].split("::")[0]]
        f["tests"] += 1
        for key in ("wall_s", "cpu_s", "children_cpu_s", "compile_s", "compiles"):
            f[key] += r[key]
    header = f"{'CPU s':>8s} {'own':>8s} {'children':>9s} {'compile':>8s} {'#comp':>6s} {'wall s':>8s} {'tests':>5s}  "
    print(header + "file")
    for name, f in sorted(files.items(), key=lambda kv: -(kv[1]["cpu_s"] + kv[1]["children_cpu_s"])):
        print(f"{f['cpu_s'] + f['children_cpu_s']:8.1f} {f['cpu_s']:8.1f} {f['children_cpu_s']:9.1f} "
              f"{f['compile_s']:8.1f} {int(f['compiles']):6d} {f['wall_s']:8.1f} {int(f['tests']):5d}  {name}")
    total = {k: sum(f[k] for f in files.values()) for k in ("cpu_s", "children_cpu_s", "compile_s", "wall_s")}
    print(f"{total['cpu_s'] + total['children_cpu_s']:8.1f} {total['cpu_s']:8.1f} {total['children_cpu_s']:9.1f} "
          f"{total['compile_s']:8.1f} {'':6s} {total['wall_s']:8.1f} {len(records):5d}  all")
    # each test process's span: a process that ends long before the others left a core idle (the tail of a run)
    spans: dict[str, list[float]] = {}  # process -> [first start, last end, seconds in its tests]
    for r in records:
        if "worker" in r:
            start = r["end"] - r["wall_s"]
            span = spans.setdefault(r["worker"], [start, r["end"], 0.0])
            span[0], span[1], span[2] = min(span[0], start), max(span[1], r["end"]), span[2] + r["wall_s"]
    if spans:
        first = min(start for start, _, _ in spans.values())
        print(f"\n{'from s':>8s} {'to s':>8s} {'busy s':>8s}  process")
        for worker, (start, end, busy) in sorted(spans.items()):
            print(f"{start - first:8.1f} {end - first:8.1f} {busy:8.1f}  {worker}")
    print(f"\nthe {args.top} costliest tests")
    print(f"{'CPU s':>8s} {'compile':>8s} {'#comp':>6s} {'wall s':>8s}  test")
    for r in sorted(records, key=lambda r: -cpu(r))[: args.top]:
        print(f"{cpu(r):8.1f} {r['compile_s']:8.1f} {r['compiles']:6d} {r['wall_s']:8.1f}  {r['test']}")


if __name__ == "__main__":
    main()
