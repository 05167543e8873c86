"""memory.measure_training_step's two processes: the second loads the step the first compiled.

    python benchmarks/step_measure.py [--run runs/smoke-diffeqformer] [--batch 4] [--steps 3]

``measure_training_step`` compiles the run's training step in a first fresh process, into a private persistent
compilation cache, and measures it in a second process that loads it. Printed: the first process's compile time
(``first_compile_s``), the second's (``compile_s``: loading from the cache) and their ratio, which is > 1 when the
cache was used; and the measured step time, throughput and memory. This is the wall-clock half of
tests/test_ablations.py's check of the measurement (the unit test checks the figures' consistency, not seconds).
Exits non-zero if the second process took as long to compile as the first.
"""

from __future__ import annotations

import argparse
import sys

from diffeqformer.analysis import memory


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/smoke-diffeqformer", help="a finished run (relative to DIFFEQFORMER_HOME)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    r = memory.measure_training_step(args.run, batch=args.batch, steps=args.steps)
    ratio = r["first_compile_s"] / r["compile_s"]
    print(f"compile, first process: {r['first_compile_s']:.2f} s; second process (from the cache): "
          f"{r['compile_s']:.2f} s; ratio {ratio:.1f}")
    print(f"step {r['step_s'] * 1e3:.1f} ms, {r['tokens_per_second']:.0f} tokens/s, training {r['training_mib']:.0f} "
          f"MiB, compiling {r['compile_mib']:.0f} MiB ({r['backend']})")
    sys.exit(0 if ratio > 1 else 1)


if __name__ == "__main__":
    main()
