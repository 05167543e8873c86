"""diffeqformer.report.figures: what a notebook shows for a saved figure (the PNG it saved, then the caption,
whatever the kernel's matplotlib backend), a provenance record that displays nothing, run directories recorded relative to the
project's home."""

from __future__ import annotations

import base64
import json
import re

import pytest
import yaml
from IPython.core.formatters import format_display_data

from diffeqformer import paths
from diffeqformer.report import figures
from diffeqformer.runs import run_path


@pytest.fixture
def shown(tmp_path, monkeypatch):
    """Figures written to a temporary folder; what the notebook would display (and glue) is collected instead."""
    monkeypatch.setenv("DIFFEQFORMER_FIGURES", str(tmp_path / "figures"))
    displayed, glued = [], {}
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: displayed.extend(objs))
    monkeypatch.setattr(figures, "_glue_object", lambda name, value: glued.__setitem__(name, value))
    figures.start("nb_test", dict(preset="test"))
    return tmp_path / "figures", displayed, glued


def _line_figure():
    # Built without pyplot, as the report.plots modules build theirs: no backend is ever loaded for it.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    fig.add_subplot().plot([0, 1, 0])
    return fig


def test_a_saved_figure_is_shown_as_its_png_then_its_caption(shown):
    out, displayed, glued = shown
    record = figures.save_figure(_line_figure(), "nb_test_line", caption="A line.")
    data = [format_display_data(obj)[0] for obj in displayed]
    assert len(data) == 2
    png = (out / "nb_test_line.png").read_bytes()
    assert base64.b64decode(data[0]["image/png"]) == png  # the saved file, not a new drawing
    assert data[1]["text/markdown"] == f"**nb_test_line.** {record['caption']}"
    assert "image/png" in format_display_data(glued["nb_test_line"])[0]  # another page shows it through glue


def test_a_saved_figure_is_shown_at_screen_resolution(shown):
    out, displayed, _ = shown
    figures.save_figure(_line_figure(), "nb_test_line", caption="A line.")
    width = int.from_bytes((out / "nb_test_line.png").read_bytes()[16:20], "big")
    assert displayed[0].width == round(width * figures.SCREEN_DPI / figures.PNG_DPI)


def test_a_table_shows_missing_values_as_a_dash(shown):
    import pandas as pd

    _, displayed, _ = shown
    frame = pd.DataFrame({"steps": pd.array([2, None], dtype="Int64"), "ppl": [1.5, float("nan")]})
    figures.save_table(frame, "nb_test_table", caption="A table.")
    html = format_display_data(displayed[0])[0]["text/html"]
    assert "<NA>" not in html and "nan" not in html and html.count("–") == 2


def test_a_table_column_can_have_its_own_format(shown):
    """F8's beta2 column at the tables' one decimal read 0.9 and 1.0 for 0.95 and 0.999."""
    import pandas as pd

    out, displayed, _ = shown
    frame = pd.DataFrame({"beta2": [0.95, 0.999], "ppl": [481.83, 530.51]})
    figures.save_table(frame, "nb_test_table", caption="A table.", formats={"beta2": "{:g}"})
    html = format_display_data(displayed[0])[0]["text/html"]
    assert all(f"<td>{v}</td>" in html for v in ("0.95", "0.999", "481.8", "530.5"))
    assert "<td>0.9</td>" not in html and "<td>1.0</td>" not in html
    with pytest.raises(ValueError, match="beta"):
        figures.save_table(frame, "nb_test_other", caption="A table.", formats={"beta": "{:g}"})
    assert not (out / "nb_test_other.csv").exists()  # nothing written for a bad call


def test_a_record_as_a_cells_last_value_displays_nothing(shown):
    import pandas as pd

    record = figures.save_table(pd.DataFrame({"a": [1.0]}), "nb_test_table", caption="A table.")
    assert format_display_data(record) == ({}, {})
    assert json.loads(json.dumps(record)) == dict(record)


def test_provenance_records_runs_relative_to_the_home(tmp_path, monkeypatch, shown):
    out, _, _ = shown
    monkeypatch.setattr(paths, "HOME", tmp_path)
    run = tmp_path / "runs" / "test-run"
    run.mkdir(parents=True)
    (run / "complete.json").write_text(json.dumps({"name": "test-run", "config_hash": "abc123"}))
    (run / "config.yaml").write_text(yaml.safe_dump({
        "model": {"type": "diffeqformer", "num_layers": 2, "hidden_dim": 8, "num_heads": 2, "max_seq_len": 16},
        "data": {"dataset": "shakespeare", "domain": "all"}, "trainer": {"num_train_steps": 5}}))
    figures.start("nb_test", dict(preset="test", run="runs/test-run"), runs=["runs/test-run", run])
    figures.save_figure(_line_figure(), "nb_test_line", caption="A line.", show=False)
    record = json.loads((out / "nb_test_line.json").read_text())
    assert record["runs"] == {"runs/test-run": "abc123"}
    assert paths.home_relative(tmp_path.parent / "elsewhere") == str((tmp_path.parent / "elsewhere").resolve())


