"""Kill a training process with SIGKILL at chosen moments, the way a crash, a pre-empted machine or an out-of-memory
killer would, and rerun it: shared by the resume tests of ``train`` and ``finetune``.

The kill points come from a seeded generator. The seed is ``DIFFEQFORMER_KILL_SEED`` if set, else a fresh one; every
failure message names it, so ``DIFFEQFORMER_KILL_SEED=<seed> pytest ...`` replays the same kills."""

import json
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import forked


def kill_seed() -> int:
    return int(os.environ.get("DIFFEQFORMER_KILL_SEED") or random.SystemRandom().randrange(2**31))


def _logged_steps(metrics: Path, offset: int) -> list[int]:
    """Steps with a training loss that this process appended to ``metrics`` (past ``offset`` bytes), complete lines
    only."""
    if not metrics.exists():
        return []
    text = metrics.read_bytes()[offset:].decode(errors="replace")
    steps = []
    for line in text.split("\n")[:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "train/loss" in record and record.get("step") is not None:
            steps.append(int(record["step"]))
    return steps


def _committed(checkpoint: Path) -> bool:
    try:
        return "step" in json.loads((checkpoint / "metadata.json").read_text())
    except (OSError, ValueError):
        return False


class Missed(AssertionError):
    """The run passed the moment an attempt waited for without it being seen (a window of milliseconds, such as a small
    checkpoint being written, on a machine busy with other work)."""


@dataclass
class Kill:
    """Where one attempt was killed: ``what`` in words, and whether the checkpoint it watched was committed then."""

    what: str
    committed: bool | None = None


def run_with_kills(cmd: list[str], env: dict, run_dir: Path, seed: int, *, checkpoint_step: int = 10,
                   num_steps: int = 20, timeout: float = 600.0, tries: int = 3) -> tuple[list[Kill], str]:
    """Run ``cmd`` (a training of ``num_steps`` steps that checkpoints every ``checkpoint_step``) and kill it three
    times: at a random step before the first checkpoint, while that checkpoint is being written (its folder exists,
    its ``metadata.json``, which Levanter writes last, does not), and at a random step between it and the end. Then
    run it to the end. Returns the kills and the last run's standard error. A small checkpoint is written in a few
    milliseconds, which a test process on a busy machine can miss: then the run (and a population's other members,
    ``<run_dir>-seed<k>``) is removed and the same kills are tried again from the start, ``tries`` times in all."""
    for attempt in range(1, tries + 1):
        try:
            return _kills_then_run(cmd, env, run_dir, seed, checkpoint_step, num_steps, timeout)
        except Missed:
            if attempt == tries:
                raise
            for folder in (run_dir, *run_dir.parent.glob(f"{run_dir.name}-seed*")):
                shutil.rmtree(folder, ignore_errors=True)
    raise AssertionError("unreachable")


def _kills_then_run(cmd, env, run_dir: Path, seed: int, checkpoint_step: int, num_steps: int,
                    timeout: float) -> tuple[list[Kill], str]:
    """One try of ``run_with_kills``; ``Missed`` when the run ended before a moment to kill it at was seen."""
    rng = random.Random(seed)
    metrics = run_dir / "metrics.jsonl"
    checkpoint = run_dir / "checkpoints" / f"step-{checkpoint_step}"
    before_first = rng.randint(1, checkpoint_step - 2)
    between = rng.randint(checkpoint_step + 1, num_steps - 2)
    delay = rng.uniform(0.0, 0.003)
    kills: list[Kill] = []

    def attempt(ready, describe):
        offset = metrics.stat().st_size if metrics.exists() else 0
        with forked.start(cmd, env) as proc:  # killed on leaving, if a check below fails
            deadline = time.time() + timeout
            while not ready(offset):
                if proc.poll() is not None:
                    raise (Missed if proc.returncode == 0 else AssertionError)(
                        f"(kill seed {seed}) the run ended before {describe} (exit {proc.returncode}):\n"
                        f"{proc.stderr()[-3000:]}")
                if time.time() > deadline:
                    raise AssertionError(f"(kill seed {seed}) not at {describe} within {timeout} s")
                time.sleep(0.001)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        kills.append(Kill(describe, _committed(checkpoint)))
        assert not (run_dir / "complete.json").exists(), f"(kill seed {seed}) complete.json after a kill"

    attempt(lambda off: max(_logged_steps(metrics, off), default=-1) >= before_first,
            f"step {before_first}, before the first checkpoint")
    attempt(lambda off: checkpoint.is_dir() and not (checkpoint / "metadata.json").exists(),
            f"the step-{checkpoint_step} checkpoint being written")
    attempt(lambda off: max(_logged_steps(metrics, off), default=-1) >= between and _committed(checkpoint),
            f"step {between}, after the step-{checkpoint_step} checkpoint")
    out = forked.run(cmd, env, timeout=timeout)
    assert out.returncode == 0, f"(kill seed {seed}) the last rerun failed:\n{out.stderr[-3000:]}"
    return kills, out.stderr


def check_kills(kills: list[Kill], stderr: str, seed: int, *, resumed_at: int = 11) -> None:
    """Print where the attempts were killed; check that the first was killed before its checkpoint was committed and
    the third after, and that the last rerun resumed at step ``resumed_at``."""
    print(f"kill seed {seed}: " + "; ".join(f"{k.what} (committed: {k.committed})" for k in kills))
    assert kills[0].committed is False and kills[2].committed is True, (seed, kills)
    assert f"resuming from step {resumed_at}" in stderr, (seed, stderr[-2000:])
