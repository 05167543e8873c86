"""How fast the online corpora fail without the Hugging Face hub (the wall-clock half of tests/test_data.py's checks).

    python benchmarks/offline.py [--repeats 3]

Two cases, each timed ``--repeats`` times (median and maximum printed, against the bound the workflow relies on):

* offline (``HF_HUB_OFFLINE=1``): ``data.lm_dataset_config`` of wikitext103 and openwebtext must raise
  ``DatasetUnavailableError`` at once, without touching the network (bound: 1 s);
* an unreachable hub (``HF_ENDPOINT`` on the discard port of localhost, nothing listening, offline variables and
  proxies unset): detected within the probe's timeout (bound: ``data.HUB_TIMEOUT_S`` + 1 s).

The unit tests check that both raise; the seconds are measured here, on a machine that is not also running a test
suite. Exits non-zero if a case does not raise or exceeds its bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from diffeqformer.data import corpora as data

NO_HUB = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")


def seconds_to_fail(dataset: str, env: dict[str, str | None]) -> float:
    """Seconds until ``lm_dataset_config(dataset)`` raises ``DatasetUnavailableError`` under ``env`` (None: unset)."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        start = time.perf_counter()
        try:
            data.lm_dataset_config(dataset)
        except data.DatasetUnavailableError:
            return time.perf_counter() - start
        raise SystemExit(f"{dataset}: lm_dataset_config did not raise DatasetUnavailableError")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    unreachable = {**{k: None for k in NO_HUB}, "HF_ENDPOINT": "http://127.0.0.1:9"}  # the discard port
    cases = [(f"offline, {d}", d, {"HF_HUB_OFFLINE": "1"}, 1.0) for d in ("wikitext103", "openwebtext")]
    cases.append(("unreachable hub, wikitext103", "wikitext103", unreachable, data.HUB_TIMEOUT_S + 1.0))
    failed = False
    for name, dataset, env, bound in cases:
        times = [seconds_to_fail(dataset, env) for _ in range(args.repeats)]
        ok = max(times) < bound
        failed |= not ok
        print(f"{name:32s} median {statistics.median(times):.3f} s, max {max(times):.3f} s "
              f"(bound {bound:.1f} s: {'ok' if ok else 'EXCEEDED'})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
