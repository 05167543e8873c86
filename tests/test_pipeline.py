"""diffeqformer.pipeline: registry validation, bad parameters rejected before anything runs, caching, a failing
notebook leaves the previous figures untouched; and (marked ``pipeline``) the smoke preset end to end."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import nbformat
import pytest
from smoke_pipeline import smoke_book  # noqa: F401 (session fixture)

from diffeqformer import config as configs
from diffeqformer import forks, paths, pipeline, runs
from diffeqformer.pipeline import PipelineError, Run
from diffeqformer.report import book

# ----------------------------------------------------------------------------------------------- the registry


@pytest.mark.parametrize("preset", list(pipeline.PRESETS))
def test_every_preset_validates(preset, tmp_path, monkeypatch):
    """Every registered notebook exists, is in _toc.yml, declares the parameters it gets with the right types, and
    every training config parses. (Runs go to an empty folder: what is trained locally does not matter here.)"""
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    result = pipeline.plan(preset)
    assert [j.name for j in result.notebooks] == list(pipeline.PRESETS[preset])
    assert all(t.path.exists() and t.name.startswith(preset) and not t.done for t in result.trainings)
    for job in result.notebooks:
        assert job.parameters["preset"] == preset
        assert len(job.key) == 16


def test_toc_and_registry_agree():
    in_toc = set(pipeline.toc_notebooks())
    for preset, entries in pipeline.PRESETS.items():
        assert set(entries) == in_toc, preset


def test_notebooks_are_committed_without_outputs():
    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: one cell tagged 'parameters'"
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert "google.colab" in first_code.source, f"{path.name}: the first code cell installs the package on Colab"
        book.check_colab_cell(path)  # it clones _config.yml's repository.url and stays out of the book
        title, question = nb.cells[0].source.split("\n\n")[:2]
        assert title.startswith("# ") and question.startswith("**The question.**") and question.endswith("?"), \
            f"{path.name}: the first cell is the title, then the page's question"


def _defaults(path: Path, gpu: bool) -> dict:
    """The values of a notebook's parameters cell executed as it stands (no parameter passed), on a machine with a
    GPU or without."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values: dict = {"GPU": gpu}
    exec(cell.source, values)
    return {k: v for k, v in values.items() if k not in ("GPU", "__builtins__")}


def _run_names(value) -> set[str]:
    if isinstance(value, str):
        return {value} if value.startswith("runs/") else set()
    if isinstance(value, dict):
        value = list(value.values())
    return set().union(*map(_run_names, value)) if isinstance(value, list) else set()


def test_papermill_reads_every_parameter_line():
    """Papermill's parameter inspection skips a line with more than one '=' (and warns "Unable to parse line" when
    the notebook executes): every parameter is one assignment whose value has no '=' (no ==, != or keyword)."""
    import papermill

    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")):
        names = set(papermill.inspect_notebook(str(path)))
        assert names == set(_defaults(path, gpu=False)) - {"__annotations__"}, path.name


@pytest.mark.parametrize("gpu,preset", [(False, "cpu"), (True, "gpu")])
def test_a_notebook_run_without_parameters_reads_its_presets_runs(gpu, preset):
    """Every notebook defaults to the cpu preset without a GPU and to the gpu preset with one, and the runs its
    defaults name are runs that preset trains for it: run by hand, it reads what ``make book`` (or the gpu pipeline)
    trained."""
    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")):
        defaults = _defaults(path, gpu=gpu)
        assert defaults["preset"] == preset, path.name
        entry = pipeline.PRESETS[preset][path.stem]
        trained: list[Run] = []
        pipeline.planning.collect_runs(entry, trained)
        names = _run_names([defaults[k] for k in entry])  # the parameters the pipeline passes (not a name stem)
        assert names <= {f"runs/{r.load().name}" for r in trained}, path.name


# ------------------------------------------------------------------------------------------ bad input, early


def test_unknown_preset_is_named():
    with pytest.raises(PipelineError, match="unknown preset 'huge'"):
        pipeline.plan("huge")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"f1_model": {"sed": 3}}, "parameter 'sed' is not declared"),
        ({"f1_model": {"seed": "three"}}, "parameter 'seed' must be int"),
        ({"f1_model": {"num_entries": 2.5}}, "parameter 'num_entries' must be int"),
        ({"f6_perplexity": {"runs": ["runs/x"]}}, "parameter 'runs' must be dict"),
        ({"f6_perplexity": {"log_scale": 1}}, "parameter 'log_scale' must be bool"),
        ({"f9_nothing": {"seed": 1}}, "notebook 'f9_nothing'"),
    ],
)
def test_bad_parameters_are_rejected_before_anything_runs(tmp_path, monkeypatch, overrides, message):
    monkeypatch.setattr(paths, "HOME", tmp_path)
    with pytest.raises(PipelineError, match=message):
        pipeline.run("smoke", overrides)
    assert not any(tmp_path.iterdir()), "nothing may be written before the parameters are checked"


def test_overrides_parse_as_yaml():
    parsed = pipeline.parse_overrides(["f1_model.seed=3", "f6_perplexity.runs={gpt: runs/a}", "f1_model.run="])
    assert parsed == {"f1_model": {"seed": 3, "run": ""}, "f6_perplexity": {"runs": {"gpt": "runs/a"}}}
    with pytest.raises(PipelineError, match="NOTEBOOK.PARAMETER=VALUE"):
        pipeline.parse_overrides(["seed=3"])


@pytest.mark.parametrize(
    "value,annotation,ok",
    [
        (3, int, True), (True, int, False), (3, float, True), (3.5, int, False), ("a", str, True),
        (True, bool, True), (1, bool, False), ([1, 2], list, True), ({"a": "b"}, dict, True),
        (["a", "b"], list[str], True), (["a", 1], list[str], False),
        ({"a": "b"}, dict[str, str], True), ({"a": 1}, dict[str, str], False),
        (None, typing.Optional[int], True), (2, typing.Optional[int], True), ("x", typing.Any, True),
    ],
)
def test_type_matches(value, annotation, ok):
    assert pipeline.type_matches(value, annotation) is ok


# -------------------------------------------------------------------------- caching and failure, tiny notebooks


