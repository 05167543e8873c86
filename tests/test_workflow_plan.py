"""diffeqformer.workflow.plan and .presets: every preset validates and resolves into the jobs ``workflow/Snakefile``
schedules (token caches, trainings with their markers, notebooks with the markers they read and the sources they
import), bad parameters are rejected before anything runs, the registry and ``_toc.yml`` agree; and the pages the
book job writes from the registry."""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from diffeqformer import config as configs
from diffeqformer import paths
from diffeqformer.report import book
from diffeqformer.workflow import pages, plan, presets
from diffeqformer.workflow.plan import WorkflowError
from diffeqformer.workflow.presets import Run

PRESETS = list(presets.presets())


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """An empty DIFFEQFORMER_HOME for the module's plans: what is trained locally does not matter here."""
    return tmp_path_factory.mktemp("home")


def _in_home(monkeypatch, home: Path) -> None:
    """``paths.HOME`` and ``paths.RUNS`` (which the configs' run directories are read from) below ``home``."""
    monkeypatch.setattr(paths, "HOME", home)
    monkeypatch.setattr(paths, "RUNS", home / "runs")


@pytest.fixture(scope="module")
def planned(home):
    """``planned(preset)``: ``plan.make(preset)`` in the empty ``home``, made once per module."""
    made: dict[str, dict] = {}

    def get(preset: str) -> dict:
        if preset not in made:
            with pytest.MonkeyPatch.context() as mp:
                _in_home(mp, home)
                made[preset] = plan.make(preset)
        return copy.deepcopy(made[preset])

    return get


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


def _by_run(made: dict) -> dict[str, dict]:
    """Run directory (``runs/<name>``) -> the training job that trains it."""
    return {r: job for job in made["trainings"] for r in job["runs"]}


# ----------------------------------------------------------------------------------------------- the registry


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_validates(preset, planned):
    """Every registered notebook exists, is in _toc.yml, declares the parameters it gets with the right types, and
    every training config parses; every training reads configs that exist and a token cache of the plan, and trains
    runs of the preset's own (``runs/<preset>-...``)."""
    made = planned(preset)
    assert made["preset"] == preset
    assert [j["name"] for j in made["notebooks"]] == list(presets.presets()[preset])
    assert made["trainings"] and made["tokens"]
    for job in made["trainings"]:
        assert job["configs"] and all(Path(c).exists() for c in job["configs"]), job["name"]
        assert all(r.startswith(f"runs/{preset}-") for r in job["runs"]), job["runs"]
        assert job["tokens"] in made["tokens"]
    for job in made["notebooks"]:
        assert job["parameters"]["preset"] == preset
        assert Path(job["path"]).exists() and job["sources"], job["name"]


