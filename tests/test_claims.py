"""diffeqformer.analysis.claims: one primary test per headline claim, named before the numbers; its verdict in the
claim's units, glued for the verdicts page and read back there with Holm's adjustment (workflow.pages)."""

import math

import pytest

from diffeqformer import paths
from diffeqformer.analysis import claims, statistics
from diffeqformer.report import book, verdicts
from diffeqformer.report.words import statistics as wording


def test_every_claim_is_judged_by_its_notebook():
    """Each claim names a notebook of the book that publishes its verdict; names, glue names and directions are
    consistent; the verdicts page has a row for each."""
    notebooks = {p.stem: p.read_text() for p in paths.NOTEBOOKS.glob("*.ipynb")}
    for claim in claims.CLAIMS.values():
        assert claim.name.startswith(claim.figure.lower() + "_") and claim.notebook in notebooks, claim.name
        assert "claims.publish(verdicts" in notebooks[claim.notebook], claim.notebook
        assert (claim.direction == 0) == (claim.margin is not None), claim.name
        assert claim.scale in (claims.PERCENT, claims.PLAIN) and claim.test and claim.rule and claim.says
    assert len({c.glue_name for c in claims.CLAIMS.values()}) == len(claims.CLAIMS)


def test_a_verdict_in_the_claims_units():
    """A log-perplexity comparison is written as a percent ratio, interval and detectable effect alike; JSON and
    back gives the same verdict."""
    c = statistics.compare([5.0, 5.2, 4.9], [5.1, 5.32, 4.99], paired=True)
    v = claims.judge("f6_ours", c)
    assert v.word == statistics.REPRODUCED and v.effect == pytest.approx(100 * math.expm1(c.difference))
    assert (v.low, v.high) == pytest.approx((100 * math.expm1(c.low), 100 * math.expm1(c.high)))
    assert v.detectable == pytest.approx(100 * math.expm1(c.detectable)) and v.n == 3 and v.unit == "seed"
    assert wording.verdict(v).startswith(f"significant, with the paper, before Holm's adjustment: {v.effect:+.1f}% "
                                         f"(95% CI {v.low:+.1f}% to {v.high:+.1f}%), p = ")
    assert claims.Verdict.from_json(v.to_json()) == v
    untested = claims.untested("f6_llama", "no Llama")
    assert wording.verdict(claims.Verdict.from_json(untested.to_json())) == "untested (0 seeds; no Llama)"
    with pytest.raises(ValueError, match="measurement"):
        claims.judge("f9_memory", c)
    slope = claims.judge("f3_dispersion", statistics.one_sample([-0.05, -0.04, -0.06, -0.05]))
    assert slope.word == statistics.REPRODUCED and slope.effect == pytest.approx(-0.05)
    assert "per unit p" in wording.verdict(slope)
    assert wording.effect(slope) == f"-0.050 per unit p (95% CI {slope.low:+.3f} to {slope.high:+.3f})"  # unit once


def test_a_measure_that_does_not_move_leaves_its_claim_untested():
    """Every unit differs by exactly 0 (no run overfit; every model scored 0 on a task): the claim is untested with
    the reason, not inconclusive with a detectable effect of 0; the smallest non-zero constant difference is not."""
    pairs = statistics.compare([0.0] * 6, [0.0] * 6, paired=True)  # 6 seeds
    slopes = statistics.trend([9, 18, 24] * 3, [0.0] * 9, [0, 0, 0, 1, 1, 1, 2, 2, 2])  # 3 seeds, each a flat line
    for judged, n in ((pairs, 6), (slopes, 3)):
        v = claims.judge("f6_overfit", judged)
        assert v.word == statistics.UNTESTED and v.n == n
        assert wording.verdict(v).startswith(f"untested ({n} seeds; {claims.NOTHING_MOVED}")
        assert claims.Verdict.from_json(v.to_json()) == v
    moved = claims.judge("f6_overfit", statistics.compare([0.0] * 6, [0.01] * 6, paired=True))
    assert moved.word == statistics.REPRODUCED and "exact test of their signs" in wording.verdict(moved)
    # one model: no discordant prompt
    same = claims.judge("f5_agreement", statistics.mcnemar([1, 0, 1, 1], [1, 0, 1, 1]))
    assert same.word == statistics.UNTESTED and same.n == 4 and same.unit == "pair"
    assert wording.verdict(same).startswith(f"untested (4 pairs; {claims.NOTHING_MOVED}")
    balanced = claims.judge("f5_agreement", statistics.mcnemar([1, 0, 1, 1], [0, 1, 1, 1]))  # differs, cancels to 0
    assert balanced.word == statistics.INCONCLUSIVE and balanced.low < 0 < balanced.high
    why = "another measure moved"  # said only where the claim stays untested
    assert claims.judge("f6_overfit", pairs, if_untested=why).note == f"{claims.NOTHING_MOVED}; {why}"
    assert claims.judge("f6_overfit", statistics.compare([0.1], [0.2], paired=True), if_untested=why).note.endswith(why)
    assert claims.judge("f6_overfit", statistics.compare([0.0] * 6, [0.01] * 6, paired=True), if_untested=why).note == \
        moved.note


