"""diffeqformer.runs on hand-written run directories: finished or not, what is missing, pretraining or fine-tuning,
and the typed configuration with its defaults filled in."""

from __future__ import annotations

import ast
import json

import pytest
import yaml
from levanter.trainer import TrainerConfig

from diffeqformer import config as configs
from diffeqformer import paths, runs
from diffeqformer.config import FinetuneConfig, TrainConfig

PRETRAIN = paths.CONFIG / "smoke" / "diffeqformer.yaml"
LORA = paths.CONFIG / "smoke" / "finetune_diffeqformer_lora.yaml"


def write_run(root, name, config_text: str, *, complete: dict | None = None, pretrain_text: str | None = None):
    """A run directory as train / finetune write it: config.yaml (its hash on the first line), pretrain_config.yaml
    for a fine-tuning, complete.json once finished (``complete``)."""
    run = root / name
    run.mkdir(parents=True)
    (run / runs.CONFIG).write_text(f"{runs.HASH_PREFIX}hash-{name}\n" + config_text)
    if pretrain_text is not None:
        (run / runs.PRETRAIN_CONFIG).write_text(pretrain_text)
    if complete is not None:
        (run / runs.COMPLETE).write_text(json.dumps({"name": name, "config_hash": f"hash-{name}", **complete}))
    return run


RUN_FILES = {runs.COMPLETE, runs.CONFIG, runs.PRETRAIN_CONFIG, runs.METRICS, runs.MODEL, runs.CHECKPOINTS,
             runs.HASH_PREFIX.strip()}

def _code_strings(tree: ast.AST):
    """The string constants of ``tree`` that code uses: not docstrings (prose may name a file), not the keys of a
    dict literal (a summary's field called ``checkpoints`` is no path)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            skip |= {id(b.value) for b in node.body if isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
        if isinstance(node, (ast.Module, ast.ClassDef)):  # attribute docstrings: a string after an assignment
            for before, after in zip(node.body, node.body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                    skip.add(id(after.value))
        if isinstance(node, ast.Dict):
            skip |= {id(k) for k in node.keys if k is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def test_run_files_are_spelled_once():
    """A run directory's file names (and the hash line's prefix) are spelled in ``runs`` only: every other module of
    the package reads and writes a run directory through it, so the trainers and the readers agree."""
    from diffeqformer.workflow import plan as sources

    found = set()
    for name, f in sources.module_files().items():
        if name != "diffeqformer.runs":
            found |= {(name, s.strip()) for s in _code_strings(ast.parse(f.read_text())) if s.strip() in RUN_FILES}
    assert found == set()


def test_run_path_is_relative_to_the_home(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "HOME", tmp_path)
    assert runs.run_path("runs/x") == tmp_path / "runs" / "x"
    assert runs.run_path(tmp_path / "elsewhere") == tmp_path / "elsewhere"


def test_a_finished_run(tmp_path):
    run = write_run(tmp_path, "pre", PRETRAIN.read_text(), complete={"vocab_size": 4096})
    assert runs.is_complete(run) and runs.is_complete(str(run), "hash-pre")
    assert not runs.is_complete(run, "another-hash")
    assert runs.require_complete(str(run)) == run
    assert runs.summary(run) == {"name": "pre", "config_hash": "hash-pre", "vocab_size": 4096}
    assert runs.saved_hash(run) == "hash-pre"


def test_an_unfinished_run_names_the_run_and_what_is_missing(tmp_path):
    started = write_run(tmp_path, "started", PRETRAIN.read_text())
    assert not runs.is_complete(started) and runs.saved_hash(started) == "hash-started"
    with pytest.raises(FileNotFoundError, match=r"runs\['ours'\] = .*started: no finished run.*no complete.json"):
        runs.require_complete(started, label="runs['ours'] =")
    with pytest.raises(FileNotFoundError, match="started: no finished run"):
        runs.summary(started)
    missing = tmp_path / "never-trained"
    assert not runs.is_complete(missing) and runs.saved_hash(missing) is None
    with pytest.raises(FileNotFoundError, match="never-trained: no finished run there .no such directory"):
        runs.require_complete(missing)
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / runs.COMPLETE).write_text("{}")
    assert runs.require_complete(no_config) == no_config
    with pytest.raises(FileNotFoundError, match="no-config: no config.yaml"):
        runs.config(no_config)


def test_a_corrupt_summary_is_named_with_what_to_do(tmp_path):
    """A complete.json that is not JSON (a disk filled while writing): the file is named and the way to retrain it
    said, by the readers of finished runs and by the trainer that would skip it."""
    run = write_run(tmp_path, "pre", PRETRAIN.read_text(), complete={"vocab_size": 4096})
    (run / runs.COMPLETE).write_text("{vocab_size: 4096")
    readers = (runs.summary, lambda r: runs.is_complete(r, "hash-pre"), lambda r: runs.start_run(None, r, "hash-pre"))
    for read in readers:
        with pytest.raises(ValueError, match=rf"{runs.COMPLETE} is corrupt \(.*\): delete .*pre and train it again"):
            read(run)


def test_pretraining_and_finetuning_runs(tmp_path):
    pre = write_run(tmp_path, "pre", PRETRAIN.read_text(), complete={})
    tuned = write_run(tmp_path, "tuned", LORA.read_text(), complete={}, pretrain_text=PRETRAIN.read_text())
    assert not runs.is_finetuning(pre) and runs.is_finetuning(tuned)
    config, tuned_config = runs.config(pre), runs.config(tuned)
    assert type(config) is TrainConfig and type(tuned_config) is FinetuneConfig
    assert tuned_config.steps == 5 and tuned_config.method == "lora" and tuned_config.data.domain == "prose"
    assert runs.pretrain_config(tuned) == config
    assert runs.model_config(tuned) == runs.model_config(pre) == config.model
    assert runs.model_type(config.model) == "diffeqformer" and config.model.num_layers == 3
    with pytest.raises(ValueError, match="not a fine-tuning"):
        runs.pretrain_config(pre)


def test_the_config_has_its_defaults_filled_in(tmp_path):
    """A config without num_train_steps trains Levanter's default number of steps, not None."""
    template = yaml.safe_load(PRETRAIN.read_text())
    del template["trainer"]["num_train_steps"], template["model"]["time_embed_dim"]
    run = write_run(tmp_path, "defaults", yaml.safe_dump(template), complete={})
    config = runs.config(run)
    assert config.trainer.num_train_steps == TrainerConfig().num_train_steps is not None
    assert config.model.time_embed_dim == type(config.model)().time_embed_dim
    assert configs.config_field(config, "trainer.num_train_steps") == config.trainer.num_train_steps
    assert configs.config_field(config, "optimizer.beta2") == 0.999
    with pytest.raises(AttributeError, match="model.time_embed_dims"):
        configs.config_field(config, "model.time_embed_dims")


def test_each_of_the_papers_models_has_its_own_label():
    """``runs.model_label``: the weight-shared model and the Llama variant are DiffEqFormer configurations, and the
    book names them apart (a caption once listed three models as "diffeqformer")."""
    from diffeqformer.config import load_config

    labels = {name: runs.model_label(load_config(paths.CONFIG / "cpu" / f"{name}.yaml").model)
              for name in ("diffeqformer", "shared", "diffeqformer_llama", "gpt2", "llama")}
    assert labels == {"diffeqformer": "DiffEqFormer", "shared": "weight-shared",
                      "diffeqformer_llama": "DiffEqFormer-Llama", "gpt2": "GPT-2", "llama": "Llama"}
