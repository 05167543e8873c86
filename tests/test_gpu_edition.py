"""diffeqformer.workflow.edition: the GPU edition packed from a finished workflow, imported into the committed folder
(only a gpu pack, only an intact one, never half of one), and rendered: the banner of each page, whether the code
changed since, and the page that says no GPU edition exists yet.

The finished workflow here is a temporary one in the workflow's own layout (``_build/workflow/<preset>/``: the
``plan.json`` that ``plan.load`` keeps, each notebook of ``_toc.yml`` executed in ``notebooks/`` (its cells, one PNG
output) with its record in ``records/`` and its figure files in ``notebook-figures/``, the training's Snakemake
benchmark in ``benchmarks/``; its runs in ``runs/`` with their files, checkpoints and weights), made without running
anything, its runs saying they trained on a GPU: nothing of it is a GPU result nor is it committed anywhere."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import random
import re
import shutil
import time
import zipfile

import pytest

from diffeqformer import paths
from diffeqformer.report import verdicts
from diffeqformer.workflow import edition, pages, plan
from diffeqformer.workflow.plan import toc_notebooks

PNG = base64.b64encode(
    b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"
    + b"\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe\x92\xef"
    + b"\x00\x00\x00\x00IEND\xaeB`\x82").decode()
"""A 1 x 1 PNG, as a notebook's ``image/png`` output holds it."""
DEVICE = "NVIDIA H100 80GB HBM3 (gpu, 1 device)"
END = 1795835400.0
"""When the last notebook's job finished (2026-11-28, 03:10 UTC): its record's modification time."""
FINISHED = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(END))
WALL = 462.4
"""From the training's start (its benchmark's modification time less its seconds) to ``END``."""
BENCHMARK = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
"""The header of a Snakemake benchmark (``benchmark:`` of a training's rule), its first column the seconds."""


def _touch(path, seconds: float) -> None:
    os.utime(path, ns=(round(seconds * 1e9), round(seconds * 1e9)))


