"""The scripts CI does not run (each takes a fresh virtual environment and many minutes): the Colab simulation
(``benchmarks/colab/simulate.sh``) and the offline GPU machine's scripts with their simulation (``benchmarks/gpu/``:
``prepare.sh``, ``run.sh``, ``simulate.sh``). What they expect of the project is still there: every command they run
exists and takes the flags they give it, every message they look for in a log is still printed, every notebook
parameter and run they name is still declared and trained."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from diffeqformer import config as configs
from diffeqformer import paths, pipeline, runs
from diffeqformer.pipeline import PipelineError

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
    or a program (``make``)."""
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
                    called = word == target and before in ("", "&&", "(cd")
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


def test_the_pipeline_and_data_commands_take_the_flags_the_scripts_give():
    calls = _calls("-m diffeqformer.pipeline")
    assert len(calls) >= 2, "the Colab simulation and run.sh's pipeline step run the pipeline"
    values = {"$preset": _run_sh_preset()}
    for call in calls:
        call = [values.get(w, w) for w in call]
        _check_flags(call, paths.REPO / "src" / "diffeqformer" / "pipeline" / "build.py")
        assert call[call.index("--preset") + 1] in pipeline.PRESETS, call
    calls = _calls("-m diffeqformer.pipeline.edition")
    assert calls, "run.sh's pipeline step packs the edition"
    for call in calls:
        _check_flags(call, paths.REPO / "src" / "diffeqformer" / "pipeline" / "edition.py")
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
    for call in _calls("benchmarks/gpu/run.sh") + _calls("benchmarks/gpu/run.sh", comments=True):
        named = []
        for word in call:
            if word not in steps:
                break
            named.append(word)
        assert named, f"run.sh has no step {call[:1]} (a script or its header runs it)"
        if "measure" in named:  # the rest are measure.py's arguments
            _check_flags(call[len(named):], GPU / "measure.py")
        if "pipeline" in named:  # the rest are the pipeline's
            _check_flags(call[len(named):], paths.REPO / "src" / "diffeqformer" / "pipeline" / "build.py")


def test_run_sh_runs_the_gpu_pipeline_without_its_book_and_packs_its_edition():
    """run.sh's pipeline step: the gpu preset (the preset ``edition import`` accepts), ``--no-book`` (the book is
    built where the edition is imported), then ``edition pack`` into the output folder ``DIFFEQFORMER_EDITION``
    (what is brought back from the machine); the simulation runs the same step on the CPU."""
    from diffeqformer.pipeline import edition

    assert _run_sh_preset() == edition.PRESET
    [run] = [c for c in _calls("-m diffeqformer.pipeline") if "$preset" in c]
    assert "--no-book" in run, run
    [pack] = _calls("-m diffeqformer.pipeline.edition")
    assert pack[pack.index("--preset") + 1] == "$preset" and "--out" in pack, pack
    assert '--out "$edition"' in (GPU / "run.sh").read_text()
    assert "${DIFFEQFORMER_EDITION:-" in (GPU / "run.sh").read_text()
    simulated = [c for c in _calls("benchmarks/gpu/run.sh") if "pipeline" in c]
    assert len(simulated) == 1 and simulated[0][:3] == ["stage", "install", "pipeline"], simulated


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
        pipeline.check_parameters("f6_perplexity", parameters, pipeline.planning.declared_parameters(notebook))
    except PipelineError as err:
        pytest.fail(f"simulate.sh's parameters of f6_perplexity: {err}")
    trained: list = []
    pipeline.planning.collect_runs(pipeline.PRESETS[parameters["preset"]]["f6_perplexity"], trained)
    names = {f"runs/{r.load().name}" for r in trained}
    assert set(parameters["runs"].values()) <= names, names
