"""diffeqformer.report.book: the Colab cell's clone URL comes from _config.yml and the cell stays out of the book; the
book's copy of a notebook has its code behind toggles; the book's MathJax comes from an installed package."""

from __future__ import annotations

import json
import shutil

import pytest

from diffeqformer import paths
from diffeqformer.workflow import plan
from diffeqformer.workflow.plan import WorkflowError
from diffeqformer.report import book

URL = "https://github.com/diffeqformer/diffeqformer"


def _config(tmp_path, url="https://github.com/someone/fork.git", branch="dev"):
    text = (paths.REPO / "_config.yml").read_text().replace(f"url: {URL}", f"url: {url}")
    text = text.replace("branch: main", f"branch: {branch}")
    (tmp_path / "_config.yml").write_text(text)
    return tmp_path / "_config.yml"


def _copy(tmp_path, name="f2_spectra"):
    shutil.copy(paths.NOTEBOOKS / f"{name}.ipynb", tmp_path / f"{name}.ipynb")
    return tmp_path / f"{name}.ipynb"


def test_the_repository_and_colab_link_come_from_the_config(tmp_path):
    config = _config(tmp_path)
    assert book.repository_url(config) == "https://github.com/someone/fork"
    assert book.colab_link("f2_spectra", config) == \
        "https://colab.research.google.com/github/someone/fork/blob/dev/notebooks/f2_spectra.ipynb"


def test_every_notebook_clones_the_configured_repository(tmp_path):
    copies = []
    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")):
        book.check_colab_cell(path)
        copies.append(shutil.copy(path, tmp_path / path.name))
    assert book.sync_colab_cells(copies) == [], "python -m diffeqformer.report.book would change a notebook"


def test_a_colab_cell_cloning_another_repository_is_named_and_rewritten(tmp_path):
    notebook, config = _copy(tmp_path), _config(tmp_path)
    before = json.loads(notebook.read_text())
    with pytest.raises(ValueError, match=f"clones {URL}, but _config.yml's repository.url is "
                                         "https://github.com/someone/fork: `python -m diffeqformer.report.book`"):
        book.check_colab_cell(notebook, config)
    assert book.sync_colab_cells([notebook], config) == [notebook]
    book.check_colab_cell(notebook, config)
    after = json.loads(notebook.read_text())
    cell = book.colab_cells(after)[0]
    assert '"git", "clone", "-q", "https://github.com/someone/fork", REPO' in "".join(cell["source"])
    # nothing else changed: other cells, the cell's other lines, the file's layout
    old_cell = book.colab_cells(before)[0]
    assert [line for line in cell["source"] if "github" not in line] == \
        [line for line in old_cell["source"] if "github" not in line]
    assert [c for c in after["cells"] if c is not cell] == [c for c in before["cells"] if c is not old_cell]
    assert notebook.read_text() == json.dumps(after, indent=1, ensure_ascii=False) + "\n"
    assert book.sync_colab_cells([notebook], config) == []


def test_a_colab_cell_must_stay_out_of_the_book(tmp_path):
    notebook = _copy(tmp_path)
    nb = json.loads(notebook.read_text())
    book.colab_cells(nb)[0]["metadata"]["tags"].remove("remove-cell")
    notebook.write_text(json.dumps(nb, indent=1))
    with pytest.raises(ValueError, match="must be tagged 'remove-cell'"):
        book.check_colab_cell(notebook)
    book.sync_colab_cells([notebook])
    book.check_colab_cell(notebook)


def test_the_workflow_refuses_a_notebook_that_clones_another_repository(tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    shutil.copytree(paths.NOTEBOOKS, notebooks)
    book.sync_colab_cells([notebooks / "f2_spectra.ipynb"], _config(tmp_path))
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    with pytest.raises(WorkflowError, match="f2_spectra.ipynb: its Colab cell clones https://github.com/someone/fork"):
        plan.make("smoke", notebooks_dir=notebooks)


def test_the_reader_view_hides_code_and_keeps_outputs_but_what_was_printed():
    printed = {"output_type": "stream", "name": "stderr", "text": "step 3/10, 2.1 s"}
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Title\n\nA question?"},
        {"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "source": "import google.colab", "outputs": []},
        {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": "x = 1", "outputs": []},
        {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "source": "x = 2", "outputs": []},
        {"cell_type": "code", "metadata": {}, "source": "plot(x)", "outputs": [{"output_type": "display_data"}, printed]},
        {"cell_type": "code", "metadata": {"tags": ["hide-cell"]}, "source": "y = 3", "outputs": []},
    ]}
    view = book.reader_view(json.loads(json.dumps(nb)))
    assert [c["metadata"].get("tags") for c in view["cells"]] == [
        None, ["remove-cell"], ["parameters", "hide-input"], ["injected-parameters", "hide-input"], ["hide-input"],
        ["hide-cell"]]
    assert [c.get("outputs") for c in view["cells"]] == [
        [o for o in c["outputs"] if o is not printed] if "outputs" in c else None for c in nb["cells"]]
    assert view["cells"][4]["outputs"] == [{"output_type": "display_data"}]


def test_mathjax_is_copied_from_the_installed_package(tmp_path):
    book.copy_mathjax(tmp_path)
    assert (tmp_path / "tex-chtml.js").stat().st_size > 1_000_000
    assert (tmp_path / book.MATHJAX_PATH.removeprefix("mathjax/")).exists()
    # what a page with formulas loads besides the script (measured in the browser check)
    fonts = tmp_path / "output" / "chtml" / "fonts" / "woff-v2"
    for font in ("MathJax_Zero", "MathJax_Main-Regular", "MathJax_Math-Italic", "MathJax_Size1-Regular"):
        assert (fonts / f"{font}.woff").exists(), font
    assert (tmp_path / "input" / "tex" / "extensions" / "boldsymbol.js").exists()  # autoloaded by \boldsymbol