def _executed(nb: str) -> dict:
    """The notebook's own cells with one figure output, as an executed copy holds them."""
    notebook = json.loads((paths.NOTEBOOKS / f"{nb}.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    cell["outputs"] = [{"output_type": "display_data", "metadata": {},
                        "data": {"image/png": PNG, "text/plain": ["<IPython.core.display.Image object>"]}}]
    return notebook


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A finished workflow of ``preset`` in a temporary ``DIFFEQFORMER_HOME`` (module docstring); returns a function
    of the preset that writes it and returns the home."""
    root = tmp_path / "home"
    monkeypatch.setattr(paths, "HOME", root)

    def make(preset: str = "gpu", backend: str = "gpu"):
        work = plan.folder(preset)
        run = root / "runs" / f"{preset}-diffeqformer"
        (run / "checkpoints" / "step-10").mkdir(parents=True)
        (run / "checkpoints" / "step-10" / "params").write_bytes(b"\0" * 4096)
        (run / "model.eqx").write_bytes(b"\0" * 4096)
        (run / "config.yaml").write_text("# config_hash: abc\nmodel: {}\n")
        (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 8.3}\n')
        members = [run, run.with_name(f"{run.name}-seed1")]  # a population: one training job, two runs
        for member in members:
            member.mkdir(exist_ok=True)
            (member / "complete.json").write_text(json.dumps({
                "name": member.name, "steps": 320, "final_eval_perplexity": 123.456, "tokens_per_second": 1234567.0,
                "wall_time_s": 61.0, "jax_backend": backend}))
        names = [f"runs/{m.name}" for m in members]
        unit = {"name": f"{preset}_diffeqformer", "runs": names, "hashes": ["0123456789abcdef", "fedcba9876543210"],
                "outputs": [f"{n}/trained-{h}.json" for n, h in zip(names, ["0123456789abcdef", "fedcba9876543210"])],
                "argv": ["-m", "diffeqformer.population"], "tokens": "t", "configs": [], "steps": 320, "after": []}
        (work / "benchmarks").mkdir(parents=True)
        for name, seconds in ((unit["name"], 70.0), ("cpu_gpt2", 9.0)):  # the second: no job of this plan
            (work / "benchmarks" / f"train-{name}.tsv").write_text(BENCHMARK + f"{seconds:.4f}\t0:01:10\t1\n")
            _touch(work / "benchmarks" / f"train-{name}.tsv", END - WALL + seconds)
        notebooks = []
        for nb in toc_notebooks():
            parameters = {"preset": preset, "runs": names}
            for folder in ("notebooks", "records", f"notebook-figures/{nb}"):
                (work / folder).mkdir(parents=True, exist_ok=True)
            (work / "notebooks" / f"{nb}.ipynb").write_text(json.dumps(_executed(nb), indent=1))
            for suffix in ("png", "svg", "json", "csv"):
                (work / "notebook-figures" / nb / f"{nb}_fig.{suffix}").write_text(f"{nb} {suffix}\n")
            record = work / "records" / f"{nb}.json"
            record.write_text(json.dumps({"notebook": nb, "seconds": 75.0, "parameters": parameters,
                                          "date": FINISHED}))
            _touch(record, END)
            notebooks.append({"name": nb, "path": str(paths.NOTEBOOKS / f"{nb}.ipynb"), "parameters": parameters,
                              "sources": [], "inputs": unit["outputs"]})
        made = {"preset": preset, "tokens": {}, "trainings": [unit], "notebooks": notebooks}
        with monkeypatch.context() as m:  # plan.json as the workflow keeps it, for this code
            m.setattr(plan, "make", lambda *args, **kwargs: made)
            assert plan.load(preset) == made
        assert (work / "plan.json").exists()
        return root

    return make


@pytest.fixture
def committed(tmp_path):
    """A committed edition folder with something in it already (what a failed import must leave as it was)."""
    folder = tmp_path / "book" / "gpu"
    folder.mkdir(parents=True)
    (folder / "old.txt").write_text("the edition committed before\n")
    return folder


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pack_holds_the_notebooks_figure_data_runs_and_manifest_and_no_weights(home, tmp_path):
    home()
    out = tmp_path / "out" / "edition"
    manifest = edition.pack(out, device=DEVICE, commit="0123456789abcdef")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["edition.zip.001", "manifest.json"]
    assert manifest["preset"] == "gpu" and manifest["device"] == DEVICE and manifest["date"] == FINISHED
    assert manifest["commit"] == "0123456789abcdef" and manifest["wall_s"] == pytest.approx(WALL)
    assert manifest["backends"] == ["gpu"] and manifest["runs"] == 2
    assert manifest["notebooks"] == toc_notebooks()
    names = zipfile.ZipFile(out / "edition.zip.001").namelist()
    assert set(manifest["files"]) == set(names)
    assert manifest["files"]["records/f6_perplexity.json"] == edition.file_sha256(
        plan.folder("gpu") / "records" / "f6_perplexity.json")
    assert {f"notebooks/{nb}.ipynb" for nb in toc_notebooks()} <= set(names)
    assert {"figures/f6_perplexity_fig.json", "figures/f6_perplexity_fig.csv", "records/f6_perplexity.json",
            "runs/gpu-diffeqformer/complete.json", "runs/gpu-diffeqformer/config.yaml",
            "runs/gpu-diffeqformer/metrics.jsonl", "runs/gpu-diffeqformer-seed1/complete.json"} <= set(names)
    assert not [n for n in names if n.endswith((".png", ".svg", ".eqx")) or "checkpoints" in n]
    assert manifest["seconds"] == {"train:gpu_diffeqformer": 70.0,  # not the benchmark of a job of no plan of gpu
                                   **{f"notebook:{nb}": 75.0 for nb in toc_notebooks()}}
    assert "src/diffeqformer/workflow/edition.py" in manifest["code"]


def test_pack_cuts_its_archive_into_parts_and_refuses_what_does_not_fit(home, tmp_path, monkeypatch, committed):
    """Parts of at most ``MAX_FILE_BYTES`` that join into the archive (and import); a pack needing more than seven
    parts and the manifest is refused, naming its largest file, and nothing is written."""
    root = home()
    edition.pack(tmp_path / "whole", device=DEVICE, commit="c")
    size = (tmp_path / "whole" / "edition.zip.001").stat().st_size
    monkeypatch.setattr(edition, "MAX_FILE_BYTES", size // 3 + 1)
    manifest = edition.pack(tmp_path / "parts", device=DEVICE, commit="c")
    assert [p["name"] for p in manifest["parts"]] == ["edition.zip.001", "edition.zip.002", "edition.zip.003"]
    assert all((tmp_path / "parts" / p["name"]).stat().st_size <= size // 3 + 1 for p in manifest["parts"])
    assert len(b"".join((tmp_path / "parts" / p["name"]).read_bytes() for p in manifest["parts"])) == size
    edition.import_edition(tmp_path / "parts", committed)
    assert (committed / "notebooks" / "f6_perplexity.ipynb").exists()
    monkeypatch.setattr(edition, "MAX_FILE_BYTES", size // 8)  # nine parts
    with pytest.raises(edition.EditionError, match=r"more than 7 parts of \S+ MiB and the manifest: its largest file "
                                                   r"is notebooks/\S+ \("):
        edition.pack(tmp_path / "many", device=DEVICE, commit="c")
    assert not (tmp_path / "many").exists()
    monkeypatch.setattr(edition, "MAX_FILE_BYTES", size)
    big = root / "runs" / "gpu-diffeqformer" / "metrics.jsonl"
    big.write_bytes(random.Random(0).randbytes(8 * size))  # does not compress
    with pytest.raises(edition.EditionError, match=r"its largest file is runs/gpu-diffeqformer/metrics.jsonl \(.* "
                                                   r"MiB compressed\)"):
        edition.pack(tmp_path / "big", device=DEVICE, commit="c")


@pytest.mark.parametrize("cut", ["notebook", "record", "parameters"])
def test_pack_refuses_a_workflow_that_did_not_finish_and_a_folder_that_is_not_a_pack(home, tmp_path, cut):
    """A workflow cut short: a notebook of its plan not executed (its job writes the executed notebook last, after
    its record; or it never ran), or executed with other parameters than the plan's (an older plan's runs), is named,
    and nothing is packed."""
    home()
    work = plan.folder("gpu")
    record = work / "records" / "f7_finetuning.json"
    if cut == "parameters":
        record.write_text(json.dumps({**json.loads(record.read_text()), "parameters": {"preset": "gpu", "runs": []}}))
    else:
        (work / "notebooks" / "f7_finetuning.ipynb" if cut == "notebook" else record).unlink()
    with pytest.raises(edition.EditionError, match="the notebook f7_finetuning has not been executed in .* as the "
                                                   "plan says: run the gpu workflow's notebooks first"):
        edition.pack(tmp_path / "out", device=DEVICE)
    assert not (tmp_path / "out").exists()
    home("smoke")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me\n")
    with pytest.raises(edition.EditionError, match="holds notes.txt, which is no part of a pack"):
        edition.pack(tmp_path / "mine", preset="smoke", device=DEVICE)
    assert (tmp_path / "mine" / "notes.txt").exists()


def test_import_installs_the_pack_and_refuses_another_preset(home, tmp_path, committed):
    home("gpu")
    edition.pack(tmp_path / "gpu-pack", device=DEVICE, commit="0123456789abcdef")
    home("smoke", backend="cpu")
    edition.pack(tmp_path / "smoke-pack", preset="smoke", device="cpu", commit="c")
    before = _tree(committed)
    with pytest.raises(edition.EditionError, match="an edition of preset 'smoke', not 'gpu'"):
        edition.import_edition(tmp_path / "smoke-pack", committed)
    assert _tree(committed) == before

    manifest = edition.import_edition(tmp_path / "gpu-pack" / "manifest.json", committed)  # a file of it will do
    installed = _tree(committed)
    assert "old.txt" not in installed
    assert set(manifest["files"]) | {"manifest.json"} == set(installed)
    assert json.loads(installed["notebooks/f2_spectra.ipynb"]) == _executed("f2_spectra")
    assert edition.load(committed)["device"] == DEVICE
    assert not list(committed.parent.glob(".gpu.*")), "no temporary folder is left beside it"


def test_a_gpu_pack_of_runs_trained_on_a_cpu_is_refused(home, tmp_path, committed):
    home("gpu", backend="cpu")
    edition.pack(tmp_path / "pack", device="TFRT_CPU_0 (cpu, 1 device)", commit="c")
    with pytest.raises(edition.EditionError, match="its runs trained on cpu, not on a GPU"):
        edition.import_edition(tmp_path / "pack", committed)
    assert (committed / "old.txt").exists()


@pytest.mark.parametrize("damage", ["changed byte", "truncated", "truncated, manifest updated", "missing part",
                                    "missing notebook", "corrupt manifest"])
def test_a_corrupt_pack_is_refused_and_the_committed_edition_stays(home, tmp_path, committed, damage):
    home()
    pack = tmp_path / "pack"
    manifest = edition.pack(pack, device=DEVICE, commit="c")
    part = pack / "edition.zip.001"
    data = part.read_bytes()
    expected = {"changed byte": "part .*edition.zip.001 is corrupt: .* \\(truncated or changed on the way\\)",
                "truncated": "part .*edition.zip.001 is corrupt",
                "truncated, manifest updated": "the archive of .* cannot be read \\(BadZipFile",
                "missing part": "part edition.zip.001 is missing from",
                "missing notebook": "lacks the executed notebook\\(s\\) f7_finetuning of _toc.yml",
                "corrupt manifest": "manifest.json is corrupt \\(JSONDecodeError"}[damage]
    if damage == "changed byte":
        part.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage.startswith("truncated"):
        part.write_bytes(data[: len(data) // 2])
        if damage.endswith("updated"):  # the size and hash agree: the archive itself must be read to see it
            manifest["parts"][0].update(bytes=part.stat().st_size, sha256=edition.file_sha256(part))
            (pack / "manifest.json").write_text(json.dumps(manifest))
    elif damage == "missing part":
        part.unlink()
    elif damage == "missing notebook":
        del manifest["files"]["notebooks/f7_finetuning.ipynb"]
        (pack / "manifest.json").write_text(json.dumps(manifest))
    else:
        (pack / "manifest.json").write_text(json.dumps(manifest)[:200])
    before = _tree(committed)
    with pytest.raises(edition.EditionError, match=expected) as refused:
        edition.import_edition(pack, committed)
    assert "\n" not in str(refused.value)
    assert _tree(committed) == before
    assert not list(committed.parent.glob(".gpu.*"))


def _repack(pack, manifest, members: dict[str, bytes], listed: list[str]) -> None:
    """Replace the pack's archive by one of ``members``, its one part and the manifest's ``files`` (``listed``)
    agreeing with it: only the archive itself can tell what is wrong."""
    with zipfile.ZipFile(pack / "edition.zip.001", "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    part = pack / "edition.zip.001"
    manifest["parts"] = [{"name": part.name, "bytes": part.stat().st_size, "sha256": edition.file_sha256(part)}]
    manifest["files"] = dict.fromkeys(listed, "")
    (pack / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", ["changed member", "unlisted", "not in the archive", "unsafe"])
def test_an_archive_whose_members_do_not_match_is_refused(home, tmp_path, committed, damage):
    """The parts agree with the manifest, but a member's bytes do not match its CRC-32, or the archive holds a file
    the manifest does not list (or lacks one it lists), or a path outside the edition's folder."""
    home()
    pack = tmp_path / "pack"
    manifest = edition.pack(pack, device=DEVICE, commit="c")
    archive = zipfile.ZipFile(pack / "edition.zip.001")
    members = {name: archive.read(name) for name in archive.namelist()}
    listed = list(members)
    if damage == "changed member":
        _repack(pack, manifest, members, listed)
        data = bytearray((pack / "edition.zip.001").read_bytes())
        at = data.index(b'"seconds": 75.0')  # in a record, stored as it is
        data[at + 12] ^= 1
        (pack / "edition.zip.001").write_bytes(bytes(data))
        manifest["parts"][0]["sha256"] = edition.file_sha256(pack / "edition.zip.001")
        (pack / "manifest.json").write_text(json.dumps(manifest))
        expected = "the archive of .* cannot be read \\(BadZipFile: Bad CRC-32 for file 'records/"
    elif damage == "unlisted":
        _repack(pack, manifest, {**members, "extra.txt": b"x"}, listed)
        expected = "holds 'extra.txt', which its manifest does not list"
    elif damage == "not in the archive":
        _repack(pack, manifest, {k: v for k, v in members.items() if k != "records/f1_model.json"}, listed)
        expected = "lacks 'records/f1_model.json', which its manifest lists"
    else:
        _repack(pack, manifest, {**members, "../evil.txt": b"x"}, [*listed, "../evil.txt"])
        expected = "holds the unsafe path '../evil.txt'"
    before = _tree(committed)
    with pytest.raises(edition.EditionError, match=expected) as refused:
        edition.import_edition(pack, committed)
    assert "\n" not in str(refused.value)
    assert _tree(committed) == before and not (tmp_path / "evil.txt").exists()
    assert not list(committed.parent.glob(".gpu.*"))