def _notebook(path, name):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    params = nbformat.v4.new_code_cell('preset: str = "x"\nx: int = 1  # must be positive')
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell(
        "import sys\nprint('preloaded:', 'diffeqformer.report.figures' in sys.modules)\n"  # forked from the server
        "import matplotlib.pyplot as plt\nfrom diffeqformer.report import figures\n"
        f"figures.start({name!r}, dict(preset=preset, x=x))\n"
        "fig, ax = plt.subplots()\nax.plot([0, x])\n"
        f"figures.save_figure(fig, {name + '_fig'!r}, caption='A line.', show=False)\n"
        "if x < 0:\n    raise ValueError(f'x must be positive, got {x}')\n"
    )
    nb.cells = [params, body]
    nbformat.write(nb, path)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """Two tiny notebooks registered under preset 'tiny', in a temporary DIFFEQFORMER_HOME."""
    home, nbdir = tmp_path / "home", tmp_path / "notebooks"
    home.mkdir()
    nbdir.mkdir()
    for name in ("nb_a", "nb_b"):
        _notebook(nbdir / f"{name}.ipynb", name)
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: book/intro\nchapters:\n- file: notebooks/nb_a\n- file: notebooks/nb_b\n")
    monkeypatch.setattr(paths, "HOME", home)
    monkeypatch.setattr(paths, "FIGURES", home / "figures")
    monkeypatch.setenv("DIFFEQFORMER_HOME", str(home))
    # The source a notebook imports is part of its key; fixed here, so that an edit elsewhere in the package (in a
    # shared work tree) cannot make this test re-execute what it expects cached.
    monkeypatch.setattr(pipeline.planning, "notebook_sources_hash", lambda path: "fixed")
    # the notebooks' processes forked from a server that imports what these notebooks import (diffeqformer.forks)
    monkeypatch.setattr(forks, "PRELOAD", ("papermill", "nbclient", "jupyter_client.manager",
                                                    "ipykernel.ipkernel", "ipykernel.zmqshell", "matplotlib.pyplot",
                                                    "diffeqformer.report.figures"))
    registry = {"tiny": {"nb_a": dict(x=1), "nb_b": dict(x=2)}}

    def run(overrides=None):
        out = io.StringIO()
        pipeline.run("tiny", overrides, build=False, stream=out, registry=registry, notebooks_dir=nbdir, toc=toc)
        return out.getvalue()

    return run, home


def _printed(name: str) -> str:
    """What the cached executed notebook ``name`` printed."""
    executed = next(pipeline.cache_dir().glob(f"{name}-*")) / "notebook.ipynb"
    return "".join(o.get("text", "") for c in nbformat.read(executed, as_version=4).cells for o in c.get("outputs", []))


def test_cache_reexecutes_only_what_changed(tiny, monkeypatch):
    run, home = tiny
    first = run()
    assert first.count("(cached)") == 0
    assert "preloaded: True" in _printed("nb_a") and "preloaded: True" in _printed("nb_b")  # forked kernels
    assert sorted(p.name for p in (home / "figures").iterdir()) == [
        "nb_a_fig.json", "nb_a_fig.png", "nb_a_fig.svg", "nb_b_fig.json", "nb_b_fig.png", "nb_b_fig.svg"]
    second = run()
    assert second.count("(cached)") == 2  # both notebooks
    monkeypatch.setenv(pipeline.notebooks.FORKS_OFF, "0")  # and with the fork server off, fresh ones
    third = run({"nb_b": {"x": 3}})
    assert "preloaded: False" in _printed("nb_b")
    assert "execute nb_a" in third and third.split("execute nb_b")[0].count("(cached)") == 1
    assert third.split("execute nb_b")[1].split("\n")[1].endswith(tuple("0123456789"))  # nb_b ran again
    record = json.loads((home / "figures" / "nb_b_fig.json").read_text())
    assert record["parameters"]["x"] == 3