def test_an_interval_is_cut_at_the_largest_possible_effect():
    """A difference of two hit rates lies within +-1: the t interval of 3 models, which reaches past it, is written cut
    there, and an effect detectable only past it is none."""
    v = claims.judge("f5_induction", statistics.compare([0.1, 0.9, 0.2], [0.8, 0.3, 0.95], paired=True))
    assert v.low < -1 and v.high > 1 and v.detectable > 1  # the test's own numbers are kept
    assert wording.effect(v) == f"{v.effect:+.3f} hit@1 (95% CI -1.000 to +1.000)"
    assert wording.detectable(v) == "none with these seeds (past the largest possible, 1.000 hit@1)"


def test_significant_but_negligible_and_equivalence():
    tiny = claims.judge("f6_ours", statistics.compare([5.000, 5.001, 5.002], [5.004, 5.0055, 5.0065], paired=True))
    assert tiny.word == statistics.REPRODUCED and tiny.negligible and "negligible" in wording.verdict(tiny)
    same = claims.judge("f7_full", statistics.compare([0.005, -0.015, 0.015], [0.0] * 3, paired=True))
    assert same.word == statistics.REPRODUCED and "equivalence shown 80% of the time within" in wording.verdict(same)
    vague = claims.judge("f7_full", statistics.compare([0.2, -0.15, 0.05], [0.0] * 3, paired=True))
    assert vague.word == statistics.INCONCLUSIVE
    assert wording.pointing(vague.of, vague.effect) == "within the margin of +-5.0%"  # +3.4%, yet not shown
    far = claims.judge("f7_full", statistics.compare([0.2, 0.05, 0.1], [0.0] * 3, paired=True))
    assert wording.pointing(far.of, far.effect) == "outside the margin of +-5.0%"
    # an exploratory comparison of the same claim says what it found, and which way, not the headline's word
    assert wording.exploratory(same) == "equivalent within the margin of +-5.0%"
    assert wording.exploratory(vague) == "equivalence not shown, within the margin of +-5.0%"
    assert wording.exploratory(tiny) == "significant, with the paper"
    against = claims.judge("f6_ours", statistics.compare([5.2, 4.9, 5.3], [5.0, 5.0, 5.1], paired=True))
    assert against.word == statistics.INCONCLUSIVE
    assert wording.exploratory(against) == "not significant, pointing against the paper"


def test_a_claim_with_parts_shows_each_parts_sign():
    """F2 needs both radii to grow: the intersection-union test decides by the part against the claim, and the
    verdict keeps both parts' effects, which its page's opening shows with their directions."""
    grows, shrinks = statistics.one_sample([0.3, 0.25, 0.35]), statistics.one_sample([-1.3, -1.4, -1.2])
    v = claims.intersection("f2_growth", {"the QK radius": shrinks, "the OV radius": grows})
    assert v.word == statistics.CONTRADICTED and v.note == "decided by the QK radius"
    assert v.effect == pytest.approx(-1.3)
    assert [name for name, *_ in v.parts] == ["the QK radius", "the OV radius"]
    assert claims.Verdict.from_json(v.to_json()) == v
    sentence = verdicts.claim_sentence((v, 0.01), 3)
    assert sentence.startswith(f"**contradicted**: {wording.effect(v)}, pointing against the paper; ")
    assert "the QK radius -1.30" in sentence and "the OV radius +0.30" in sentence
    assert sentence.count("against the paper") == 2 and sentence.count("with the paper") == 1


def _glue(name: str, text: str) -> dict:
    """A ``glue`` output of an executed notebook, as ``report.figures.glue`` writes a string."""
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}},
            "data": {"application/papermill.record/text/plain": repr(text), "text/plain": [repr(text)]}}


def _glued(verdicts) -> dict[str, str]:
    """What a notebook whose outputs glue ``verdicts`` glued, as ``report.book.glued`` reads it."""
    return book.glued({"cells": [{"cell_type": "code", "outputs": [_glue(v.of.glue_name, v.to_json())
                                                                   for v in verdicts]}]})