def test_an_import_killed_between_the_renames_gets_the_committed_edition_back(home, tmp_path, committed):
    home("smoke", backend="cpu")
    edition.pack(tmp_path / "pack", preset="smoke", device="cpu", commit="c")
    before = _tree(committed)
    committed.rename(committed.with_name(".gpu.old-4242"))  # where the killed import had moved it
    (committed.parent / ".gpu.import-4242").mkdir()
    with pytest.raises(edition.EditionError, match="preset 'smoke'"):
        edition.import_edition(tmp_path / "pack", committed)
    assert _tree(committed) == before and sorted(p.name for p in committed.parent.iterdir()) == ["gpu"]


def test_the_command_refuses_in_one_line(home, tmp_path, committed, capsys):
    home("smoke", backend="cpu")
    edition.main(["pack", "--out", str(tmp_path / "pack"), "--preset", "smoke", "--commit", "c"])
    assert "packed the smoke " in capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:
        edition.main(["import", str(tmp_path / "pack"), "--into", str(committed)])
    assert str(stopped.value).startswith("error: ") and "preset 'smoke', not 'gpu'" in str(stopped.value)
    assert "\n" not in str(stopped.value)
    with pytest.raises(SystemExit, match=r"^error: \S+/nowhere has no manifest.json: not a pack"):
        edition.main(["import", str(tmp_path / "nowhere"), "--into", str(committed)])


