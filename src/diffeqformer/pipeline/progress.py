"""The pipeline's progress line: the step it is at, the time elapsed and the time left, learned from what this machine
measured.

A training costs its start-up (the process, the data, compilation, evaluation and saving: everything but its steps)
plus its steps at the seconds per step it logs (``metrics.jsonl``, one record per step). ``Costs`` prices each piece of
work from what was measured here:

- a run that is training: its own steps so far, extrapolated to its last step;
- a run of a configuration measured before in this ``DIFFEQFORMER_HOME`` (``state.json``'s ``timings``, by config
  hash): what it took then;
- any other run: the start-up measured for the preset's runs (their median) and its steps at their seconds per model
  FLOP (``Training.flops``);
- a notebook: what it took for the same inputs (its cache entry), else the last time this preset executed it here,
  else what it took on the machine of the preset's reference (``config/<preset>/notebook_seconds.json``, written by
  ``benchmarks/time_left.py --reference``) times how much slower this machine is (its notebooks measured so far
  against theirs there), else the median of this pipeline's notebooks so far and a guess (``GUESS_SECONDS``); the
  book likewise.

The lanes' schedule is then played forward with these costs (``lanes._Schedule.time_left``). Until a run of the
preset has logged a few steps here, nothing says what a training costs on this machine, and the line says
"estimating" instead of a time.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .. import runs

if TYPE_CHECKING:
    from .planning import NotebookJob, Training

REFERENCE = "notebook_seconds.json"
"""Below ``config/<preset>/``: what a fresh build of the preset measured on one machine (each notebook's seconds, the
book's), which prices the notebooks of a build that has not run them here yet: notebooks differ twentyfold (the cpu
preset's F6 22 s, F3 614 s), so that no typical notebook prices them all."""


def reference(preset: str) -> dict:
    """The preset's reference measurements (``REFERENCE``), or {} where it has none."""
    from .. import paths

    path = paths.CONFIG / preset / REFERENCE
    return json.loads(path.read_text()) if preset and path.exists() else {}


GUESS_SECONDS = {"smoke": {"notebook": 30, "book": 60}, "cpu": {"notebook": 45, "book": 60},
                 "gpu": {"notebook": 120, "book": 60}, "paper": {"notebook": 600, "book": 60}}
"""A notebook's execution and the book's build until this machine has measured them for the preset: small next to the
trainings, whose costs are never guessed."""
LIVE_STEPS = 3
"""Training steps a run must have logged before its seconds per step count as measured (the first one compiles)."""


def clock(seconds: float) -> str:
    """``7:42``, or ``1:02:03`` from an hour on (how the progress lines and the book write times)."""
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else \
        f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Prints 'step i of n', the elapsed time and the time left: the sum of the unfinished steps' expected seconds
    (``steps``; None where nothing measured here says yet: then "estimating"), except for the steps an ``estimating``
    block covers, whose time left its function gives (the lanes' schedule played forward)."""

    fmt = staticmethod(clock)

    def __init__(self, steps: list[tuple[str, float | None | Callable[[], float | None]]], stream=None):
        # (label, expected seconds; a step done side by side with others: its share; or a function giving them, asked
        # each time: the book's build, priced from the notebooks measured so far)
        self.steps = steps
        self.start = time.time()
        self.finished: set[int] = set()
        self.stream = stream or sys.stdout
        self._covered: frozenset[int] = frozenset()
        self._left: Callable[[], float | None] | None = None
        self._failed = False
        self._printing = threading.Lock()  # the lanes' threads print too: one line at a time

    @contextlib.contextmanager
    def estimating(self, steps: Iterable[int], left: Callable[[], float | None]) -> Iterator[None]:
        """Within the block, the time left of ``steps`` (indices) is ``left()`` (None: not known yet)."""
        self._covered, self._left = frozenset(steps), left
        try:
            yield
        finally:
            self._covered, self._left = frozenset(), None

    def left(self) -> float | None:
        """Seconds left, or None while some unfinished step's cost is not known."""
        rest: list[float | None] = []
        try:
            rest = [est() if callable(est) else est for i, (_, est) in enumerate(self.steps)
                    if i not in self.finished and i not in self._covered]
            covered = self._left() if self._left is not None else 0.0
        except Exception as error:  # a fault of the estimate must never stop the work it reports on
            if not self._failed:
                self._print(f"(the time left cannot be estimated: {type(error).__name__}: {error})")
            self._failed = True
            covered = None
        if covered is None or any(est is None for est in rest):
            return None
        return covered + sum(rest)

    def begin(self, index: int, what: str) -> float:
        left = self.left()
        self._print(f"[{index + 1}/{len(self.steps)}] {what}   ({clock(time.time() - self.start)} elapsed, "
                    + ("estimating the time left)" if left is None else f"about {clock(left)} left)"))
        return time.time()

    def end(self, index: int, started: float, note: str = "") -> float:
        took = time.time() - started
        self.finished.add(index)
        self._print(f"[{index + 1}/{len(self.steps)}] done in {clock(took)}{' ' + note if note else ''}")
        return took

    def _print(self, line: str) -> None:
        with self._printing:
            print(line, file=self.stream, flush=True)


def logged_steps(metrics: Path, since: float, first: tuple[int, float] | None = None
                 ) -> tuple[tuple[int, float], tuple[int, float]] | None:
    """The first and the last training step that ``metrics`` (a run's ``metrics.jsonl``) logged at or after
    ``since``, as (step, time): Levanter numbers steps from 0 and logs each once it is done; records of an earlier
    process (a run that resumes) and the evaluation before the first step (step -1) are not this run's steps.
    ``first``, when known, spares reading the file from its start; the last is read from its end."""
    if not metrics.exists():
        return None
    if first is None:
        with metrics.open() as fh:
            for line in fh:
                record = parse_record(line)
                if record and record["step"] >= 0 and record["time"] >= since:
                    first = record["step"], record["time"]
                    break
        if first is None:
            return None
    with metrics.open("rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 16384))
        tail = fh.read().decode(errors="replace").splitlines()
    for line in reversed(tail):
        record = parse_record(line)
        if record:
            return first, (record["step"], record["time"])
    return None


def parse_record(line: str) -> dict | None:
    """A line of ``metrics.jsonl`` as a dict, if it is a step's record (an integer ``step`` and a ``time``); None for
    a summary (``step`` null), the cut first line of a tail or a partial last line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int) or \
            not isinstance(record.get("time"), (int, float)):
        return None
    return record


class Costs:
    """What each piece of the pipeline's work is expected to take (seconds), learned from what this machine measured:
    see the module docstring. ``timings`` is ``state.json``'s record (``runs``: config hash of a unit's first member
    -> its measured ``seconds``, ``start``, ``step``, ``steps``, ``flops`` and ``preset``; ``notebooks``:
    ``<preset>/<notebook>`` -> seconds; ``book``: ``<preset>`` -> seconds), which this pipeline's measurements
    update. A unit is what one lane trains at once: a run, or a population's members."""

    def __init__(self, preset: str, timings: dict | None = None, save: Callable[[], None] | None = None,
                 reference_seconds: dict | None = None):
        self.preset = preset
        self.timings = {} if timings is None else timings
        self.reference = reference(preset) if reference_seconds is None else reference_seconds
        """The preset's reference measurements (``REFERENCE``; {}: none)."""
        self.save = save
        """Called (under a lock: the lanes are threads) after each measurement enters ``timings``, to keep it on disk
        at once: a pipeline that is killed keeps what it measured (``state.json``), and the next one prices with it."""
        self._lock = threading.Lock()
        for part in ("runs", "notebooks", "book"):
            self.timings.setdefault(part, {})
        self.measured: list[dict] = []
        """This pipeline's units, as they finished (their entries of ``timings["runs"]``)."""
        self.notebooks: list[float] = []
        """The seconds of this pipeline's notebooks, as they finished."""
        self.slower: list[float] = []
        """For each of this pipeline's notebooks that the reference measured: its seconds here over its seconds
        there."""
        self.training: dict[str, tuple[list[Training], float]] = {}
        """A unit's key -> the unit and when it began, for the units training now."""
        self._first: dict[str, tuple[int, float]] = {}
        self._basis_now: list[dict] | None = None

    # ------------------------------------------------------------------------------------------- measurements

    @staticmethod
    def key(unit: list[Training]) -> str:
        return unit[0].config_hash

    def began(self, unit: list[Training], when: float) -> None:
        self.training[self.key(unit)] = unit, when
        self._first.pop(self.key(unit), None)
        self.refresh()

    def ended(self, unit: list[Training], when: float) -> None:
        """Record the unit's measured cost (``timings["runs"]``) once it finished."""
        key = self.key(unit)
        if key not in self.training:
            return
        since = self.training.pop(key)[1]
        entry = {"preset": self.preset, "steps": unit[0].steps, "flops": _flops(unit), "seconds": when - since}
        live = self._live(unit, since)
        if live is not None:
            entry["step"] = live[0]
            entry["start"] = max(0.0, entry["seconds"] - unit[0].steps * live[0])
        with self._kept():
            self.timings["runs"][key] = entry
        self.measured.append(entry)
        self.refresh()

    @contextlib.contextmanager
    def _kept(self) -> Iterator[None]:
        """A change of ``timings``, saved (``save``) once made."""
        with self._lock:
            yield
            if self.save is not None:
                self.save()

    def notebook_done(self, job: NotebookJob, seconds: float) -> None:
        with self._kept():
            self.timings["notebooks"][f"{self.preset}/{job.name}"] = seconds
        self.notebooks.append(seconds)
        there = self._reference_seconds(job)
        if there:
            self.slower.append(seconds / there)

    def book_done(self, seconds: float) -> None:
        with self._kept():
            self.timings["book"][self.preset] = seconds

    def _live(self, unit: list[Training], since: float) -> tuple[float, tuple[int, float], float] | None:
        """(seconds per step, the last logged (step, time), seconds to its first step) of a unit that began at
        ``since``, once it has logged ``LIVE_STEPS`` steps; None before."""
        key = self.key(unit)
        logged = logged_steps(runs.metrics_file(unit[0].run_dir), since, self._first.get(key))
        if logged is None:
            return None
        first, last = logged
        self._first[key] = first
        if last[0] - first[0] < LIVE_STEPS - 1:
            return None
        return (last[1] - first[1]) / (last[0] - first[0]), last, first[1] - since

    # ------------------------------------------------------------------------------------------- predictions

    def refresh(self) -> None:
        """Read the training units' logs again at the next prediction (one estimate reads each once)."""
        self._basis_now = None

    def _basis(self) -> list[dict]:
        """What a run never measured here is priced from: this pipeline's units (those that finished, and those
        training now with ``LIVE_STEPS`` logged), else the preset's units measured here before."""
        if self._basis_now is None:
            self._basis_now = self._read_basis()
        return self._basis_now

    def _read_basis(self) -> list[dict]:
        basis = [e for e in self.measured if "step" in e]
        for unit, since in list(self.training.values()):
            live = self._live(unit, since)
            if live is not None:
                basis.append({"step": live[0], "start": max(0.0, live[2] - live[0]), "flops": _flops(unit)})
        return basis or [e for e in self.timings["runs"].values() if e.get("preset") == self.preset and "step" in e]

    def unit_seconds(self, unit: list[Training]) -> float | None:
        """The whole unit's expected seconds; None if nothing measured here prices it yet."""
        start_step = self._start_step(unit)
        if start_step is None:
            entry = self.timings["runs"].get(self.key(unit))
            return entry["seconds"] if entry else None
        start, step = start_step
        return start + unit[0].steps * step

    def _start_step(self, unit: list[Training]) -> tuple[float, float] | None:
        """(start-up, seconds per step) of ``unit``: measured for its config hash, else from the ``_basis``."""
        entry = self.timings["runs"].get(self.key(unit))
        if entry is not None:
            return (entry["start"], entry["step"]) if "step" in entry else None
        basis = self._basis()
        if not basis:
            return None
        start = statistics.median(e["start"] for e in basis)
        flops = _flops(unit)
        per_flop = [e["step"] / e["flops"] for e in basis if e.get("flops")]
        if flops and per_flop:
            return start, flops * statistics.median(per_flop)
        return start, statistics.median(e["step"] for e in basis)

    def unit_left(self, unit: list[Training], now: float) -> float | None:
        """Seconds left of a unit that is training: its remaining steps at its own pace once it has logged
        ``LIVE_STEPS``, else what is expected of it less what has passed."""
        since = self.training.get(self.key(unit), (unit, now))[1]
        live = self._live(unit, since)
        if live is not None:
            per_step, (step, at), _ = live
            return max(0.0, (unit[0].steps - 1 - step) * per_step - (now - at))
        start_step = self._start_step(unit)
        if start_step is None:
            whole = self.unit_seconds(unit)
            return None if whole is None else max(0.0, whole - (now - since))
        start, step = start_step
        return max(0.0, start - (now - since)) + unit[0].steps * step

    def notebook_seconds(self, job: NotebookJob) -> float:
        """What ``job`` took for the same inputs (its cache entry, if it is executed again), else the last time this
        preset executed it here, else a typical notebook's (``typical_notebook``)."""
        record = job.cache_dir / "record.json"
        if record.exists():
            return float(json.loads(record.read_text())["seconds"])
        if f"{self.preset}/{job.name}" in self.timings["notebooks"]:
            return self.timings["notebooks"][f"{self.preset}/{job.name}"]
        there = self._reference_seconds(job)
        if there:
            return there * self.slowness()
        return self.typical_notebook()

    def _reference_seconds(self, job: NotebookJob) -> float | None:
        """What ``job`` took on the reference's machine (``REFERENCE``); None where the reference lacks it."""
        return self.reference.get("notebooks", {}).get(job.name)

    def slowness(self) -> float:
        """How much slower than the reference's machine this one is (``REFERENCE``): the median over this pipeline's
        notebooks of their seconds here over theirs there; 1 before any. (The training steps' seconds per model FLOP
        are no guide: on a smoke build run beside other work they were 17 times the reference's, its notebooks 3.)"""
        return statistics.median(self.slower) if self.slower else 1.0

    def typical_notebook(self) -> float:
        """What a notebook not measured here is expected to take: the median of this pipeline's notebooks so far,
        the preset's guess (``GUESS_SECONDS``) counted among them. Notebooks differ twentyfold (the cpu preset's F6
        22 s, F3 614 s on a 2-core machine): the mean of the first two, F1 and F3, priced each of the nine others
        at 322 s, and the line said 1:10:49 left where 48:00 were."""
        guess = GUESS_SECONDS.get(self.preset, GUESS_SECONDS["cpu"])["notebook"]
        return statistics.median([guess, *self.notebooks])

    def book_seconds(self) -> float:
        """What the book's build took the last time this preset built it here, else what it took on the reference's
        machine times this one's ``slowness``, else its guess (``GUESS_SECONDS``) times what a typical notebook takes
        here against its guess: a machine slower than the guesses' is slower at both."""
        if self.preset in self.timings["book"]:
            return self.timings["book"][self.preset]
        if self.reference.get("book"):
            return self.reference["book"] * self.slowness()
        guess = GUESS_SECONDS.get(self.preset, GUESS_SECONDS["cpu"])
        return guess["book"] * self.typical_notebook() / guess["notebook"]

    def seconds(self, item: list[Training] | tuple[int, NotebookJob]) -> float | None:
        """A lane's item (a unit, or a notebook as (progress index, job)), not begun: its expected seconds."""
        return self.notebook_seconds(item[1]) if isinstance(item, tuple) else self.unit_seconds(item)

    def left(self, item: list[Training] | tuple[int, NotebookJob], begun: float, now: float) -> float | None:
        """A lane's item that began at ``begun``: its seconds left. A notebook is never taken to be more than two
        thirds done (half its time so far still to go): one that runs longer than expected may run longer still."""
        if isinstance(item, tuple):
            return max(self.notebook_seconds(item[1]) - (now - begun), (now - begun) / 2)
        return self.unit_left(item, now)


def _flops(unit: list[Training]) -> float:
    """Model FLOPs of one training step of the whole unit (each member's ``Training.flops``)."""
    return float(sum(t.flops for t in unit))
