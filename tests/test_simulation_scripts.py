"""The scripts CI does not run (each takes a fresh virtual environment and many minutes): the Colab simulation
(``benchmarks/colab/simulate.sh``) and the offline GPU machine's scripts with their simulation (``benchmarks/gpu/``:
``prepare.sh``, ``run.sh``, ``simulate.sh``). What they expect of the project is still there: every command they run
exists and takes the flags they give it (Snakemake's read by Snakemake's own parser), every message they look for in
a log is still printed, every notebook parameter and run they name is still declared and trained; and run.sh's
pipeline step, with a stand-in for Python, packs the edition only after a workflow that succeeded, resumes after one
that was cut short, and runs one workflow at a time."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffeqformer import config as configs
from diffeqformer import paths, runs
from diffeqformer.workflow import edition, plan, presets

COLAB = paths.REPO / "benchmarks" / "colab" / "simulate.sh"
GPU = paths.REPO / "benchmarks" / "gpu"
SCRIPTS = (COLAB, GPU / "prepare.sh", GPU / "run.sh", GPU / "simulate.sh")
SHELL = {">", ">>", "|", "||", "&&", ";", "2>&1", "2>&1)", "&"}


def _commands(script: Path, *, comments: bool = False) -> list[list[str]]:
    """The script's lines as words (continued lines joined), code lines only or comment lines only."""
    text = script.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    if comments:
        # a comment's prose may hold an apostrophe ("the machine's own JAX"): such a line is no command
        return [shlex.split(line.lstrip("#")) for line in lines if line.startswith("#")
                and line.count('"') % 2 == 0 and line.count("'") % 2 == 0]
    return [shlex.split(line, comments=True) for line in lines if line and not line.startswith("#")]


def _arguments(words: list[str], start: int) -> list[str]:
    """The words of one command from ``start`` on, up to the first shell operator or closing parenthesis."""
    out = []
    for word in words[start:]:
        if word in SHELL or word.startswith((">", "2>")):
            break
        out.append(word.rstrip(")"))
        if word.endswith(")"):
            break
    return out


def _calls(target: str, *, comments: bool = False) -> list[list[str]]:
    """The arguments of every call of ``target`` in the scripts (their code, or with ``comments`` the commands their
    comments give): a module (``-m diffeqformer.train``), a file run by bash or Python (``benchmarks/gpu/bundle.py``)
    or a program (``make``, or ``"$V/snakemake"``: by its name)."""
    module = target.removeprefix("-m ")
    found = []
    for script in SCRIPTS:
        for words in _commands(script, comments=comments):
            for i, word in enumerate(words):
                before = words[i - 1].lstrip("`").rsplit("/", 1)[-1] if i else ""
                if target.startswith("-m "):
                    called = word == module and before == "-m"
                elif "/" in target:
                    called = word == target and before in ("bash", "python", "python3", "$PYTHON")
                else:
                    called = word.rsplit("/", 1)[-1] == target and before in ("", "&&", "(cd")
                if called:
                    found.append(_arguments(words, i + 1))
    return found


def _options(source: Path) -> tuple[set[str], set[str]]:
    """The argparse options (``--ladder``) and the choices of positional arguments (``prepare``) declared in
    ``source``, read from its ``add_argument`` calls (the file is not imported)."""
    options, choices = set(), set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            options |= {n for n in names if n.startswith("-")}
            for kw in node.keywords:
                if kw.arg == "choices" and isinstance(kw.value, (ast.Tuple, ast.List)):
                    choices |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
    return options, choices


def _check_flags(call: list[str], source: Path) -> None:
    """``call``'s flags are options of ``source``'s parser, its first word (if not a flag) one of its commands."""
    options, choices = _options(source)
    flags = {w for w in call if w.startswith("--")}
    assert flags <= options, f"{source.name} takes no {sorted(flags - options)} (a script passes them)"
    if call and not call[0].startswith(("-", "$")) and choices:
        assert call[0] in choices, f"{source.name} has no command {call[0]!r} (a script runs it)"