def test_the_verdicts_page_is_a_table_adjusted_by_holm():
    """Five claims tested, two significant before the adjustment: the one whose Holm p stays below 0.05 keeps its
    word, the other (p x 4 by Holm) is inconclusive after Holm and says what it was before; a claim no notebook
    judged says so; every claim's rule is under the table."""
    strong = claims.judge("f6_ours", statistics.compare([5.0, 5.2, 4.9, 5.1, 5.0], [5.3, 5.49, 5.21, 5.4, 5.31],
                                                   paired=True))
    weak = claims.judge("f8_beta2", statistics.one_sample([-0.05, -0.03, -0.04]))
    noisy = [claims.judge(name, statistics.one_sample([0.1, -0.2, 0.15])) for name in ("f6_shared", "f6_overfit",
                                                                                   "f6_llama")]
    assert strong.p < 0.005 and 0.01 < weak.p < 0.05 and all(v.word == statistics.INCONCLUSIVE for v in noisy)
    here = {"f6_perplexity": _glued([strong, *noisy]), "f8_beta2": _glued([weak])}
    page = verdicts.verdicts_markdown("cpu", verdicts.holm_verdicts(here), None)
    def row(name):
        claim = claims.CLAIMS[name]
        return next(line for line in page.splitlines()
                    if line.startswith(f"| {claim.figure} ({{doc}}`page </notebooks/{claim.notebook}>`): "
                                       f"{claim.paper} |"))

    assert "| **reproduced**: " in row("f6_ours")
    f8 = row("f8_beta2")
    assert "**inconclusive after Holm (reproduced before)**" in f8 and f"p = {weak.p:.2g}, Holm " in f8
    assert f8.endswith(f"| {verdicts.NO_GPU_VERDICT} |")
    assert "| not computed by this preset |" in row("f10_hypernet")
    assert claims.CLAIMS["f11_lastword"].paper_value in page and "The 5 claims tested here" in page
    for claim in claims.CLAIMS.values():
        assert f"- **{claim.figure}**, {claim.paper}: {claim.test}; {claim.rule}." in page


def test_a_page_opens_with_the_verdicts_page_verdict():
    """A figure's page opens with the same adjusted verdicts as the verdicts page: a word Holm's adjustment changed
    says so there too, an inconclusive one which way its estimate points; a page without a headline claim has no
    opening."""
    weak = claims.judge("f8_beta2", statistics.one_sample([-0.05, -0.03, -0.04]))
    strong = claims.judge("f6_ours", statistics.compare([5.0, 5.2, 4.9, 5.1, 5.0], [5.3, 5.49, 5.21, 5.4, 5.31],
                                                   paired=True))
    shared = claims.judge("f6_shared", statistics.one_sample([-0.1, -0.2, 0.15]))  # the weight-shared model better
    noisy = [claims.judge(name, statistics.one_sample([0.1, -0.2, 0.15])) for name in ("f6_overfit", "f6_llama")]
    here = {"f6_perplexity": _glued([strong, shared, *noisy]), "f8_beta2": _glued([weak])}
    judged = verdicts.holm_verdicts(here)
    f8 = verdicts.opening_markdown("f8_beta2", judged, "cpu")
    assert f8.startswith("```{admonition} The verdict at the cpu preset\n:class: verdict\n")
    assert (f"**inconclusive after Holm (reproduced before)**: {wording.effect(weak)}, pointing with the paper; "
            f"{wording.p_text(weak.p)}, {judged['f8_beta2'][1]:.2g} after Holm's adjustment across 5 claims") in f8
    page = verdicts.verdicts_markdown("cpu", verdicts.holm_verdicts(here), None)
    assert "**inconclusive after Holm (reproduced before)**" in page
    f6 = verdicts.opening_markdown("f6_perplexity", judged, "cpu")
    assert "*DiffEqFormer reaches a lower" in f6 and f"**reproduced**: {wording.effect(strong)}, pointing with" in f6
    assert f"**inconclusive**: {wording.effect(shared)}, pointing against the paper" in f6
    assert verdicts.opening_markdown("f1_model", judged, "cpu") is None
    assert "**not computed by this preset**" in verdicts.opening_markdown("f9_time_embedding", judged, "cpu")


def test_the_opening_follows_the_title():
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# F8: beta2\n\n**The question.** ..."},
                    {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": []}]}
    book.reader_view(nb, "VERDICT")
    assert [c["source"] for c in nb["cells"][:3]] == ["# F8: beta2", "VERDICT", "**The question.** ..."]
    assert nb["cells"][3]["metadata"]["tags"] == ["hide-input"]
    with pytest.raises(ValueError, match="title"):
        book.reader_view({"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": []}]}, "V")