def test_toc_and_registry_agree():
    in_toc = set(plan.toc_notebooks())
    for preset, entries in presets.presets().items():
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
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
            f"{path.name}: the first cell is the page's title"
        questions = [p for c in nb.cells if c.cell_type == "markdown" for p in c.source.split("\n\n")
                     if p.startswith("**The question.**")]
        assert len(questions) == 1 and questions[0].endswith("?"), \
            f"{path.name}: one paragraph states the page's question ('**The question.** ...?')"
        before = [c.source for c in itertools.takewhile(lambda c: "## What it shows" not in c.source, nb.cells)]
        assert any(questions[0] in s for s in before), f"{path.name}: the page asks its question before what it shows"


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
    defaults name are runs that preset trains for it: run by hand, it reads what ``make book`` (or the gpu workflow)
    trained."""
    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")):
        defaults = _defaults(path, gpu=gpu)
        assert defaults["preset"] == preset, path.name
        entry = presets.presets()[preset][path.stem]
        trained = plan.collect_runs(entry)
        names = _run_names([defaults[k] for k in entry])  # the parameters the workflow passes (not a name stem)
        assert names <= {f"runs/{r.load().name}" for r in trained}, path.name


# ------------------------------------------------------------------------------------------ bad input, early


def test_unknown_preset_is_named():
    with pytest.raises(WorkflowError, match="unknown preset 'huge'; choose one of: smoke, cpu"):
        plan.make("huge")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"f1_model": {"sed": 3}}, "f1_model: parameter 'sed' is not declared"),
        ({"f1_model": {"seed": "three"}}, "f1_model: parameter 'seed' must be int"),
        ({"f1_model": {"num_entries": 2.5}}, "f1_model: parameter 'num_entries' must be int"),
        ({"f6_perplexity": {"runs": ["runs/x"]}}, "f6_perplexity: parameter 'runs' must be dict"),
        ({"f6_perplexity": {"log_scale": 1}}, "f6_perplexity: parameter 'log_scale' must be bool"),
        ({"f9_nothing": {"seed": 1}}, "set names notebook 'f9_nothing', which preset 'smoke' does not run"),
    ],
)
def test_bad_parameters_are_rejected_before_anything_runs(tmp_path, monkeypatch, overrides, message):
    """``plan.load``, which the Snakefile calls before it defines a job, refuses them and writes no plan."""
    _in_home(monkeypatch, tmp_path)
    with pytest.raises(WorkflowError, match=message):
        plan.load("smoke", overrides)
    assert not any(tmp_path.iterdir()), "nothing may be written before the parameters are checked"


def test_overrides_parse_as_yaml():
    parsed = plan.parse_overrides(["f1_model.seed=3", "f6_perplexity.runs={gpt: runs/a}", "f1_model.run="])
    assert parsed == {"f1_model": {"seed": 3, "run": ""}, "f6_perplexity": {"runs": {"gpt": "runs/a"}}}
    with pytest.raises(WorkflowError, match="NOTEBOOK.PARAMETER=VALUE"):
        plan.parse_overrides(["seed=3"])


@pytest.mark.parametrize(
    "value,typed,default,ok",
    [
        (3, "int", "1", True), (True, "int", "1", False), (3, "float", "1.0", True), (3.5, "int", "1", False),
        ("a", "str", "'x'", True), (True, "bool", "False", True), (1, "bool", "False", False),
        ([1, 2], "list", "[]", True), ({"a": "b"}, "dict", "{}", True), ("a", "dict", "{}", False),
        (2, None, "3", True), ("2", None, "3", False), ("x", None, "None", True), (None, None, "f(1)", True),
    ],
)
def test_a_parameter_must_fit_its_annotation_else_its_default(value, typed, default, ok):
    declared = {"p": {"inferred_type_name": typed, "default": default}}
    if ok:
        plan.check_parameters("nb", {"p": value}, declared)
    else:
        with pytest.raises(WorkflowError, match="nb: parameter 'p' must be "):
            plan.check_parameters("nb", {"p": value}, declared)


def test_registry_and_toc_must_agree(tmp_path):
    """A notebook in _toc.yml that the preset does not run, one the preset runs that is not in _toc.yml, and one
    that does not exist are each refused by name."""
    nbdir, toc = _runs_notebook(tmp_path)
    shutil.copy(nbdir / "nb.ipynb", nbdir / "other.ipynb")
    with pytest.raises(WorkflowError, match="'nb' is in _toc.yml but preset 't' does not run it"):
        plan.make("t", registry={"t": {}}, notebooks_dir=nbdir, toc=toc)
    with pytest.raises(WorkflowError, match="notebook 'other' is run by preset 't' but is not in _toc.yml"):
        plan.make("t", registry={"t": {"nb": {}, "other": {}}}, notebooks_dir=nbdir, toc=toc)
    with pytest.raises(WorkflowError, match="preset 't' runs notebook 'gone', but .*gone.ipynb does not exist"):
        plan.make("t", registry={"t": {"nb": {}, "gone": {}}}, notebooks_dir=nbdir, toc=toc)


# ------------------------------------------------------------------------------------------------- the runs


def test_a_variant_is_the_config_with_its_overrides_under_its_own_name(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    base = Run("smoke/diffeqformer")
    v = presets.variant("smoke/diffeqformer", "smoke-x", {"model.time_embed_dim": 2, "model.hypernet": "shared_mlp",
                                                          "model.random_step_offset": True,
                                                          "optimizer.beta2": 0.95})
    cfg, digest, run_dir = v.resolve()[:3]
    assert cfg.name == "smoke-x" and run_dir == tmp_path / "smoke-x"
    assert (cfg.model.time_embed_dim, cfg.model.hypernet, cfg.model.random_step_offset) == (2, "shared_mlp", True)
    assert cfg.optimizer.beta2 == 0.95 and digest != base.resolve()[:3][1]
    assert v.key.startswith("smoke/diffeqformer --name smoke-x ") and base.key == "smoke/diffeqformer"
    assert base.path == paths.CONFIG / "smoke" / "diffeqformer.yaml"


def test_a_finetuning_run_is_hashed_with_its_pretraining_before_that_has_run(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS", tmp_path)
    run = Run("smoke/finetune_diffeqformer_lora", module="finetune")
    cfg, digest, run_dir = run.resolve()[:3]
    assert isinstance(cfg, configs.FinetuneConfig) and run_dir == tmp_path / cfg.name
    pre = configs.load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml")
    assert digest == configs.finetune_hash(cfg, configs.config_hash(pre))
    # a member of a population of fine-tunings: its hash covers the population, as a training's does
    members = presets.seeded(run, 2, population=True)
    (first, first_hash, _), (second, second_hash, second_dir) = (m.resolve()[:3] for m in members)
    assert first_hash == configs.finetune_hash(cfg, configs.config_hash(pre), population=[0, 1]) != digest
    assert second.trainer.seed == 1 and second_dir == tmp_path / f"{cfg.name}-seed1"
    assert second_hash == configs.finetune_hash(second, configs.config_hash(pre), population=[0, 1])


def test_finetune_runs_lists_the_grid_with_pretrainings_first():
    runs = presets.finetune_runs("cpu")
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
    assert presets.presets()["cpu"]["f7_finetuning"]["runs"] == runs


# ------------------------------------------------------------------------------------------------- the plan


def _expected_markers(monkeypatch, home: Path, preset: str) -> dict[str, dict[str, str]]:
    """Per notebook of ``preset``: each run its registry entry names (a population's member where it is one, as
    ``join_populations`` makes it) -> the marker its training writes, from the run's own configuration."""
    _in_home(monkeypatch, home)
    found: dict[str, dict[str, str]] = {}
    identity: dict[str, tuple] = {}
    for nb, values in plan.join_populations(presets.presets()[preset]).items():
        for r in plan.collect_runs(values):
            if r.key not in identity:
                identity[r.key] = r.resolve()[:3]
            _, digest, run_dir = identity[r.key]
            found.setdefault(nb, {})[f"runs/{run_dir.name}"] = f"runs/{run_dir.name}/trained-{digest[:16]}.json"
    return found


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_each_training_writes_one_marker_per_run_and_each_notebook_reads_its_runs_markers(
        preset, planned, home, monkeypatch):
    """A training job's outputs are one marker per run, ``runs/<name>/trained-<16 hex of its config hash>.json``, the
    hash that of the run's configuration (a changed configuration is a missing output); each notebook's inputs are
    exactly the markers of the runs its parameters name, and no run is trained by two jobs."""
    made = planned(preset)
    expected = _expected_markers(monkeypatch, home, preset)
    trained = [r for job in made["trainings"] for r in job["runs"]]
    assert len(trained) == len(set(trained)), "a run trained by two jobs"
    for job in made["trainings"]:
        assert len(job["runs"]) == len(job["hashes"]) == len(job["outputs"])
        for run, digest, marker in zip(job["runs"], job["hashes"], job["outputs"]):
            assert re.fullmatch(r"runs/[^/]+/trained-[0-9a-f]{16}\.json", marker), marker
            assert marker == f"{run}/trained-{digest[:16]}.json"
    markers = {m: r for job in made["trainings"] for r, m in zip(job["runs"], job["outputs"])}
    for job in made["notebooks"]:
        assert job["inputs"] == sorted(expected[job["name"]].values()), job["name"]
        assert set(job["inputs"]) <= set(markers)
        assert _run_names(list(job["parameters"].values())) == set(expected[job["name"]]), job["name"]
    assert set(markers) == {m for runs in expected.values() for m in runs.values()}  # nothing else is trained


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_a_training_job_runs_its_module_or_the_population_of_its_members(preset, planned, home, monkeypatch):
    """A run alone: ``python -m diffeqformer.train|finetune --config <its file> <its overrides>``; a population's
    members, one job: ``python -m diffeqformer.population --config <file> <the first seed's overrides> --seeds N``."""
    made = planned(preset)
    _in_home(monkeypatch, home)
    runs = {f"runs/{r.load().name}": r for r in plan.collect_runs(
        list(plan.join_populations(presets.presets()[preset]).values()))}
    for job in made["trainings"]:
        first = runs[job["runs"][0]]
        if len(job["runs"]) == 1:
            assert job["argv"] == ["-m", f"diffeqformer.{first.module}", "--config", str(first.path),
                                   *first.overrides]
        else:
            assert first.population and len(first.population) == len(job["runs"])
            assert job["argv"] == ["-m", "diffeqformer.population", "--config", str(first.path), *first.overrides,
                                   "--seeds", str(len(job["runs"]))]
        assert job["configs"] == sorted({str(runs[r].path) for r in job["runs"]})
        assert all(runs[r].population_key == first.population_key for r in job["runs"])
    assert any(len(job["runs"]) > 1 for job in made["trainings"])  # both train their seeds as populations