NAMED_FILE = re.compile(r"\b((?:benchmarks|config|notebooks)/[\w./-]+\.(?:py|sh|yaml|ipynb))")
"""A file of the repository as the scripts name it: ``benchmarks/gpu/bundle.py``, ``config/gpu/diffeqformer.yaml``."""


def test_every_script_and_file_they_name_exists():
    for script in SCRIPTS:
        assert script.exists(), script
        for path in NAMED_FILE.findall(script.read_text()):
            assert (paths.REPO / path).exists(), f"{script.name} names {path}, which does not exist"
    makefile = (paths.REPO / "Makefile").read_text()
    for call in _calls("make"):
        for target in call:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target!r}"


def _run_sh_preset() -> str:
    """The preset run.sh's pipeline step runs by default (``DIFFEQFORMER_PRESET:-gpu``)."""
    found = re.findall(r"\$\{DIFFEQFORMER_PRESET:-(\w+)\}", (GPU / "run.sh").read_text())
    assert len(found) == 1, found
    return found[0]


def _snakemake(call: list[str]):
    """A call of Snakemake from the scripts (run.sh's ``$preset`` filled in, ``$@`` left out) read by Snakemake's own
    parser: its arguments, with ``config`` as the dict Snakemake makes of the ``--config`` items."""
    from snakemake.cli import get_argument_parser, parse_config

    words = [w.replace("$preset", _run_sh_preset()) for w in call if w != "$@"]
    try:
        args = get_argument_parser().parse_args(words)
    except SystemExit:
        pytest.fail(f"Snakemake does not take {shlex.join(words)}")
    args.config = parse_config(args.config or [])
    args.words = words
    return args


def _snakemake_calls() -> list[list[str]]:
    """Every call of Snakemake in the scripts: run.sh's ``"$PYTHON" -m snakemake`` (the bundle's, on the machine's
    Python) and the Colab simulation's ``"$V/snakemake"`` (the one the Colab cell installed)."""
    return _calls("-m snakemake") + _calls("snakemake")


def test_the_workflow_edition_and_data_commands_take_the_flags_the_scripts_give():
    """Snakemake's calls read by Snakemake's parser: the workflow's Snakefile, a preset of the registry, the target
    ``notebooks`` on every core (or ``--unlock``); ``edition pack`` and the corpus's commands by their parsers."""
    calls = _snakemake_calls()
    assert len(calls) >= 3, "the Colab simulation and run.sh's pipeline step run the workflow, run.sh unlocks it"
    for call in calls:
        args = _snakemake(call)
        assert args.snakefile == "workflow/Snakefile" and (paths.REPO / args.snakefile).exists(), call
        assert args.config["preset"] in presets.presets(), call
        if not args.unlock:
            assert args.targets == ["notebooks"], call
            assert args.words[args.words.index("--cores") + 1] == "all", call
    calls = _calls("-m diffeqformer.workflow.edition")
    assert calls, "run.sh's pipeline step packs the edition"
    for call in calls:
        _check_flags(call, paths.REPO / "src" / "diffeqformer" / "workflow" / "edition.py")
        assert call[0] == "pack", call
    calls = _calls("-m diffeqformer.data")
    assert calls, "prepare.sh prepares the corpus"
    for call in calls:
        _check_flags(call, paths.REPO / "src" / "diffeqformer" / "data" / "corpora.py")


