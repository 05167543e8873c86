"""A Sphinx extension for the book's API reference (``sphinx: extra_extensions`` in ``_config.yml``).

The package's docstrings are plain text with ``literals``, and not always valid reStructuredText: ``|x|`` reads as a
substitution, an indented formula as a block quote. Each docstring is parsed by docutils first; one that parses
cleanly is rendered as reStructuredText, any other is shown verbatim (a literal block), so that no docstring can
break the book's warnings-as-errors build and none is silently mangled.
"""

from __future__ import annotations

import io

LAYERS = [
    ["paths", "numerics", "cache", "_autodoc", "trainer", "devices"],
    # diffeqformer.model: the model core, bottom up
    ["model.time_embedding", "model.temporal", "model.attention"],
    ["model.config"],
    ["model.vector_field"],
    ["model.transformer"],
    ["model.baselines", "model.solve", "model"],
    # diffeqformer.data: the synthetic language (its data, no analysis), then the corpora, which serve it to Levanter
    ["data", "data.synthetic"],
    ["data.shakespeare"],  # the archive's documents and splits
    ["data.corpora"],
    ["data.tasks"],  # F11's downstream tasks from the corpus's held-out documents
    ["data.__main__"],
    ["config"],  # the typed configurations: load, parse overrides, validate, hash, dump
    ["runs"],  # the run directory: its files, lock and lifecycle; a finished run's summary, config, metrics, model
    ["train"],
    ["finetune"],
    ["population"],  # trains populations of training runs and of fine-tunings
    # diffeqformer.report: saving figures and tables with their provenance, captions, glue; the book's extension
    ["report", "report.figures", "report.book"],
    # diffeqformer.analysis: the verdict rule over seeds, the analyses, F5's benchmark over lyapunov's scores
    ["analysis", "analysis.statistics"],
    ["analysis.multiplicity"],  # many tests at once: Holm's adjustment, the intersection-union test, chance counts
    ["analysis.claims"],  # the headline claims, each with its one primary test, and their verdicts
    ["analysis.memory"],  # a training step's measured time and peak memory (F9), the fit against the parameters
    ["analysis.schematic", "analysis.spectra", "analysis.trajectories", "analysis.lyapunov", "analysis.inference",
     "analysis.perplexity", "analysis.ablations", "analysis.downstream"],
    ["analysis.attribution", "analysis.model_trajectories", "analysis.clustering"],
    # diffeqformer.report again: the words and the plots of the analyses' data
    ["report.words", "report.words.statistics"],  # the rule, p-values, spreads, comparisons and verdicts in words
    ["report.words.spectra", "report.words.trajectories", "report.words.lyapunov", "report.words.ablations",
     "report.words.language"],
    ["report.plots", "report.plots.schematic", "report.plots.spectra", "report.plots.trajectories",
     "report.plots.lyapunov", "report.plots.ablations", "report.plots.language"],
    # the book's pages of results: the verdicts of the headline claims, the accelerator measurements and their cost
    ["report.verdicts", "report.accelerators"],
    # diffeqformer.workflow: the presets as data, the plan Snakemake schedules, the jobs, the pages, the GPU edition
    ["workflow", "workflow.presets"], ["workflow.plan"], ["workflow.jobs"], ["workflow.edition"],
    ["workflow.pages"],
]
"""The package's modules (below ``diffeqformer.``) in the order data flows through them, from the bottom up: a
module imports only modules of lower layers (``tests/test_layers.py`` checks it, and that every module is placed
here); the book's API page lists the modules in this order."""


def parses_cleanly(lines: list[str]) -> bool:
    """Whether docutils reads ``lines`` as reStructuredText without a warning or error."""
    from docutils import nodes
    from docutils.core import publish_doctree

    stream = io.StringIO()
    try:
        doctree = publish_doctree("\n".join(lines), settings_overrides={
            "report_level": 2, "halt_level": 5, "warning_stream": stream})
    except AttributeError:
        # A Sphinx role (``:attr:`x```, e.g. in a docstring inherited from Levanter) that plain docutils cannot run:
        # it needs Sphinx's build environment.
        return False
    return not stream.getvalue() and not any(doctree.findall(nodes.problematic))


def _process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    if lines and not parses_cleanly(lines):
        lines[:] = ["::", ""] + ["    " + line for line in lines] + [""]


def _attribute_documenter():
    from sphinx.ext.autodoc import AttributeDocumenter

    class ClassPreservingAttributeDocumenter(AttributeDocumenter):
        """Sphinx's attribute documenter, except that it leaves the documented class's ``__annotations__`` alone.

        Sphinx's ``update_annotations`` copies the base classes' annotations, as source strings, into the class's own:
        draccus's ``'ClassVar[Dict[str, Any]]'`` in ``DiffEqFormerConfig`` then breaks decoding any config later in
        the same build (``NameError: name 'ClassVar' is not defined``). The copies only serve type hints, which the
        book does not show (``autodoc_typehints: none``)."""

        def update_annotations(self, parent) -> None:
            pass

    return ClassPreservingAttributeDocumenter


def setup(app):
    app.connect("autodoc-process-docstring", _process_docstring)
    app.setup_extension("sphinx.ext.autodoc")
    app.add_autodocumenter(_attribute_documenter(), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