def test_a_run_that_is_a_population_member_elsewhere_is_that_member(planned):
    """F1's ``Run("cpu/diffeqformer")`` is the first seed of F6's population: one training, one run directory."""
    made = planned("cpu")
    by_run = _by_run(made)
    ours = by_run["runs/cpu-diffeqformer"]
    assert ours["runs"][0] == "runs/cpu-diffeqformer" and len(ours["runs"]) == presets.PRIMARY_SEEDS
    assert ours["argv"][:2] == ["-m", "diffeqformer.population"]
    f1 = next(j for j in made["notebooks"] if j["name"] == "f1_model")
    assert f1["parameters"]["run"] == "runs/cpu-diffeqformer" and f1["inputs"] == [ours["outputs"][0]]
    synthetic = by_run["runs/cpu-synthetic-diffeqformer"]
    assert synthetic["runs"] == [f"runs/cpu-synthetic-diffeqformer{s}" for s in ("", "-seed1", "-seed2")]
    units = made["trainings"]
    # every compared setting of F5, F6, F8-F10 but F6's primary pair, F7's 4 pretrainings and 16 fine-tunings
    assert sum(len(u["runs"]) == 3 for u in units) == 9 + 4 + 16
    assert sum(len(u["runs"]) == presets.PRIMARY_SEEDS for u in units) == 2  # GPT-2 and DiffEqFormer