# ---------------------------------------------------------------------------------------------------------- render


def _installed(home, tmp_path, committed, **manifest_changes):
    home()
    manifest = edition.pack(tmp_path / "pack", device=DEVICE, commit="0123456789abcdef")
    edition.import_edition(tmp_path / "pack", committed)
    if manifest_changes:
        manifest = {**edition.load(committed), **manifest_changes}
        (committed / "manifest.json").write_text(json.dumps(manifest))
    return edition.load(committed)


def test_each_page_opens_with_device_date_commit_preset_and_wall_time(home, tmp_path, committed):
    manifest = _installed(home, tmp_path, committed)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths.REPO / "_toc.yml", src / "_toc.yml")
    staged = edition.stage(src, committed)
    assert staged == toc_notebooks()
    nb = json.loads((src / "gpu" / "f6_perplexity.ipynb").read_text())
    title = json.loads((paths.NOTEBOOKS / "f6_perplexity.ipynb").read_text())["cells"][0]["source"][0].rstrip("\n")
    assert nb["cells"][0]["source"] == f"{title} (GPU edition)"
    assert nb["cells"][1]["source"].startswith("```{admonition} GPU edition")
    banner = nb["cells"][1]["source"].split("```")[1]
    for text in (f"Device **{DEVICE}**", f"date {FINISHED}", "commit `0123456789ab`", "preset `gpu`",
                 "wall time 7:42"):
        assert text in banner
    assert "has not changed since this page was computed" in banner and ":class: note" in banner
    verdict = nb["cells"][1]["source"].split("```", 2)[2]  # the GPU edition's own verdicts follow the banner
    assert verdict.lstrip().startswith("```{admonition} The verdict at the gpu preset")
    assert f":class: {verdicts.OPENING_CLASS}" in verdict
    assert all("hide-input" in c["metadata"]["tags"] or "remove-cell" in c["metadata"]["tags"]
               for c in nb["cells"] if c["cell_type"] == "code")  # the reader's view
    assert any(out.get("data", {}).get("image/png") == PNG for c in nb["cells"] for out in c.get("outputs", []))
    import yaml

    toc = yaml.safe_load((src / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p["caption"] == "GPU edition")
    assert part["chapters"] == [{"file": edition.TOC_PAGE,
                                 "sections": [{"file": f"gpu/{nb}"} for nb in toc_notebooks()]}]
    page = pages.gpu_edition_markdown(committed)
    assert f"Device **{DEVICE}**" in page and "{doc}`/gpu/f6_perplexity` | 1:15 |" in page
    assert "| `gpu-diffeqformer` | 320 | 123.46 | 1,234,567 | 1:01 | gpu |" in page
    assert manifest["preset"] == "gpu"


def test_a_page_says_it_is_older_than_the_code(home, tmp_path, committed):
    manifest = _installed(home, tmp_path, committed)
    repo = tmp_path / "repo"
    shutil.copytree(paths.REPO / "src" / "diffeqformer", repo / "src" / "diffeqformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(paths.NOTEBOOKS, repo / "notebooks")
    shutil.copytree(paths.CONFIG, repo / "config")
    assert "The code (`src/diffeqformer`, `notebooks`, `config`) has not changed" in edition.banner(manifest, repo)
    (repo / "notebooks" / "f6_perplexity.ipynb").write_text("{}")
    assert ("**This page is older than the code**: 1 file of the code changed since this page was computed "
            "(`notebooks/f6_perplexity.ipynb`)") in edition.banner(manifest, repo)
    (repo / "src" / "diffeqformer" / "train.py").write_text("# changed\n")
    (repo / "config" / "gpu" / "new.yaml").write_text("a: 1\n")
    banner = edition.banner(manifest, repo)
    assert ":class: warning" in banner
    assert ("**This page is older than the code**: 3 files of the code changed since this page was computed "
            "(`config/gpu/new.yaml`, `notebooks/f6_perplexity.ipynb`, `src/diffeqformer/train.py`)") in banner
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths.REPO / "_toc.yml", src / "_toc.yml")
    edition.stage(src, committed, repo)
    nb = json.loads((src / "gpu" / "f2_spectra.ipynb").read_text())
    assert "**This page is older than the code**" in nb["cells"][1]["source"]
    assert "commit `0123456789ab` with changes not committed," in edition.banner({**manifest, "uncommitted": True})


def test_without_an_edition_the_part_says_so_and_its_page_gives_the_commands(tmp_path):
    empty = tmp_path / "book" / "gpu"
    assert edition.load(empty) is None
    page = pages.gpu_edition_markdown(empty)
    assert page == pages.NO_EDITION
    assert page.startswith("No GPU edition exists yet")
    page = (paths.BOOK / "gpu_edition.md").read_text()  # the part's first page says how one is made
    for command in ("bash benchmarks/gpu/prepare.sh --for pipeline",
                    "bash benchmarks/gpu/run.sh stage install pipeline",
                    "python -m diffeqformer.workflow.edition pack --out <output folder>",
                    "python -m diffeqformer.workflow.edition import"):
        assert command in page
    for module in re.findall(r"python -m ([\w.]+)", page):  # every command the page gives runs
        assert importlib.util.find_spec(module) is not None, f"the page runs python -m {module}, which is gone"
    from snakemake.cli import get_argument_parser, parse_config

    workflow = re.findall(r"^(?:\.venv/bin/)?snakemake (.*?)(?:\s+#.*)?$", page, flags=re.M)
    assert len(workflow) == 1, "the page gives the command that trains and executes the gpu preset, no book"
    args = get_argument_parser().parse_args(workflow[0].split())
    assert args.targets == ["notebooks"] and parse_config(args.config) == {"preset": "gpu"}, workflow
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths.REPO / "_toc.yml", src / "_toc.yml")
    assert edition.stage(src, empty) == []
    assert not (src / "gpu").exists()
    assert (src / "_toc.yml").read_text() == (paths.REPO / "_toc.yml").read_text()


