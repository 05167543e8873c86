"""What sharding a training over devices saves: step time and training state per device on 1, 2 and 4 devices.

    .venv/bin/python benchmarks/scaling.py [--steps 30] [--configs config/cpu/diffeqformer.yaml config/cpu/gpt2.yaml]

Trains each config for ``--steps`` steps (``python -m diffeqformer.train``, in a scratch DIFFEQFORMER_HOME) on 1, 2
and 4 CPU devices of one process (``--xla_force_host_platform_device_count``), Levanter's default mesh (FSDP over
``data``), and as 2 processes of 2 devices each (``trainer.distributed``, over 127.0.0.1). Prints per layout the
median seconds of a training step after the first three (Levanter's ``throughput/duration``: compilation left out)
and the bytes of parameters and optimiser state held by the most loaded device, then both as ratios to one device:
the state shrinks with the devices it is sharded over; the step time on a CPU shows the cost of the collectives
(the devices of one CPU share its cores), which accelerators with their own memory and links do not pay alike.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = (("1 device", 1, 1), ("2 devices", 2, 1), ("4 devices", 4, 1), ("2 processes x 2 devices", 2, 2))
"""(label, devices per process, processes)."""


def worker(config: str, run_dir: str, steps: int, extra: list[str]) -> None:
    """In a training process: train ``config`` for ``steps`` steps into ``run_dir``; print (as ``@state``) the most
    bytes of parameters and optimiser state one of this process's devices holds once the state is built."""
    from diffeqformer import config as configs
    from diffeqformer import devices, train, use_onednn

    use_onednn()  # the kernels of a training process (train.cli), before JAX starts its backend

    fit = train.fit

    def measured_fit(trainer, state, *args, **kwargs):
        held = devices.bytes_per_device((state.model, state.opt_state))
        print(f"@state {max(held.values())}", flush=True)
        return fit(trainer, state, *args, **kwargs)

    train.fit = measured_fit
    overrides = ["--run_dir", run_dir, "--trainer.num_train_steps", str(steps), "--trainer.steps_per_eval",
                 str(steps), "--trainer.max_eval_batches", "1", *extra]
    train.use_compilation_cache()
    train.main(configs.load_config(config, overrides))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(config: str, steps: int, per_process: int, processes: int, scratch: Path) -> tuple[float, int]:
    """(median step seconds, most state bytes on one device) of ``config`` on ``processes`` processes of
    ``per_process`` CPU devices."""
    run_dir = scratch / f"{Path(config).stem}-{per_process}x{processes}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DIFFEQFORMER_HOME": str(scratch), "TOKENIZERS_PARALLELISM": "false",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={per_process}",
           "JAX_COMPILATION_CACHE_DIR": str(scratch / "jax-cache")}
    port = _free_port()
    procs = []
    for k in range(processes):
        extra = [] if processes == 1 else ["--trainer.distributed.coordinator_address", f"127.0.0.1:{port}",
                                           "--trainer.distributed.num_processes", str(processes),
                                           "--trainer.distributed.process_id", str(k)]
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", config, str(run_dir), str(steps),
                                       *extra], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    held = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"error: {config} on {processes} x {per_process} devices failed:\n{err[-3000:]}")
        held += [int(line.split()[1]) for line in out.splitlines() if line.startswith("@state ")]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    durations = [r["throughput/duration"] for r in records if r.get("step") is not None and r["step"] >= 3
                 and "throughput/duration" in r]
    return statistics.median(durations), max(held)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2], int(argv[3]), argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["config/cpu/diffeqformer.yaml", "config/cpu/gpt2.yaml"])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    if args.steps < 5:
        raise SystemExit("error: --steps must be at least 5 (the first three are left out)")
    print(f"{'config':32s} {'layout':26s} {'step s':>8s} {'state/device':>13s} {'step ratio':>11s} "
          f"{'state ratio':>12s}")
    with tempfile.TemporaryDirectory(prefix="diffeqformer-scaling-") as scratch:
        for config in args.configs:
            base = None
            for label, per_process, processes in LAYOUTS:
                step, held = measure(config, args.steps, per_process, processes, Path(scratch))
                base = base or (step, held)
                print(f"{config:32s} {label:26s} {step:8.4f} {held / 2**20:10.2f} MiB {step / base[0]:11.2f} "
                      f"{held / base[1]:12.2f}", flush=True)


if __name__ == "__main__":
    main()