def test_a_finetuning_waits_for_its_pretraining_in_the_plan(planned):
    """A fine-tuning's training job has its pretraining job's output markers among its inputs (``after``); each
    token cache is built once, before the trainings that read it."""
    smoke = planned("smoke")
    by_run = _by_run(smoke)
    lora = by_run["runs/smoke-finetune-gpt2-lora"]  # it starts from the first member of GPT-2's population
    assert lora["after"] == by_run["runs/smoke-gpt2"]["outputs"][:1] and by_run["runs/smoke-gpt2"]["after"] == []
    cpu = planned("cpu")
    grid = [t for t in cpu["trainings"] if any("/finetune_" in c for c in t["configs"])]
    assert len(grid) == 16 and all(len(t["runs"]) == 3 for t in grid)  # one population a setting
    for t in grid:
        pretraining = _by_run(cpu)[t["after"][0].rsplit("/", 1)[0]]
        assert t["after"] == pretraining["outputs"] and len(pretraining["runs"]) == 3
        assert Path(pretraining["configs"][0]).name.startswith("pretrain_")
    assert [t for t in cpu["trainings"] if t["after"]] == grid
    assert len(cpu["tokens"]) == 4  # all, plays, prose, synthetic: four token caches to build
    assert {t["tokens"] for t in cpu["trainings"]} == set(cpu["tokens"])