def test_the_gpu_pages_stay_out_of_the_presets_notebook_check(home, tmp_path, committed):
    """_toc.yml names the GPU edition's page, not its notebooks, which the book job adds to its staged copy, where
    the check that every preset runs every notebook of _toc.yml does not count them."""
    import yaml

    files = []

    def walk(node):
        if isinstance(node, dict):
            files.extend([node["file"]] if "file" in node else [])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load((paths.REPO / "_toc.yml").read_text()))
    assert edition.TOC_PAGE in files and not [f for f in files if f.startswith(("gpu/", "book/gpu/"))]
    assert (paths.BOOK / "gpu_edition.md").read_text().count("_generated/gpu_edition.md") == 1
    _installed(home, tmp_path, committed)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths.REPO / "_toc.yml", src / "_toc.yml")
    edition.stage(src, committed)
    assert toc_notebooks(src / "_toc.yml") == toc_notebooks()


def _glue(name: str, text: str) -> dict:
    """A ``glue`` output of an executed notebook, as ``report.figures.glue`` writes a string."""
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}},
            "data": {"application/papermill.record/text/plain": repr(text), "text/plain": [repr(text)]}}


def test_the_verdicts_page_sets_the_paper_this_build_and_the_gpu_edition_side_by_side(home, tmp_path, committed):
    """``report.verdicts.verdicts_markdown``: each headline claim (``claims.CLAIMS``) in a row with the paper's side,
    the verdict glued by this build's notebook, and the GPU edition's (``edition.glued_notebooks``), or that there is
    none yet."""
    from diffeqformer.analysis import claims, statistics
    from diffeqformer.report import book

    nb = _executed("f8_beta2")
    here = claims.judge("f8_beta2", statistics.one_sample([0.1, -0.2, 0.15]))
    nb["cells"][-1].setdefault("outputs", []).append(_glue("f8_beta2_claim", here.to_json()))
    result = {"f8_beta2": book.glued(nb)}
    assert edition.glued_notebooks(tmp_path / "no-edition") is None
    page = verdicts.verdicts_markdown("cpu", verdicts.holm_verdicts(result), None)
    f8 = next(line for line in page.splitlines() if line.startswith("| F8 "))
    assert "beta2 = 0.95 helps DiffEqFormer and hurts GPT-2" in f8
    assert "| **inconclusive**: " in f8 and f8.endswith(f"| {verdicts.NO_GPU_VERDICT} |")
    assert "| not computed by this preset |" in next(line for line in page.splitlines() if line.startswith("| F10 "))
    assert "p < 0.05" in page  # the rule is stated

    _installed(home, tmp_path, committed)  # an edition whose f8 glued its own verdict
    gpu_nb = committed / "notebooks" / "f8_beta2.ipynb"
    executed = json.loads(gpu_nb.read_text())
    there = claims.judge("f8_beta2", statistics.one_sample([-0.3, -0.29, -0.32]))
    executed["cells"][-1].setdefault("outputs", []).append(_glue("f8_beta2_claim", there.to_json()))
    gpu_nb.write_text(json.dumps(executed))
    page = verdicts.verdicts_markdown("cpu", verdicts.holm_verdicts(result), edition.glued_notebooks(committed),
                                      edition.STAGED)
    f8 = next(line for line in page.splitlines() if line.startswith("| F8 "))
    assert f8.split(" | ")[-1].startswith("**reproduced**: ") and "{doc}`GPU </gpu/f8_beta2>`" in f8