def test_scale_of_seed_runs_counts_each_model_once():
    """A run's seed copies (``<name>-seed<k>``) are one model in a caption's scale, with their number of seeds."""
    runs = ["runs/cpu-gpt2", "runs/cpu-gpt2-seed1", "runs/cpu-shared", "runs/cpu-diffeqformer",
            "runs/cpu-diffeqformer-seed1", "runs/cpu-diffeqformer-seed2"]
    scales = [f"{kind}, 6 layers, 64-d" for kind in ("gpt2", "gpt2", "shared", "diffeqformer", "diffeqformer",
                                                      "diffeqformer")]
    assert figures._models_and_seeds(runs, scales) == (
        "6 runs of 3 models (gpt2, 2 seeds; shared; diffeqformer, 3 seeds)")
    assert figures._models_and_seeds(runs[2:4], scales[2:4]) == "2 models (shared, diffeqformer)"
    assert figures._models_and_seeds(runs[3:], scales[3:]) == "3 runs of 1 model (diffeqformer, 3 seeds)"
    # two models of one kind (x1's fixed and random step placement) are named by their runs
    assert figures._models_and_seeds(["runs/cpu-diffeqformer", "runs/cpu-diffeqformer-random-steps"], scales[3:5]) \
        == "2 models (diffeqformer cpu-diffeqformer, diffeqformer cpu-diffeqformer-random-steps)"


def test_scale_of_runs_of_several_scales_names_each_model_once(monkeypatch):
    """Runs of different scales are listed one by one, a run's seed copies once with their number."""
    scales = {"cpu-diffeqformer": "diffeqformer, 6 steps, 64-d, seq 64; shakespeare (all), 250 training steps"}
    synthetic = "diffeqformer, 6 steps, 64-d, seq 64; synthetic (all), 5000 training steps"
    monkeypatch.setattr(figures, "scale_of", lambda r: scales.get(run_path(r).name, synthetic))
    runs = ["runs/cpu-diffeqformer", "runs/cpu-synthetic-diffeqformer", "runs/cpu-synthetic-diffeqformer-seed1",
            "runs/cpu-synthetic-diffeqformer-seed2"]
    assert figures._common_scale(runs) == (
        f"cpu-diffeqformer: {scales['cpu-diffeqformer']}; cpu-synthetic-diffeqformer (3 seeds): {synthetic}")


def test_a_figure_saved_twice_makes_the_same_svg(shown):
    """matplotlib salts SVG element ids at random unless told otherwise: the same figure gave different files."""
    out, _, _ = shown
    figures.save_figure(_line_figure(), "nb_test_line", caption="A line.")
    first = (out / "nb_test_line.svg").read_bytes()
    figures.save_figure(_line_figure(), "nb_test_line", caption="A line.")
    strip = lambda b: re.sub(rb"<dc:date>[^<]*</dc:date>", b"", b)  # noqa: E731
    assert strip((out / "nb_test_line.svg").read_bytes()) == strip(first)


def test_a_wide_table_shows_its_main_columns_and_the_rest_collapsed(shown):
    """More than ``SHOWN_COLUMNS`` columns do not fit the book's column: the page shows ``main`` (or the first
    ones), the whole table below in a collapsed block; the CSV keeps every column; ``main`` must name columns."""
    import pandas as pd

    out, displayed, _ = shown
    frame = pd.DataFrame({f"c{i}": [float(i)] for i in range(10)})
    figures.save_table(frame, "nb_test_wide", caption="a wide table", main=["c9", "c0"])
    html = format_display_data(displayed[0])[0]["text/html"]
    head = html[:html.index("<details>")]
    assert html.count("<details>") == 1 and head.index("c9") < head.index("c0") and "c5" not in head
    assert list(pd.read_csv(out / "nb_test_wide.csv", index_col=0).columns) == list(frame.columns)
    with pytest.raises(ValueError, match="no_such"):
        figures.save_table(frame, "nb_test_wide2", caption="x", main=["no_such"])