def test_a_finetuning_waits_for_the_run_its_pretrain_run_dir_names(tmp_path, monkeypatch):
    """``pretrain.run_dir`` overrides where the pretraining is read from: the dependency follows it; a pretraining
    that nothing trains and that is not finished is refused before anything runs."""
    _in_home(monkeypatch, tmp_path)
    nbdir, toc = _runs_notebook(tmp_path)
    elsewhere = str(tmp_path / "runs" / "smoke-gpt2-other")
    other = Run("smoke/gpt2", ("--run_dir", elsewhere))  # the pretraining's configuration, in another directory
    lora = Run("smoke/finetune_gpt2_lora", ("--pretrain.run_dir", elsewhere), module="finetune")
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), other, lora])}}
    made = plan.make("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    by_run = _by_run(made)
    assert by_run["runs/smoke-finetune-gpt2-lora"]["after"] == by_run["runs/smoke-gpt2-other"]["outputs"]
    assert by_run["runs/smoke-gpt2"]["outputs"] != by_run["runs/smoke-gpt2-other"]["outputs"]
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), lora])}}  # nothing trains what it names
    with pytest.raises(WorkflowError, match="needs the pretrained run runs/smoke-gpt2-other, which is not finished"):
        plan.make("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    (tmp_path / "runs" / "smoke-gpt2-other").mkdir(parents=True)
    (tmp_path / "runs" / "smoke-gpt2-other" / "complete.json").write_text("{}")  # finished elsewhere: read as is
    made = plan.make("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    assert _by_run(made)["runs/smoke-finetune-gpt2-lora"]["after"] == []


def test_a_finetuning_of_another_configuration_of_its_pretraining_is_refused(tmp_path, monkeypatch):
    """A fine-tuning whose pretraining this plan trains under another configuration (in a population, or another
    variant in the directory ``pretrain.run_dir`` names) is refused before anything runs."""
    _in_home(monkeypatch, tmp_path)
    nbdir, toc = _runs_notebook(tmp_path)
    member = presets.seeded(Run("smoke/diffeqformer"), 2, population=True)
    lora = Run("smoke/finetune_diffeqformer_lora", module="finetune")  # pretrains on smoke-diffeqformer alone
    with pytest.raises(WorkflowError, match="names another configuration of it"):
        plan.make("t", registry={"t": {"nb": dict(runs=[*member, lora])}}, notebooks_dir=nbdir, toc=toc)
    other = presets.variant("smoke/gpt2", "smoke-gpt2-other", {"optimizer.beta2": 0.95})
    elsewhere = str(tmp_path / "runs" / "smoke-gpt2-other")
    lora = Run("smoke/finetune_gpt2_lora", ("--pretrain.run_dir", elsewhere), module="finetune")
    with pytest.raises(WorkflowError, match="names another configuration of it"):
        plan.make("t", registry={"t": {"nb": dict(runs=[other, lora])}}, notebooks_dir=nbdir, toc=toc)


def test_a_training_config_that_does_not_parse_is_refused_naming_it(tmp_path, monkeypatch):
    """A config with a field its class does not have, and one that is not YAML: refused before anything runs, the
    message naming the config."""
    _in_home(monkeypatch, tmp_path)
    nbdir, toc = _runs_notebook(tmp_path)
    monkeypatch.setattr(paths, "CONFIG", tmp_path / "config")
    (tmp_path / "config" / "x").mkdir(parents=True)
    (tmp_path / "config" / "x" / "field.yaml").write_text("name: x-field\nmodel:\n  no_such_field: 3\n")
    (tmp_path / "config" / "x" / "yaml.yaml").write_text("name: [x\n")
    for name in ("field", "yaml"):
        with pytest.raises(WorkflowError, match=f"training config 'x/{name}': "):
            plan.make("t", registry={"t": {"nb": dict(runs=[Run(f"x/{name}")])}}, notebooks_dir=nbdir, toc=toc)


def test_two_trainings_into_one_run_directory_are_refused(tmp_path, monkeypatch):
    _in_home(monkeypatch, tmp_path)
    nbdir, toc = _runs_notebook(tmp_path)
    alone = Run("smoke/gpt2", ("--trainer.seed", "1"))
    member = Run("smoke/gpt2", ("--trainer.seed", "1", "--name", "smoke-gpt2"), population=(0, 1))
    with pytest.raises(WorkflowError, match="would both train into runs/smoke-gpt2"):
        plan.make("t", registry={"t": {"nb": dict(runs=[alone, member])}}, notebooks_dir=nbdir, toc=toc)


def test_a_run_parameter_is_passed_as_its_run_directory(tmp_path, monkeypatch):
    """``Run`` values anywhere in a parameter (lists, dicts, tuples) reach the notebook as run directories relative to
    the home, tuples as lists; the other values as they are."""
    _in_home(monkeypatch, tmp_path)
    nbdir, toc = _runs_notebook(tmp_path)
    registry = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), {"a": (Run("smoke/shared"), 2)}, "runs/kept"])}}
    made = plan.make("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    job = made["notebooks"][0]
    assert job["parameters"] == {"preset": "t", "runs": ["runs/smoke-gpt2", {"a": ["runs/smoke-shared", 2]},
                                                         "runs/kept"]}
    assert job["inputs"] == sorted(t["outputs"][0] for t in made["trainings"])
    assert sorted(r for t in made["trainings"] for r in t["runs"]) == ["runs/smoke-gpt2", "runs/smoke-shared"]
    json.dumps(made)  # plain data: the Snakefile's plan.json


def test_a_plan_is_read_back_until_what_it_was_made_from_changes(tmp_path, monkeypatch):
    """``plan.load`` keeps the plan in ``_build/workflow/<preset>/plan.json`` with the hash of what it was made from:
    a second load makes nothing; other overrides, or an edited ``_toc.yml``, make it again."""
    _in_home(monkeypatch, tmp_path)
    toc = tmp_path / "_toc.yml"
    toc.write_text(plan.TOC.read_text())
    monkeypatch.setattr(plan, "TOC", toc)
    made = []
    monkeypatch.setattr(plan, "make", lambda preset, overrides: made.append(overrides) or {"n": len(made)})
    assert plan.load("smoke") == {"n": 1} and (plan.folder("smoke") / "plan.json").exists()
    assert plan.load("smoke") == {"n": 1} and len(made) == 1
    assert plan.load("smoke", {"f1_model": {"num_times": 3}}) == {"n": 2}
    assert plan.load("smoke", {"f1_model": {"num_times": 3}}) == {"n": 2}
    toc.write_text(toc.read_text() + "\n# an edit\n")
    assert plan.load("smoke", {"f1_model": {"num_times": 3}}) == {"n": 3}
    assert plan.folder("smoke") == tmp_path / "_build" / "workflow" / "smoke"


# ------------------------------------------------------------------------------------------ a notebook's sources


def _package(root: Path) -> Path:
    """A package ``diffeqformer`` below ``root``: ``a`` imports ``b``, which imports ``c`` inside a function (a lazy
    import), which imports ``sub.d`` by its absolute name; ``e`` is imported by nothing; and a ``workflow``."""
    files = {"__init__.py": "", "a.py": "from . import b\n", "b.py": "def f():\n    from .c import g\n    return g()\n",
             "c.py": "import diffeqformer.sub.d\n\ndef g():\n    return 1\n", "sub/__init__.py": "", "sub/d.py": "",
             "e.py": "", "workflow/__init__.py": "", "workflow/presets.py": ""}
    for name, text in files.items():
        (root / "diffeqformer" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "diffeqformer" / name).write_text(text)
    return root / "diffeqformer"


def test_a_notebooks_sources_are_the_modules_it_imports_and_not_the_workflow(tmp_path, monkeypatch):
    """``notebook_sources``: the modules a notebook's code cells import, directly and through other modules (lazy
    imports included), with the packages above them; not a module it does not reach, not a markdown cell's text, and
    no module of ``diffeqformer.workflow`` (editing a preset re-executes no notebook whose parameters it left)."""
    package = _package(tmp_path)
    monkeypatch.setattr(plan, "PACKAGE", package)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("import diffeqformer.e"),
                nbformat.v4.new_code_cell("!pip install diffeqformer\n%matplotlib inline\nimport json\n"
                                          "from diffeqformer import a\nfrom diffeqformer.workflow import presets\n")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    expected = sorted(str(package / f) for f in ("__init__.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/d.py"))
    assert plan.notebook_sources(tmp_path / "nb.ipynb") == expected
    # one graph for several notebooks (a plan's): what another notebook reached first is reached again
    first = nbformat.v4.new_notebook()
    first.cells = [nbformat.v4.new_code_cell("from diffeqformer import e\nimport diffeqformer.a\n")]
    nbformat.write(first, tmp_path / "first.ipynb")
    graph = plan.import_graph()
    assert plan.notebook_sources(tmp_path / "first.ipynb", graph) == sorted(expected + [str(package / "e.py")])
    assert plan.notebook_sources(tmp_path / "nb.ipynb", graph) == expected
    assert plan.notebook_sources(tmp_path / "first.ipynb", graph) == sorted(expected + [str(package / "e.py")])


def test_the_notebooks_sources_follow_their_imports(planned):
    """In the project: the perplexity analysis is a source of F6's notebook alone, ``paths.py`` (imported by every
    notebook, through ``report.figures``) of all of them, the workflow's modules of none; the plan's notebook jobs
    carry them."""
    package = Path(plan.PACKAGE)
    sources = {nb: plan.notebook_sources(paths.NOTEBOOKS / f"{nb}.ipynb") for nb in plan.toc_notebooks()}
    assert [nb for nb, found in sources.items() if str(package / "analysis" / "perplexity.py") in found] == \
        ["f6_perplexity"]
    for nb, found in sources.items():
        assert str(package / "paths.py") in found and str(package / "report" / "figures.py") in found, nb
        assert not any(Path(f).is_relative_to(package / "workflow") for f in found), nb
        assert not any(Path(f).is_relative_to(package / "pipeline") for f in found), nb
    assert {job["name"]: job["sources"] for job in planned("smoke")["notebooks"]} == sources


# ------------------------------------------------------------------------------------------- the pages


def test_the_presets_page_states_a_config_default_number_of_steps(tmp_path, monkeypatch):
    """A config without num_train_steps trains Levanter's default number of steps: the presets page said "None"."""
    import yaml
    from levanter.trainer import TrainerConfig

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
    page = pages.presets_markdown()
    table = [line for line in page.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(PRESETS) and all(line.count("|") == 4 for line in table)
    names = ", ".join(f"`{nb}`" for nb in presets.presets()["cpu"])
    assert page.count(names) == 1 and "`smoke`, `cpu`, `gpu` and `paper` execute 11 notebooks" in page


def test_presets_page_counts_the_runs_the_workflow_trains(planned):
    """A run that F1 names alone and F6 trains as a population's member is one training: the page said 61 runs for
    the cpu preset, whose pipeline trains 56."""
    page = pages.presets_markdown()
    for preset in PRESETS:
        count = sum(len(job["runs"]) for job in planned(preset)["trainings"])
        assert f"| `{preset}` | {count} runs of " in page, preset


def test_clock():
    assert [pages.clock(s) for s in (0, 59.6, 462, 3599, 3723)] == ["0:00", "1:00", "7:42", "59:59", "1:02:03"]
