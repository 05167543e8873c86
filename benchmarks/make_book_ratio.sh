#!/usr/bin/env bash
# `make book` in fresh clones of two commits, one after the other on this machine, and the ratio of their wall times;
# then whether every run that both trained ended with the same losses and perplexities, bit for bit (F6's runs are
# among them):
#
#   bash benchmarks/make_book_ratio.sh BASE [HEAD]     # HEAD: the commit checked out here
#
# Each clone sets itself up (`make book` installs first), so the times include the install. The clones stay in a
# temporary folder, whose path is printed, with each build's log.
set -euo pipefail
base=$(git rev-parse "$1")
head=$(git rev-parse "${2:-HEAD}")
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d "${TMPDIR:-/tmp}/make-book-ratio.XXXXXX")
echo "clones and logs in $work"
for commit in "$base" "$head"; do
  git clone -q --no-local "$repo" "$work/$commit"
  git -C "$work/$commit" checkout -q "$commit"
  start=$(date +%s)
  if ! (cd "$work/$commit" && make book) >"$work/$commit.log" 2>&1; then
    echo "error: make book failed at ${commit:0:12}; the end of $work/$commit.log:" >&2
    tail -n 30 "$work/$commit.log" >&2
    exit 1
  fi
  echo $(($(date +%s) - start)) >"$work/$commit.seconds"
  echo "${commit:0:12}: make book in $(cat "$work/$commit.seconds") s"
done
python3 - "$work/$base" "$work/$head" <<'PY'
import json, sys
from pathlib import Path

base, head = (Path(p) for p in sys.argv[1:])
seconds = [float(Path(f"{p}.seconds").read_text()) for p in (base, head)]
print(f"wall time ratio (head / base): {seconds[1] / seconds[0]:.3f} ({seconds[1]:.0f} s / {seconds[0]:.0f} s)")

def numbers(run: Path) -> list[dict]:
    """Each metrics line's losses and perplexities (no times, no throughputs)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in m.items() if "loss" in k or "perplexity" in k} | {"step": m.get("step")} for m in lines]

trained = [{r.name for r in (p / "runs").iterdir() if (r / "metrics.jsonl").exists()} for p in (base, head)]
both = sorted(trained[0] & trained[1])
differ = [r for r in both if numbers(base / "runs" / r) != numbers(head / "runs" / r)]
print(f"{len(both)} runs trained by both; {len(both) - len(differ)} with the same losses and perplexities bit for bit"
      + (f"; differing: {', '.join(differ)}" if differ else ""))
sys.exit(1 if differ else 0)
PY