def test_the_gpu_benchmark_scripts_take_the_commands_and_flags_the_scripts_give():
    """bundle.py's commands (plan, download, verify, present) and measure.py's flags, as the scripts call them and as
    run.sh's header tells a reader to call them; every step of run.sh that a script or the header names exists."""
    for name in ("bundle.py", "measure.py"):
        calls = _calls(f"benchmarks/gpu/{name}") + _calls(f"benchmarks/gpu/{name}", comments=True)
        if name == "bundle.py":
            assert {c[0] for c in calls if c} >= {"present", "download", "verify"}, calls
        for call in calls:
            _check_flags(call, GPU / name)
    steps = set(re.findall(r"^\s+(\w+)\) ", (GPU / "run.sh").read_text(), re.M))
    assert steps == {"stage", "install", "train", "measure", "pipeline"}, steps
    [workflow] = [c for c in _calls("-m snakemake") if "notebooks" in c]
    for call in _calls("benchmarks/gpu/run.sh") + _calls("benchmarks/gpu/run.sh", comments=True):
        named = []
        for word in call:
            if word not in steps:
                break
            named.append(word)
        assert named, f"run.sh has no step {call[:1]} (a script or its header runs it)"
        if "measure" in named:  # the rest are measure.py's arguments
            _check_flags(call[len(named):], GPU / "measure.py")
        if "pipeline" in named:  # the rest are Snakemake's, after the workflow's own arguments
            _snakemake(workflow + call[len(named):])


def _run_sh_workflow():
    """run.sh's call of the workflow (the target ``notebooks``), read by Snakemake's parser."""
    [call] = [c for c in _calls("-m snakemake") if "notebooks" in c]
    return call, _snakemake(call)