def test_a_notebook_key_covers_the_modules_it_imports_and_not_the_pipeline(tmp_path, monkeypatch):
    """Editing the registry (or any of the pipeline's code) re-executes no notebook; editing a module re-executes the
    notebooks that import it, directly or through another module, and no other."""
    package = tmp_path / "diffeqformer"
    shutil.copytree(pipeline.sources.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(pipeline.sources, "PACKAGE", package)
    notebooks = {nb: paths.NOTEBOOKS / f"{nb}.ipynb" for nb in pipeline.toc_notebooks()}
    for nb, path in notebooks.items():
        assert not any(m.startswith("diffeqformer.pipeline") for m in pipeline.sources.notebook_modules(path)), nb

    def keys():
        return {nb: pipeline.sources.notebook_sources_hash(path) for nb, path in notebooks.items()}

    def edit(module):
        with (package / module).open("a") as f:
            f.write("\n# an edit\n")

    before = keys()
    edit("pipeline/registry.py")
    assert keys() == before
    edit("analysis/perplexity.py")  # imported by F6's notebook alone
    after = keys()
    assert [nb for nb in notebooks if after[nb] != before[nb]] == ["f6_perplexity"]
    edit("paths.py")  # imported by every notebook (through figures)
    assert all(keys()[nb] != after[nb] for nb in notebooks)


def test_failing_notebook_stops_with_its_error_and_keeps_previous_figures(tiny):
    run, home = tiny
    run()
    before = {p.name: p.read_bytes() for p in (home / "figures").iterdir()}
    with pytest.raises(PipelineError, match="ValueError: x must be positive, got -1"):
        run({"nb_a": {"x": -1}})
    assert {p.name: p.read_bytes() for p in (home / "figures").iterdir()} == before
    assert (pipeline.work_dir() / "failed" / "nb_a.ipynb").exists()
    assert not list(pipeline.work_dir().glob("staging-*"))


def test_a_notebook_kernel_listens_on_unix_sockets_of_its_own(tmp_path):
    """The Papermill child starts its kernel on ZeroMQ's ipc transport, in a folder it removes afterwards: over TCP
    ports, a kernel started beside another process's kernels could find its port taken and die at start (CI failed
    so: "Address already in use", then "Kernel died before replying to kernel_info")."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nb.cells = [nbformat.v4.new_code_cell(
        "import json\nfrom ipykernel import get_connection_file\n"
        f"json.dump(json.load(open(get_connection_file())), open({str(tmp_path / 'connection.json')!r}, 'w'))\n")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    spec = {"input": str(tmp_path / "in.ipynb"), "output": str(tmp_path / "out.ipynb"), "parameters": {},
            "error": str(tmp_path / "error.json")}
    out = subprocess.run([sys.executable, "-m", "diffeqformer.pipeline.processes", json.dumps(spec)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    connection = json.loads((tmp_path / "connection.json").read_text())
    assert connection["transport"] == "ipc", connection
    sockets = Path(connection["ip"]).parent
    assert sockets.name.startswith("diffeqformer-kernel-") and not sockets.exists()


def test_a_figure_built_without_pyplot_is_an_image_in_the_executed_notebook(tiny, tmp_path):
    """The kernel loads no matplotlib backend for a ``Figure`` made without pyplot (as spectra.py makes F2's): shown
    as an object it was text only, ``<Figure size ...>``. ``save_figure`` shows the PNG it saved."""
    run, home = tiny
    nb = nbformat.read(tmp_path / "notebooks" / "nb_a.ipynb", as_version=4)
    nb.cells[1].source = (
        "from matplotlib.figure import Figure\nfrom diffeqformer.report import figures\n"
        "figures.start('nb_a', dict(preset=preset, x=x))\n"
        "fig = Figure()\nfig.add_subplot().plot([0, x])\n"
        "figures.save_figure(fig, 'nb_a_fig', caption='A line.')\n")
    nbformat.write(nb, tmp_path / "notebooks" / "nb_a.ipynb")
    run()
    executed = next(pipeline.cache_dir().glob("nb_a-*")) / "notebook.ipynb"
    shown = [sorted(o.data) for o in nbformat.read(executed, as_version=4).cells[-1].outputs
             if o.output_type == "display_data"]
    assert shown[:2] == [["image/png", "text/plain"], ["text/markdown", "text/plain"]]


def test_a_figure_shown_as_text_stops_the_pipeline(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("display(fig)", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": "<Figure size 1300x340 with 5 Axes>"})])]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    with pytest.raises(PipelineError, match="cell 0 shows a figure as text, '<Figure size 1300x340 with 5 Axes>'"):
        pipeline.check_outputs(tmp_path / "nb.ipynb", "nb")
    nb.cells[0].outputs[0]["data"]["image/png"] = "iVBORw0KGgo="
    nbformat.write(nb, tmp_path / "nb.ipynb")
    pipeline.check_outputs(tmp_path / "nb.ipynb", "nb")  # the same figure with its image


def test_registry_and_toc_must_agree(tiny, tmp_path):
    with pytest.raises(PipelineError, match="'nb_b' is in _toc.yml but preset 'tiny' does not run it"):
        pipeline.plan("tiny", registry={"tiny": {"nb_a": {}}}, notebooks_dir=tmp_path / "notebooks",
                      toc=tmp_path / "_toc.yml")


def test_a_run_of_another_configuration_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    (tmp_path / "smoke-gpt2" / "checkpoints").mkdir(parents=True)
    (tmp_path / "smoke-gpt2" / "config.yaml").write_text("# config_hash: 0123456789abcdef\nname: smoke-gpt2\n")
    with pytest.raises(PipelineError, match="smoke-gpt2 holds a run of another configuration of smoke/gpt2"):
        pipeline.plan("smoke")
    stale = {t.config: t.stale for t in pipeline.plan("smoke", retrain_stale=True).trainings}
    assert stale["smoke/gpt2"] == "0123456789abcdef" and stale["smoke/diffeqformer"] is None


def test_run_marker_resolves_to_the_run_directory(tmp_path):
    assert Run("smoke/gpt2").path == paths.CONFIG / "smoke" / "gpt2.yaml"
    assert pipeline.planning._resolve({"a": Run("x/y"), "b": [Run("x/y"), 2]}, {"x/y": tmp_path / "r"}) == \
        {"a": str(tmp_path / "r"), "b": [str(tmp_path / "r"), 2]}


def test_a_variant_is_the_config_with_its_overrides_under_its_own_name(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    base = Run("smoke/diffeqformer")
    v = pipeline.variant("smoke/diffeqformer", "smoke-x", {"model.time_embed_dim": 2, "model.hypernet": "shared_mlp",
                                                           "model.random_step_offset": True,
                                                           "optimizer.beta2": 0.95})
    cfg, digest, run_dir = v.identity()
    assert cfg.name == "smoke-x" and run_dir == tmp_path / "smoke-x"
    assert (cfg.model.time_embed_dim, cfg.model.hypernet, cfg.model.random_step_offset) == (2, "shared_mlp", True)
    assert cfg.optimizer.beta2 == 0.95 and digest != base.identity()[1]
    assert v.key.startswith("smoke/diffeqformer --name smoke-x ") and base.key == "smoke/diffeqformer"


def test_a_finetuning_run_is_hashed_with_its_pretraining_before_that_has_run(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    run = Run("smoke/finetune_diffeqformer_lora", module="finetune")
    cfg, digest, run_dir = run.identity()
    assert isinstance(cfg, configs.FinetuneConfig) and run_dir == tmp_path / cfg.name
    pre = configs.load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml")
    assert digest == configs.finetune_hash(cfg, configs.config_hash(pre))
    # a member of a population of fine-tunings: its hash covers the population, as a training's does
    members = pipeline.seeded(run, 2, population=True)
    (first, first_hash, _), (second, second_hash, second_dir) = (m.identity() for m in members)
    assert first_hash == configs.finetune_hash(cfg, configs.config_hash(pre), population=[0, 1]) != digest
    assert second.trainer.seed == 1 and second_dir == tmp_path / f"{cfg.name}-seed1"
    assert second_hash == configs.finetune_hash(second, configs.config_hash(pre), population=[0, 1])


def test_the_presets_page_states_a_config_default_number_of_steps(tmp_path, monkeypatch):
    """A config without num_train_steps trains Levanter's default number of steps: the presets page said "None"."""
    import yaml
    from levanter.trainer import TrainerConfig

    from diffeqformer.pipeline import pages

    for name in ("diffeqformer", "finetune_diffeqformer_lora"):
        config = yaml.safe_load((paths.CONFIG / "smoke" / f"{name}.yaml").read_text())
        del config["trainer"]["num_train_steps"]
        (tmp_path / "x").mkdir(exist_ok=True)
        (tmp_path / "x" / f"{name}.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(paths, "CONFIG", tmp_path)
    steps = TrainerConfig().num_train_steps
    assert pages.config_scale(Run("x/diffeqformer")) == (
        f"32-d, 3 layers or steps, seq 64, {steps} steps of 4 on shakespeare")
    assert pages.config_scale(Run("x/finetune_diffeqformer_lora", module="finetune")) == (
        f"fine-tuning for {steps} steps of 4")
    runs = [Run("x/diffeqformer"), Run("x/finetune_diffeqformer_lora", module="finetune")]
    monkeypatch.setattr(pages.registry, "presets", lambda: {"x": {"nb": {"runs": runs}}})
    page = pages.presets_markdown()
    assert f"{steps} steps of 4 on shakespeare; fine-tuning for {steps} steps of 4" in page and "None" not in page
    assert page.startswith("| preset | training configs | scale |\n")
    assert "`x` executes 1 notebook, in this order: `nb`." in page


def test_presets_page_names_the_notebooks_once():
    """The project's presets all execute the same notebooks: one sentence says which, and the table has no column that
    repeats them (it was cut off at the page's edge)."""
    page = pipeline.pages.presets_markdown()
    table = [line for line in page.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(pipeline.PRESETS) and all(line.count("|") == 4 for line in table)
    names = ", ".join(f"`{nb}`" for nb in pipeline.PRESETS["cpu"])
    assert page.count(names) == 1 and "`smoke`, `cpu`, `gpu` and `paper` execute 11 notebooks" in page


def test_presets_page_counts_the_runs_the_pipeline_trains(tmp_path, monkeypatch):
    """A run that F1 names alone and F6 trains as a population's member is one training: the page said 61 runs for
    the cpu preset, whose pipeline trains 56."""
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    page = pipeline.pages.presets_markdown()
    for preset in pipeline.PRESETS:
        assert f"| `{preset}` | {len(pipeline.plan(preset).trainings)} runs of " in page


def _measured(d_t, params, tps, peak, mfu=None, model="DiffEqFormerConfig"):
    return {"model": model, "layers": 12, "hidden": 768, "seq": 1024, "time_embed_dim": d_t, "batch": 16,
            "params": params, "tokens_per_second": tps, "peak_memory_gib": peak, "mfu": mfu}


def test_gpu_page_reads_its_numbers_from_the_measurement_files(tmp_path):
    """The GPU table and its sentence come from benchmarks/gpu/measure.py's JSON: ratio, MFU and the d_t growth are
    the file's (here made up), and no file gives a sentence saying so, not an empty table."""
    assert "No accelerator measurements" in pipeline.pages.gpu_markdown(tmp_path)
    result = {"date": "2026-01-02", "device": "Some GPU", "jax": "0.11.2", "peak_tflops": 500.0, "pairs": [
        {"pair": "small", "ratio": 0.9, "diffeqformer": _measured(20, 2e8, 90_000, 4.0, 0.25),
         "gpt2": _measured(None, 1e8, 100_000, 3.0, 0.30, "Gpt2Config")}],
        "time_embed_dim": [_measured(80, 8e8, 81_000, 10.0, 0.2)]}
    (tmp_path / "gpu-some-2026-01-02.json").write_text(json.dumps(result))
    page = pipeline.pages.gpu_markdown(tmp_path)
    assert "**Some GPU**, 2026-01-02, JAX 0.11.2, batches of 16 sequences (small: 12 x 768, seq 1024)" in page
    assert "500 TFLOP/s" in page
    assert "| small | DiffEqFormer | 20 | 200M | 90,000 | 0.900 | 25.0% | 4.00 |" in page
    assert "| small | GPT-2 |  | 100M | 100,000 |  | 30.0% | 3.00 |" in page
    assert ("DiffEqFormer trains at 0.90 times GPT-2's tokens/s, the models at 25%-30% model FLOP utilisation. "
            "From d_t = 20 to 80 the parameters grow 4.0 times, the peak memory 2.5 times, and tokens/s change by "
            "-10%.") in page
    # the committed measurements render
    assert "TFLOP/s" in pipeline.pages.gpu_markdown()


def test_gpu_page_renders_a_ladder_of_levers(tmp_path):
    """A ``measure.py --ladder`` file becomes one table: each row's levers, both models' numbers, the ratio, the change
    from the pair's first row; a failed row shows the last line of its error."""
    def pair(tps_ours, tps_gpt, batch=16):
        ours = _measured(20, 2e8, tps_ours, 4.0, 0.25) | {"vocab": 50257, "batch": batch}
        gpt = _measured(None, 1e8, tps_gpt, 3.0, 0.30, "Gpt2Config") | {"vocab": 50257, "batch": batch}
        return {"diffeqformer": ours, "gpt2": gpt, "ratio": tps_ours / tps_gpt}

    result = {"date": "2026-01-02", "device": "Some GPU", "jax": "0.11.2", "peak_tflops": 500.0, "pairs": [],
              "ladder": [{"pair": "small", "row": "levanter-default", **pair(100_000, 100_000)},
                         {"pair": "small", "row": "+cudnn-attention", "error": "Traceback\nValueError: no cuDNN"},
                         {"pair": "small", "row": "+batch-32", **pair(150_000, 120_000, 32)}]}
    (tmp_path / "gpu-some-2026-01-02-ladder.json").write_text(json.dumps(result))
    page = pipeline.pages.gpu_markdown(tmp_path)
    assert "the speed levers one on top of another" in page and "500 TFLOP/s" in page
    assert ("| small | levanter-default | 16 | 50,257 | 100,000 | 25.0% | 4.0 | 100,000 | 30.0% | 3.0 | 1.000 |  |"
            in page)
    assert "| small | +cudnn-attention | | | failed: ValueError: no cuDNN |" in page
    assert ("| small | +batch-32 | 32 | 50,257 | 150,000 | 25.0% | 4.0 | 120,000 | 30.0% | 3.0 | 1.250 "
            "| +50% / +20% |") in page


def test_finetune_runs_lists_the_grid_with_pretrainings_first():
    runs = pipeline.finetune_runs("cpu")
    names = list(runs)
    # N = 9, 18, 24 at cpu; each of the 4 pretrainings with 3 seeds (one population), each fine-tuning setting's 3
    # members trained together, member k from pretraining seed k; the 2 scratch runs alone
    assert len(names) == 4 * 3 + 16 * 3 + 2 and names[:12] == [n for n in names if "-pretrain-" in n]
    assert all(runs[n].module == "finetune" and runs[n].population == (0, 1, 2) for n in names if "-finetune-" in n)
    assert all(runs[n].module == "train" and runs[n].population == (0, 1, 2) for n in names if "-pretrain-" in n)
    assert all(runs[n].module == "train" and not runs[n].population for n in names if "-scratch-" in n)
    members = runs["cpu-finetune-gpt2_24-plays-to-prose-lora"], runs["cpu-finetune-gpt2_24-plays-to-prose-lora-seed2"]
    assert members[0].population_key == members[1].population_key
    assert [r.load().trainer.seed for r in members] == [0, 2]
    assert [r.load().pretrain.member for r in members] == [0, 2]
    # the registry's f7 entry trains exactly these
    assert pipeline.PRESETS["cpu"]["f7_finetuning"]["runs"] == runs


def test_a_finetuning_waits_for_its_pretraining_in_the_plan(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    trainings = {t.config: t for t in pipeline.plan("smoke").trainings}
    lora = next(t for t in trainings.values() if t.config.startswith("smoke/finetune_gpt2_lora"))
    assert lora.after == ("smoke/gpt2",) and trainings["smoke/gpt2"].after == ()
    cpu = pipeline.plan("cpu").trainings
    grid = [t for t in cpu if t.run.module == "finetune"]
    assert len(grid) == 16 * 3 and all(len(t.after) == 1 and t.after[0].startswith("cpu/pretrain_") for t in grid)
    assert len({t.population_key for t in grid}) == 16  # one population a setting
    assert len({t.data for t in cpu}) == 4  # all, plays, prose, synthetic: four token caches to prepare


def _runs_notebook(tmp_path):
    """A notebook 'nb' that declares ``runs: list`` and nothing else, and its table of contents: (folder, toc)."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    params = nbformat.v4.new_code_cell('preset: str = "x"\nruns: list = []')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    nbformat.write(nb, nbdir / "nb.ipynb")
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: book/intro\nchapters:\n- file: notebooks/nb\n")
    return nbdir, toc


def test_a_finetuning_waits_for_the_run_its_pretrain_run_dir_names(tmp_path, monkeypatch):
    """``pretrain.run_dir`` overrides where the pretraining is read from: the dependency follows it; a run of another
    configuration there is refused before anything trains (the fine-tuning would refuse it: runs.pretraining)."""
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    nbdir, toc = _runs_notebook(tmp_path)
    elsewhere = str(tmp_path / "runs" / "smoke-gpt2-other")
    other = Run("smoke/gpt2", ("--run_dir", elsewhere))  # the pretraining's configuration, in another directory
    lora = Run("smoke/finetune_gpt2_lora", ("--pretrain.run_dir", elsewhere), module="finetune")
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), other, lora])}}
    trainings = {t.config: t for t in pipeline.plan("t", registry=registry, notebooks_dir=nbdir, toc=toc).trainings}
    assert trainings[lora.key].after == (other.key,)
    changed = pipeline.variant("smoke/gpt2", "smoke-gpt2-other", {"optimizer.beta2": 0.95})
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), changed, lora])}}
    with pytest.raises(PipelineError, match="names another configuration of it"):
        pipeline.plan("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), lora])}}  # nothing trains what it names
    with pytest.raises(PipelineError, match="needs the pretrained run .*smoke-gpt2-other, which is not finished"):
        pipeline.plan("t", registry=registry, notebooks_dir=nbdir, toc=toc)


class _FakeWorker:
    """Stands in for a training process: records what it was sent, sleeps, fails on request."""

    log: list = []
    fail: str | None = None
    started = 0
    seconds: dict = {}
    sent: list = []
    cpus: list = []

    def __init__(self, log, env, cpus=None):
        type(self).started += 1
        type(self).cpus.append(cpus)
        self.runs = 0
        self.proc = self

    def poll(self):
        return None

    def terminate(self):
        pass

    def do(self, spec):
        type(self).sent.append(spec)
        for one in spec.get("members", [spec]):  # a population's members, trained together
            self.do_one(one)
        self.runs += 1

    def do_one(self, spec):
        import time as _time

        name = spec["overrides"][1] if spec["overrides"] else spec["config"]
        type(self).log.append(("start", name, spec["prepare"]))
        _time.sleep(type(self).seconds.get(name, 0.05) if not spec["prepare"] else 0.01)
        if name == type(self).fail and not spec["prepare"]:
            raise PipelineError(f"training failed: {name}")
        if not spec["prepare"]:  # what a training leaves: its complete.json, for the config hash "h"
            run_dir = Path(spec["config"]).with_suffix("")
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "complete.json").write_text(json.dumps({"config_hash": "h"}))
        type(self).log.append(("done", name, spec["prepare"]))

    def close(self, kill=False):
        pass


def _fake_trainings(tmp_path, names_after):
    out = []
    for name, after, data in names_after:
        t = pipeline.Training(name, tmp_path / f"{name}.yaml", name, tmp_path / name, "h", False,
                              run=Run("x", ("--name", name)), after=after, data=data)
        t.config = name
        out.append(t)
    return out


@pytest.mark.parametrize("prune", [False, True])
def test_a_complete_runs_checkpoints_are_pruned_when_asked(tmp_path, monkeypatch, prune):
    """With ``DIFFEQFORMER_PRUNE_CHECKPOINTS=1`` (a GPU machine's small disk) the checkpoints of a run the lanes
    finished are deleted, its summary kept; without it they stay (resume, as on this machine)."""
    from diffeqformer.pipeline import processes

    class Checkpointing(_FakeWorker):
        def do_one(self, spec):
            run_dir = Path(spec["config"]).with_suffix("")
            if not spec["prepare"]:
                (run_dir / runs.CHECKPOINTS / "step-1").mkdir(parents=True)
            super().do_one(spec)

    monkeypatch.setattr(pipeline.lanes, "_Worker", Checkpointing)
    if prune:
        monkeypatch.setenv(processes.PRUNE_CHECKPOINTS, "1")
    else:
        monkeypatch.delenv(processes.PRUNE_CHECKPOINTS, raising=False)
    Checkpointing.log, Checkpointing.fail = [], None
    trainings = _fake_trainings(tmp_path, [("a", (), "a")])
    progress = pipeline.Progress([(f"train {t.config}", 1.0) for t in trainings], io.StringIO())
    pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=1)
    assert runs.is_complete(tmp_path / "a", "h")
    assert runs.has_checkpoints(tmp_path / "a") is not prune


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_training_lanes_respect_dependencies_and_prepare_each_dataset_once(tmp_path, monkeypatch, lanes):
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    monkeypatch.setattr(pipeline.lanes, "RUNS_PER_WORKER", 2)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started = [], None, 0
    trainings = _fake_trainings(tmp_path, [("pre", (), "a"), ("other", (), "b"), ("ft1", ("pre",), "c"),
                                           ("ft2", ("pre",), "c"), ("last", (), "a")])
    out = io.StringIO()
    progress = pipeline.Progress([(f"train {t.config}", 1.0) for t in trainings], out)
    seconds = pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=lanes)
    assert set(seconds) == {"pre", "other", "ft1", "ft2", "last"}
    prepared = [name for what, name, prep in _FakeWorker.log if prep and what == "done"]
    assert prepared == ["pre", "other", "ft1"]  # one run per distinct dataset, before any training
    events = [(what, name) for what, name, prep in _FakeWorker.log if not prep]
    assert events.index(("done", "pre")) < events.index(("start", "ft1"))
    assert events.index(("done", "pre")) < events.index(("start", "ft2"))
    assert _FakeWorker.started >= -(-5 // 2)  # a fresh process after every RUNS_PER_WORKER runs
    assert out.getvalue().count("done in") == 5


def test_each_lane_trains_on_cores_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    monkeypatch.setattr(pipeline.lanes.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7, 8}, raising=False)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.cpus = [], None, []
    trainings = _fake_trainings(tmp_path, [("a", (), "d"), ("b", (), "d"), ("c", (), "d")])
    progress = pipeline.Progress([(f"train {t.config}", 1.0) for t in trainings], io.StringIO())
    pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2)
    assert sorted(_FakeWorker.cpus) == [[4, 5], [6, 7]]  # lane 0's process prepared the data, then trained
    # the number of lanes asked for splits the cores, also when fewer runs than lanes are left (same threads, same
    # bits, whether a run trains beside another or alone, or resumes); one lane, or more lanes than cores: no pinning
    assert pipeline.lanes.lane_cpus(1, 2) == [6, 7] and pipeline.lanes.lane_cpus(0, 5) == [4]
    assert pipeline.lanes.lane_cpus(0, 1) is None and pipeline.lanes.lane_cpus(0, 6) is None
    _FakeWorker.cpus = []
    pipeline.train_runs(_fake_trainings(tmp_path, [("alone", (), "d")]), progress, 0, tmp_path / "train.log", lanes=2)
    assert _FakeWorker.cpus == [[4, 5]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the system cannot pin processes")
def test_a_training_process_pins_itself_to_its_lanes_cores(tmp_path):
    from diffeqformer import ONEDNN_FLAG
    from diffeqformer.pipeline import processes

    core = min(os.sched_getaffinity(0))
    worker = pipeline.lanes._Worker(tmp_path / "worker.log", dict(os.environ), [core])
    try:
        deadline = time.time() + 60
        while os.sched_getaffinity(worker.proc.pid) != {core}:
            assert worker.proc.poll() is None and time.time() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.05)
    finally:
        worker.close()
    # and a pinned process allocates from one heap (on one core it compiles no slower), one on every core does not;
    # both train with oneDNN's CPU kernels (diffeqformer.use_onednn)
    env = {"GLIBC_TUNABLES": processes.keep_heap(None), pipeline.lanes.WORKER_CPUS: "7"}
    pinned, free = pipeline.lanes.worker_env(env, [core]), pipeline.lanes.worker_env(env, None)
    assert pinned == {"GLIBC_TUNABLES": ":".join(processes.KEPT_HEAP + processes.ONE_ARENA),
                      pipeline.lanes.WORKER_CPUS: str(core), "XLA_FLAGS": ONEDNN_FLAG}
    assert free == {"GLIBC_TUNABLES": processes.keep_heap(None), "XLA_FLAGS": ONEDNN_FLAG}


def test_the_processes_of_a_pipeline_reuse_freed_memory(tmp_path, monkeypatch):
    """``run`` sets the heap settings (``processes.KEPT_HEAP``) for every process it starts: a notebook's Papermill
    child and a training worker are started with them, a worker pinned to cores of its own with one arena too. What
    the settings save (page faults, with glibc) depends on the machine: ``benchmarks/pipeline_overheads.py`` measures
    it."""
    from diffeqformer.pipeline import build, notebooks, processes

    assert processes.keep_heap(None) == ":".join(processes.KEPT_HEAP)
    assert processes.keep_heap("glibc.malloc.trim_threshold=0:glibc.rtld.x=1") == \
        ":".join(["glibc.malloc.trim_threshold=0", "glibc.rtld.x=1", processes.KEPT_HEAP[0]])  # the user's stay
    assert processes.keep_heap("a=1", processes.ONE_ARENA) == ":".join(["a=1", *processes.ONE_ARENA])
    assert not any("arena" in t for t in processes.KEPT_HEAP)  # one arena slowed multi-threaded compilation
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)  # restored after the test
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)

    def stop(*args, **kwargs):
        raise PipelineError("stopped after setting up the environment")

    monkeypatch.setattr(build, "plan", stop)
    with pytest.raises(PipelineError, match="stopped"):
        build.run("smoke")
    assert os.environ["GLIBC_TUNABLES"] == processes.keep_heap(None)
    # and JAX in every process it starts allocates GPU memory as it needs it, so that lanes and kernels share a GPU
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # the user's choice wins
    with pytest.raises(PipelineError, match="stopped"):
        build.run("smoke")
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"

    class Started(Exception):
        pass

    started: list[dict] = []

    def popen(args, **kwargs):  # records the environment a child process would get, and starts nothing
        started.append(kwargs["env"])
        raise Started

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(Started):
        notebooks.execute_notebook(pipeline.NotebookJob("nb", tmp_path / "nb.ipynb", {}, []), tmp_path / "staging",
                                   tmp_path / "notebooks.log")
    trainings = _fake_trainings(tmp_path, [("a", (), "a")])
    progress = pipeline.Progress([(t.config, 1.0) for t in trainings], io.StringIO())
    for lanes in (1, 2):
        with pytest.raises(Started):
            pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=lanes)
    pinned = pipeline.lanes.lane_cpus(0, 2) is not None
    assert [env["GLIBC_TUNABLES"] for env in started] == [
        processes.keep_heap(None), processes.keep_heap(None),
        processes.keep_heap(processes.keep_heap(None), processes.ONE_ARENA) if pinned else processes.keep_heap(None)]


def test_a_failed_run_stops_the_other_lanes_with_its_error(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started = [], "pre", 0
    trainings = _fake_trainings(tmp_path, [("pre", (), "a"), ("ft", ("pre",), "a"), ("x", (), "a")])
    progress = pipeline.Progress([(t.config, 1.0) for t in trainings], io.StringIO())
    with pytest.raises(PipelineError, match="training failed: pre"):
        pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2)
    assert ("start", "ft", False) not in _FakeWorker.log  # its pretraining failed: never started


def test_notebooks_execute_in_the_lanes_as_soon_as_their_runs_are_complete(tmp_path, monkeypatch):
    """A notebook whose runs are complete executes while a long run still trains (before the runs that wait), a
    notebook that measures the machine (``RUNS_ALONE``) only when nothing else is left or running."""
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    monkeypatch.setattr(pipeline.lanes, "RUNS_ALONE", frozenset({"nb_alone"}))
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started = [], None, 0
    _FakeWorker.seconds = {"long": 0.6}
    trainings = _fake_trainings(tmp_path, [("long", (), "a"), ("short", (), "a"), ("more1", (), "a"),
                                           ("more2", (), "a")])
    trainings[0].steps = 100  # trained first
    jobs = [pipeline.NotebookJob(name, tmp_path / f"{name}.ipynb", {}, runs)
            for name, runs in (("nb_alone", ["short"]), ("nb_long", ["long"]), ("nb_short", ["short"]))]

    def execute(job):
        _FakeWorker.log.append(("start", job.name, False))
        time.sleep(0.05)
        _FakeWorker.log.append(("done", job.name, False))
        return 0.05

    progress = pipeline.Progress([(t.config, 1.0) for t in trainings] + [(j.name, 1.0) for j in jobs],
                                 io.StringIO())
    seconds = pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2,
                                  notebooks=[(4 + i, j) for i, j in enumerate(jobs)], execute=execute)
    events = [(what, name) for what, name, prep in _FakeWorker.log if not prep]
    assert events.index(("done", "short")) < events.index(("start", "nb_short")) < events.index(("done", "long"))
    assert events.index(("start", "nb_short")) < events.index(("start", "more2"))  # before the runs still waiting
    assert events.index(("done", "long")) < events.index(("start", "nb_long"))
    assert events[-2:] == [("start", "nb_alone"), ("done", "nb_alone")]  # alone, after everything else
    assert {"notebook:nb_alone", "notebook:nb_long", "notebook:nb_short", "long", "short"} <= set(seconds)


def test_the_smoke_preset_runs_no_notebook_alone(tmp_path, monkeypatch):
    """``runs_alone``: F9 measures the machine alone in the cpu preset, not in the smoke preset (a test of the
    pipeline); with ``alone`` empty a notebook in ``RUNS_ALONE`` runs as soon as its runs are complete."""
    assert pipeline.lanes.runs_alone("cpu") == pipeline.RUNS_ALONE == {"f9_time_embedding"}
    assert pipeline.lanes.runs_alone("smoke") == frozenset()
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started = [], None, 0
    _FakeWorker.seconds = {"long": 0.6}
    trainings = _fake_trainings(tmp_path, [("long", (), "a"), ("short", (), "a")])
    trainings[0].steps = 100
    job = pipeline.NotebookJob("f9_time_embedding", tmp_path / "f9.ipynb", {}, ["short"])

    def execute(job):
        _FakeWorker.log.append(("start", job.name, False))
        _FakeWorker.log.append(("done", job.name, False))
        return 0.0

    progress = pipeline.Progress([(t.config, 1.0) for t in trainings] + [(job.name, 1.0)], io.StringIO())
    pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2, notebooks=[(2, job)],
                        execute=execute, alone=pipeline.lanes.runs_alone("smoke"))
    events = [(what, name) for what, name, prep in _FakeWorker.log if not prep]
    assert events.index(("start", "f9_time_embedding")) < events.index(("done", "long"))  # beside the long run


def test_a_failed_notebook_stops_the_lanes_and_keeps_what_was_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started, _FakeWorker.seconds = [], None, 0, {}
    trainings = _fake_trainings(tmp_path, [("a", (), "a"), ("b", (), "a"), ("c", (), "a")])
    job = pipeline.NotebookJob("nb", tmp_path / "nb.ipynb", {}, ["a"])

    def execute(job):
        raise PipelineError("notebook nb failed in cell 2: ValueError: no")

    seconds: dict = {}
    progress = pipeline.Progress([(t.config, 1.0) for t in trainings] + [("nb", 1.0)], io.StringIO())
    with pytest.raises(PipelineError, match="notebook nb failed in cell 2"):
        pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=1, notebooks=[(3, job)],
                            execute=execute, seconds=seconds)
    assert list(seconds) == ["a"]  # the run trained before the notebook failed, measured
    assert ("start", "b", False) not in _FakeWorker.log  # nothing started after the failure


def test_a_training_that_leaves_no_complete_run_stops_before_its_notebooks(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started, _FakeWorker.seconds = [], None, 0, {}
    trainings = _fake_trainings(tmp_path, [("a", (), "a")])
    trainings[0].config_hash = "another"  # the fake worker writes hash "h"
    job = pipeline.NotebookJob("nb", tmp_path / "nb.ipynb", {}, ["a"])
    progress = pipeline.Progress([("a", 1.0), ("nb", 1.0)], io.StringIO())
    with pytest.raises(PipelineError, match="did not finish for config a"):
        pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2, notebooks=[(1, job)],
                            execute=lambda job: pytest.fail("the notebook ran on an unfinished run"))


def test_a_population_trains_in_one_lane_as_one_spec(tmp_path, monkeypatch):
    """The members of a population go to one worker as one spec (``module: population``), with every member; each
    member is checked complete and counted for its share of the time."""
    monkeypatch.setattr(pipeline.lanes, "_Worker", _FakeWorker)
    _FakeWorker.log, _FakeWorker.fail, _FakeWorker.started, _FakeWorker.seconds = [], None, 0, {}
    _FakeWorker.sent = sent = []
    trainings = _fake_trainings(tmp_path, [("p0", (), "a"), ("p1", (), "a"), ("solo", (), "a")])
    for t in trainings[:2]:
        t.run = Run("x", ("--name", t.config), population=(0, 1))
    out = io.StringIO()
    progress = pipeline.Progress([(t.config, 1.0) for t in trainings], out)
    seconds = pipeline.train_runs(trainings, progress, 0, tmp_path / "train.log", lanes=2)
    units = [s for s in sent if not s["prepare"]]
    assert sorted(len(s.get("members", [s])) for s in units) == [1, 2]
    population = next(s for s in units if "members" in s)
    assert population["module"] == "population" and [m["overrides"][1] for m in population["members"]] == ["p0", "p1"]
    assert set(seconds) == {"p0", "p1", "solo"} and seconds["p0"] == seconds["p1"]
    assert out.getvalue().count("one of a population of 2, trained together") == 2


def test_a_run_that_is_a_population_member_elsewhere_is_that_member(tmp_path):
    """F1's ``Run("cpu/diffeqformer")`` is the first seed of F6's population: one training, one run directory."""
    plan = pipeline.plan("cpu")
    by_dir = {}
    for t in plan.trainings:
        assert t.run_dir not in by_dir, (t.config, by_dir.get(t.run_dir))
        by_dir[t.run_dir] = t
    ours = by_dir[paths.RUNS / "cpu-diffeqformer"]
    assert ours.run.population == tuple(range(pipeline.registry.PRIMARY_SEEDS))  # F6's primary pair's population
    f1 = next(j for j in plan.notebooks if j.name == "f1_model")
    assert f1.runs == [ours.config]
    units = pipeline.lanes.training_units(plan.trainings)
    synthetic = next(u for u in units if u[0].name == "cpu-synthetic-diffeqformer")
    assert [t.name for t in synthetic] == [f"cpu-synthetic-diffeqformer{s}" for s in ("", "-seed1", "-seed2")]
    # every compared setting of F5, F6, F8-F10 but F6's primary pair, F7's 4 pretrainings and 16 fine-tunings
    assert sum(len(u) == 3 for u in units) == 9 + 4 + 16
    assert sum(len(u) == pipeline.registry.PRIMARY_SEEDS for u in units) == 2  # GPT-2 and DiffEqFormer


def test_a_finetuning_of_a_population_member_is_refused_before_training(tmp_path):
    nbdir, toc = _runs_notebook(tmp_path)
    member = pipeline.seeded(Run("smoke/diffeqformer"), 2, population=True)
    lora = Run("smoke/finetune_diffeqformer_lora", module="finetune")  # pretrains on smoke-diffeqformer
    with pytest.raises(PipelineError, match="trained in a population"):
        pipeline.plan("t", registry={"t": {"nb": dict(runs=[*member, lora])}}, notebooks_dir=nbdir, toc=toc)


def test_two_trainings_into_one_run_directory_are_refused(tmp_path):
    nbdir, toc = _runs_notebook(tmp_path)
    alone = Run("smoke/gpt2", ("--trainer.seed", "1"))
    member = Run("smoke/gpt2", ("--trainer.seed", "1", "--name", "smoke-gpt2"), population=(0, 1))
    with pytest.raises(PipelineError, match="would both train into"):
        pipeline.plan("t", registry={"t": {"nb": dict(runs=[alone, member])}}, notebooks_dir=nbdir, toc=toc)


def test_the_prepare_step_leaves_finished_token_caches(tmp_path):
    """The training lanes start only after one process has built every token cache; Levanter builds a cache in a
    background actor, which dies with its process: the prepare step must wait for it (a fresh clone failed so)."""
    import shutil
    import subprocess
    import sys

    from diffeqformer.data import corpora as data

    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    shutil.copy(data.fetch_archive(), raw)
    spec = json.dumps({"config": str(paths.CONFIG / "smoke" / "gpt2.yaml"), "overrides": [], "module": "train",
                       "prepare": True})
    out = subprocess.run([sys.executable, "-m", "diffeqformer.pipeline", "--train-worker"], input=spec + "\n",
                         capture_output=True, text=True, timeout=600, cwd=paths.REPO,
                         env={**os.environ, "DIFFEQFORMER_HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip() == "@pipeline done", out.stderr[-3000:]
    ledgers = sorted(tmp_path.glob("data/cache/shakespeare/levanter/*/*/*/shard_ledger.json"))
    assert [p.parent.name for p in ledgers] == ["train", "validation"]
    assert all(json.loads(p.read_text())["is_finished"] for p in ledgers)


# --------------------------------------------------------------------------------------------- end to end


@pytest.mark.pipeline
def test_smoke_pipeline_end_to_end(smoke_book):  # noqa: F811
    """Every notebook of the smoke preset executes, every figure file exists and is not empty, the book builds with
    warnings as errors; a second run with nothing changed trains, executes and builds nothing."""
    book = smoke_book
    assert book.first.returncode == 0, book.first.explain()
    state = json.loads((book.home / "_build" / "pipeline" / "state.json").read_text())
    assert set(state["presets"]["smoke"]["notebooks"]) == set(pipeline.PRESETS["smoke"])
    figures = book.home / "figures"
    records = [json.loads(p.read_text()) for p in figures.glob("*.json")]
    names = {r["figure"] for r in records}
    assert {"f1_schematic", "f1_weights", "f6_curves", "f6_table"} <= names
    for record in records:
        assert "Scale: smoke preset" in record["caption"]
        # provenance names runs relative to the home ('runs/smoke-gpt2'), not by this machine's paths
        assert record["runs"] and all(r.startswith("runs/") for r in record["runs"]), record["runs"]
        assert str(book.home) not in json.dumps(record), record["figure"]
        for f in record["files"]:
            assert (figures / f).stat().st_size > 0, f
    plots = {r["figure"] for r in records if any(f.endswith(".png") for f in r["files"])}  # tables are CSV only
    assert {"f1_schematic", "f2_radius", "f4_controls", "f5_lyapunov_map", "f6_curves"} <= plots
    for name in plots:
        assert (figures / f"{name}.png").stat().st_size > 1000 and (figures / f"{name}.svg").stat().st_size > 0
    assert (book.html / "index.html").exists()
    for nb in pipeline.PRESETS["smoke"]:
        assert (book.html / "notebooks" / f"{nb}.html").exists(), nb

    assert book.second is not None and book.second.returncode == 0, book.second.explain()
    assert "(0 to train)" in book.second.stdout
    assert book.second.stdout.count("(cached") == len(pipeline.PRESETS["smoke"]) + 1  # notebooks and the book
    # and it did so: no run trained, no notebook executed, no book built (the seconds it takes:
    # benchmarks/pipeline_overheads.py --cached-rerun)
    assert not book.rewritten, f"a run with nothing to do rewrote {book.rewritten[:10]}"


def test_a_worker_and_what_it_started_end_with_the_pipeline(tmp_path):
    """A pipeline (here a stand-in) SIGKILLed: its worker, which calls ``exit_with_parent``, ends, and so does the
    process the worker started (as a Papermill child starts a notebook kernel), which nothing else would end."""
    import signal

    import psutil

    worker = ("import subprocess, sys, time; from diffeqformer.pipeline import processes; "
              "processes.exit_with_parent(); "
              "kernel = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(kernel.pid, flush=True); time.sleep(60)")
    pipeline_stand_in = ("import subprocess, sys, time; "
                         f"w = subprocess.Popen([sys.executable, '-c', {worker!r}]); print(w.pid, flush=True); "
                         "time.sleep(60)")
    stand_in = subprocess.Popen([sys.executable, "-c", pipeline_stand_in], stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(stand_in.stdout.readline())
        deadline = time.time() + 60
        while not psutil.Process(worker_pid).children() and time.time() < deadline:
            time.sleep(0.1)
        kernel = psutil.Process(worker_pid).children()[0]
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait()
        gone, alive = psutil.wait_procs([psutil.Process(worker_pid), kernel], timeout=10)
        assert alive == [], f"still running 10 s after the pipeline was killed: {alive}"
    finally:
        stand_in.kill()


def test_a_child_that_starts_after_the_pipeline_died_ends_at_once():
    """The race of kill seed 721367364 (``make test-slow``): a Papermill child still importing when the pipeline was
    SIGKILLed had been handed to another parent before it called ``exit_with_parent``, took that one for the
    pipeline and lived on. Given the pipeline's pid (``processes.child_env``), it ends at once; its own children do
    not inherit that pid."""
    from diffeqformer.pipeline import processes

    child = ("import os, sys, time; from diffeqformer.pipeline import processes; "
             "processes.exit_with_parent(poll_s=0.05); "
             "print(os.environ.get(processes.PARENT_PID), flush=True); time.sleep(30)")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid whose process has ended: the pipeline, died before the child looked
    env = {**os.environ, processes.PARENT_PID: str(dead.pid)}
    ended = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=25)
    assert ended.returncode == 1, ended.stdout + ended.stderr
    alive = subprocess.Popen([sys.executable, "-c", child], env=processes.child_env(os.environ),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert alive.stdout.readline().strip() == "None"  # removed: what it starts does not inherit it
        time.sleep(0.5)
        assert alive.poll() is None  # its parent, this process, is alive
    finally:
        alive.kill()
        alive.wait()


def test_gpu_install_names_a_missing_part_and_how_to_stage_it(tmp_path):
    """benchmarks/gpu/run.sh on a GPU machine where a part of the bundle was not copied: it installs nothing, names
    the part and says what to copy and run."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    (wheels / "manifest.json").write_text(json.dumps({"parts": [["a.whl"], ["b.whl", "c.whl"]]}))
    (wheels / "a.whl").write_text("")
    (wheels / "b.whl").write_text("")
    out = subprocess.run(["bash", str(paths.REPO / "benchmarks" / "gpu" / "run.sh"), "install"], capture_output=True,
                         text=True, env={**os.environ, "DIFFEQFORMER_WHEELS": str(wheels),
                                         "DIFFEQFORMER_SITE": str(site), "PYTHON": sys.executable})
    assert out.returncode != 0 and not site.exists()
    assert "not staged on this machine: part-2 (1 of 2 wheels)" in out.stderr
    assert "Copy .gpu/part-2 into this working tree, then: bash benchmarks/gpu/run.sh stage install" in out.stderr


def test_a_notebook_waits_for_a_busy_kernels_output(monkeypatch, tmp_path):
    """Papermill makes nbclient's 4 s wait for a finished cell's output an error; on a machine busy with other work
    that failed F3's notebook in a `make book`. The pipeline's notebooks wait minutes (``IOPUB_TIMEOUT_S``)."""
    import papermill

    from diffeqformer.pipeline import processes

    seen = {}
    monkeypatch.setattr(processes, "exit_with_parent", lambda: None)
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: seen.update(kwargs))
    processes.execute_notebook_child({"input": "in.ipynb", "output": str(tmp_path / "out.ipynb"), "parameters": {},
                                      "error": str(tmp_path / "error.json")})
    assert seen["iopub_timeout"] == processes.IOPUB_TIMEOUT_S >= 60