def test_run_sh_runs_the_gpu_workflow_without_its_book_and_packs_its_edition():
    """run.sh's pipeline step: the gpu preset's workflow (the preset ``edition import`` accepts) without its book
    (the target ``notebooks``; the book is built where the edition is imported), resumable (``--rerun-incomplete``),
    greedy (the ILP scheduler's solver is left out of the bundle), further arguments after its own; then ``edition
    pack`` into the output folder ``DIFFEQFORMER_EDITION`` (what is brought back from the machine); the header's
    example of further arguments is a parameter the notebook declares; the simulation runs the same step on the
    CPU."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bundle", GPU / "bundle.py")
    bundle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bundle)
    call, args = _run_sh_workflow()
    assert _run_sh_preset() == edition.PRESET == args.config["preset"]
    assert args.targets == ["notebooks"] and args.rerun_incomplete and args.scheduler == "greedy", call
    assert call[-1] == "$@", call
    assert "pulp" in bundle.LEFT_OUT and _snakemake(bundle.PIPELINE_PROBE).scheduler == "greedy"
    [pack] = _calls("-m diffeqformer.workflow.edition")
    assert pack[pack.index("--preset") + 1] == "$preset" and "--out" in pack, pack
    text = (GPU / "run.sh").read_text()
    assert '--out "$edition"' in text and "${DIFFEQFORMER_EDITION:-" in text
    logs = os.path.relpath(plan.folder("$preset"), paths.HOME) + "/logs/"
    assert f"Each job's log: {logs}" in text, logs
    [example] = re.findall(r"'(set=\[[^']*\])'", text)
    from snakemake.cli import parse_config

    overrides = plan.parse_overrides(parse_config([example])["set"])
    for nb, values in overrides.items():
        plan.check_parameters(nb, values, plan.declared_parameters(paths.NOTEBOOKS / f"{nb}.ipynb"))
    simulated = [c for c in _calls("benchmarks/gpu/run.sh") if "pipeline" in c]
    assert len(simulated) == 1 and simulated[0][:3] == ["stage", "install", "pipeline"], simulated


FAKE_PYTHON = r'''#!/usr/bin/env bash
# A stand-in for the GPU machine's Python in run.sh: each call recorded; the lock's check runs, Snakemake ends with
# FAKE_SNAKEMAKE_RC, its --unlock removes the locks, the pack makes the output folder.
printf '%s\n' "$*" >> "$FAKE_CALLS"
case "$*" in
  "-c import fcntl"*) exec "$FAKE_REAL_PYTHON" "$@" ;;
  "-c import snakemake") exit "${FAKE_NO_SNAKEMAKE:-0}" ;;
  "-m snakemake "*--unlock*) rm -rf .snakemake/locks ;;
  "-m snakemake "*) exit "${FAKE_SNAKEMAKE_RC:-0}" ;;
  "-m diffeqformer.workflow.edition pack "*) mkdir -p "${@: -1}" ;;
  *) exit 99 ;;
esac
'''


@pytest.fixture
def pipeline_step(tmp_path):
    """run.sh's pipeline step in a tree of its own with a stand-in Python (``FAKE_PYTHON``): a function of the
    further arguments and environment that runs it and returns (exit status, stderr, the calls of Python made)."""
    tree = tmp_path / "tree"
    (tree / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(GPU / "run.sh", tree / "benchmarks" / "gpu" / "run.sh")
    fake, calls = tmp_path / "python", tmp_path / "calls.txt"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)

    def run(*args: str, **env: str):
        calls.write_text("")
        out = subprocess.run(["bash", str(tree / "benchmarks" / "gpu" / "run.sh"), "pipeline", *args],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHON": str(fake), "FAKE_CALLS": str(calls),
                                  "FAKE_REAL_PYTHON": sys.executable, "DIFFEQFORMER_GPU_CHECK": "cpu",
                                  "DIFFEQFORMER_COMMIT": "c", "DIFFEQFORMER_EDITION": str(tmp_path / "edition"),
                                  **env})
        return out.returncode, out.stderr, [line for line in calls.read_text().splitlines()
                                            if not line.startswith(("-c import fcntl", "-c import snakemake"))]

    run.tree = tree
    run.edition = tmp_path / "edition"
    return run


def test_run_sh_packs_only_a_workflow_that_succeeded(pipeline_step):
    """A workflow that succeeded is packed; one that failed or was cut short (Snakemake's exit status not 0) is not:
    run.sh exits with Snakemake's status, saying that nothing was packed and that the same command resumes (the old
    pipeline step packed nothing then either: its pack followed the pipeline under ``set -e``)."""
    workflow = "-m snakemake " + " ".join(_run_sh_workflow()[0][:-1]).replace("$preset", "gpu")
    rc, err, calls = pipeline_step("--keep-going")
    assert rc == 0, err
    assert calls == [f"{workflow} --keep-going",
                     f"-m diffeqformer.workflow.edition pack --preset gpu --out {pipeline_step.edition}"]
    rc, err, calls = pipeline_step(FAKE_SNAKEMAKE_RC="130")
    assert rc == 130 and calls == [workflow], calls
    assert "nothing packed" in err and "Run the same command again to resume" in err, err
    rc, err, calls = pipeline_step(FAKE_NO_SNAKEMAKE="1")  # a training's bundle: no Snakemake
    assert rc == 1 and calls == [] and "no Snakemake on this Python" in err, err


def test_run_sh_removes_the_lock_of_a_killed_workflow_and_runs_one_at_a_time(pipeline_step):
    """The lock a killed Snakemake left (``.snakemake/locks``) is removed before the workflow resumes; while another
    run.sh holds the tree's lock, the step refuses and runs nothing."""
    locks = pipeline_step.tree / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("runs/gpu-gpt2/trained-0123456789abcdef.json\n")
    rc, err, calls = pipeline_step()
    assert rc == 0, err
    assert calls[0] == "-m snakemake -s workflow/Snakefile --unlock --config preset=gpu" and not locks.exists()
    assert calls[1].startswith("-m snakemake -s workflow/Snakefile --cores all") and len(calls) == 3, calls
    with open(pipeline_step.tree / "_build" / "workflow" / "run-sh.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc, err, calls = pipeline_step()
    assert rc == 1 and "another workflow of benchmarks/gpu/run.sh is still running" in err and calls == [], err
    rc, err, calls = pipeline_step()
    assert rc == 0 and len(calls) == 2, err  # released with its holder


def _train_call() -> tuple[str, list[str]]:
    """run.sh's training command as benchmarks/gpu/simulate.sh runs it: config file and overrides, the shell's
    variables filled in (the run directory, ``--trainer.require_accelerator false``)."""
    calls = _calls("-m diffeqformer.train")
    assert len(calls) == 1, calls
    values = {"$run_dir": "/tmp/run", "$accelerator": "false"}
    words = [values.get(w, w) for w in calls[0] if w != "$@"]
    simulated = [c for c in _calls("benchmarks/gpu/run.sh") if "train" in c]
    assert len(simulated) == 1, simulated
    words += [w for w in simulated[0][simulated[0].index("train") + 1:] if w != "$@"]
    i = words.index("--config")
    return words[i + 1], words[:i] + words[i + 2:]


def test_the_gpu_training_command_parses():
    config, overrides = _train_call()
    assert config == "config/gpu/diffeqformer.yaml" and overrides[:2] == ["--run_dir", "/tmp/run"], overrides
    resolved = configs.load_config(paths.REPO / config, overrides)
    assert resolved.trainer.num_train_steps == 5 and resolved.trainer.require_accelerator is False
    assert resolved.data.dataset == "shakespeare" and str(configs.run_dir_of(resolved)) == "/tmp/run"
    assert "cat \"$run_dir/complete.json\"" in (GPU / "run.sh").read_text() and runs.COMPLETE == "complete.json"


def test_the_colab_simulation_looks_for_what_the_notebook_prints(tmp_path, monkeypatch):
    """simulate.sh runs f6_perplexity before any run is trained and looks for the error a missing run raises; then
    it passes the notebook parameters naming the smoke runs, which must be declared and trained by the smoke
    preset."""
    script = COLAB.read_text()
    messages = re.findall(r'grep -q "([^"]+)"', script)
    assert messages == ["no finished run there"], messages
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    with pytest.raises(FileNotFoundError, match=messages[0]):
        runs.require_complete("runs/cpu-diffeqformer")  # what the notebook's defaults read, on a fresh clone
    given = re.search(r"""f6_perplexity\.ipynb"? second\.ipynb .* -y\s+'([^']*)'""", script.replace("\\\n", " "))
    assert given, "simulate.sh passes f6_perplexity its smoke runs"
    parameters = json.loads(given.group(1))
    notebook = paths.NOTEBOOKS / "f6_perplexity.ipynb"
    try:
        plan.check_parameters("f6_perplexity", parameters, plan.declared_parameters(notebook))
    except plan.WorkflowError as err:
        pytest.fail(f"simulate.sh's parameters of f6_perplexity: {err}")
    trained = plan.collect_runs(presets.presets()[parameters["preset"]]["f6_perplexity"])
    names = {f"runs/{r.load().name}" for r in trained}
    assert set(parameters["runs"].values()) <= names, names


COLAB_COMMAND = re.compile(r"`!(snakemake [^`]+)`")
"""The command the notebooks' Colab cell gives in its comment: the workflow, to train the runs the notebook reads."""


def test_the_colab_simulation_runs_the_command_the_colab_cell_gives():
    """Step 2 of the Colab simulation is the command of every notebook's Colab cell, run in the clone with the
    Snakemake the cell installed, with the smoke preset in place of the cell's (the one a CPU trains in minutes)."""
    given = set()
    for nb in plan.toc_notebooks():
        cells = json.loads((paths.NOTEBOOKS / f"{nb}.ipynb").read_text())["cells"]
        colab = next(c for c in cells if c["cell_type"] == "code")
        given |= set(COLAB_COMMAND.findall("".join(colab["source"])))
    assert len(given) == 1, given
    cell = _snakemake(shlex.split(given.pop())[1:])
    [call] = _calls("snakemake")  # the Colab simulation's
    simulated = _snakemake(call)
    assert simulated.config == {**cell.config, "preset": "smoke"}
    assert [w for w in simulated.words if not w.startswith("preset=")] == \
        [w for w in cell.words if not w.startswith("preset=")]
    assert '(cd "$REPO" && "$V/snakemake" ' in COLAB.read_text().replace("\\\n", " ")
