"""The book's verdicts, adjusted once: every headline claim of the paper (``analysis.claims.CLAIMS``) with the verdict
its notebook glued, Holm-adjusted across the claims tested in the build (``holm_verdicts``), in two places that
therefore say the same: the Verdicts page (this build beside the GPU edition, and how each claim is decided) and the
opening of each figure's page (``opening_markdown``: the adjusted verdict, its effect and interval, and which way
the estimate points against the paper's claim, each part's where a claim has parts)."""

from __future__ import annotations

from typing import Mapping

from ..analysis import claims, multiplicity, statistics
from .words import statistics as wording

NO_GPU_VERDICT = "no GPU edition yet"


def verdicts_markdown(preset: str, ours: Mapping[str, tuple | None], gpu: Mapping[str, Mapping[str, str]] | None,
                      gpu_folder: str = "gpu") -> str:
    """The book's headline verdicts as one table: per claim (``claims.CLAIMS``, its page linked), the paper's number
    where the paper gives one, the verdict of this build's ``preset`` (``ours``: its ``holm_verdicts``) and the GPU
    edition's (``gpu``, its pages staged in ``gpu_folder``; None: ``NO_GPU_VERDICT``), each with its
    effect and 95% interval in the claim's units and its p adjusted by Holm's method across the claims tested in that
    build (``holm_verdicts``); under it, the primary test and the combining rule of each claim, a sentence each."""
    theirs = holm_verdicts(gpu) if gpu is not None else {}
    tested = sum(v is not None and v[1] is not None for v in ours.values())
    out = [f"Each headline claim of the paper, judged by one primary test named before the numbers (listed under the "
           f"table), at the `{preset}` preset this book was built with and in the GPU edition (`gpu` preset). "
           f"The verdicts: *reproduced* (significant in the paper's direction), *contradicted* (significant against "
           f"it), *inconclusive* (not significant: the interval and the smallest effect the design detects 80% of the "
           f"time say how much it could have missed), *untested*. The {tested} claims tested here are adjusted "
           f"together by Holm's method: a verdict is significant only when its adjusted p is below 0.05 (the "
           f"figure's page gives the unadjusted p). The rule: {wording.RULE}.", "",
           f"| claim | the paper | `{preset}` preset | GPU edition |", "|---|---|---|---|"]
    for claim in claims.CLAIMS.values():
        gpu_page = (f", {{doc}}`GPU </{gpu_folder}/{claim.notebook}>`"
                    if gpu and claim.notebook in gpu else "")
        page = f"{claim.figure} ({{doc}}`page </notebooks/{claim.notebook}>`{gpu_page})"
        mine = _verdict_cell(ours.get(claim.name), "not computed by this preset")
        other = NO_GPU_VERDICT if gpu is None else _verdict_cell(theirs.get(claim.name), "not in the GPU edition")
        out.append(f"| {page}: {claim.paper} | {claim.paper_value or 'no number in the paper text'} | {mine} "
                   f"| {other} |")
    return "\n".join(out + ["", "How each claim is decided:", "", claims_markdown()])


def bottom_line_markdown(preset: str, judged: Mapping[str, tuple | None]) -> str:
    """The intro's bottom line: how many headline claims each adjusted verdict has at ``preset`` (``judged``: its
    ``holm_verdicts``), then per claim its page, the adjusted word, the effect and which way it points, linked to the
    verdicts page."""
    words = [adjusted_word(*found).split(" after ")[0] if found else "not computed" for found in judged.values()]
    counts = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(
        (*statistics.WORDS, "not computed")) if w in words)
    out = [f"At the `{preset}` preset this book was built with, the paper's {len(judged)} headline claims are "
           f"{counts}, after Holm's adjustment across the claims tested ({{doc}}`/book/verdicts` has the "
           f"intervals, the p-values and the GPU edition):", "",
           "| claim | verdict | effect (95% CI) |", "|---|---|---|"]
    for claim in claims.CLAIMS.values():
        found = judged.get(claim.name)
        if found is None or found[0].word == statistics.UNTESTED:
            effect = ""
        else:
            where = "" if found[1] is None else f", {wording.pointing(claim, found[0].effect)}"
            effect = wording.effect(found[0]) + where
        word = adjusted_word(*found) if found else "not computed by this preset"
        out.append(f"| {claim.figure} ({{doc}}`page </notebooks/{claim.notebook}>`): {claim.paper} | {word} | "
                   f"{effect} |")
    return "\n".join(out) + "\n"


def claims_markdown() -> str:
    """Every headline claim (``claims.CLAIMS``) with its one primary test and how the verdict follows from it, one
    item each: on the method page and under the verdicts page's table."""
    return "\n".join(f"- **{c.figure}**, {c.paper}: {c.test}; {c.rule}." for c in claims.CLAIMS.values()) + "\n"


def holm_verdicts(notebooks: Mapping[str, Mapping[str, str]] | None) -> dict[str, tuple | None]:
    """Claim name -> (its ``claims.Verdict`` as glued by its notebook in ``notebooks`` (notebook -> glued values),
    its p adjusted by Holm's method across every claim tested there, or None for one without p), or None where the
    notebook glued none."""
    found = {}
    for claim in claims.CLAIMS.values():
        text = (notebooks or {}).get(claim.notebook, {}).get(claim.glue_name)
        found[claim.name] = claims.Verdict.from_json(text) if text else None
    names = [n for n, v in found.items() if v is not None and v.word != statistics.UNTESTED and not v.of.measured]
    adjusted = dict(zip(names, multiplicity.holm([found[n].p for n in names])))
    return {n: (v, adjusted.get(n)) if v is not None else None for n, v in found.items()}


def adjusted_word(verdict: claims.Verdict, adjusted: float | None) -> str:
    """The verdict's word after Holm's adjustment (``adjusted``: its adjusted p, None for a claim without one): a
    significant word whose adjusted p is not below 0.05 becomes ``inconclusive after Holm (<word> before)``. An
    equivalence claim contradicted by its two-sided interval (not by its p, the TOST's) keeps its word."""
    word = verdict.word
    holds = adjusted is None or (verdict.of.margin is not None and word == statistics.CONTRADICTED)
    if word in (statistics.REPRODUCED, statistics.CONTRADICTED) and not holds and not adjusted < statistics.LEVEL:
        return f"{statistics.INCONCLUSIVE} after Holm ({word} before)"
    return word


def _parts_text(verdict: claims.Verdict) -> str:
    c = verdict.of
    return "; ".join(f"{name} {c.format(effect)} (95% CI {c.format(low, unit=False)} to {c.format(high, unit=False)}, "
                     f"{wording.p_text(p)}, pointing {wording.pointing(c, effect)})"
                     for name, effect, low, high, p in verdict.parts)


def claim_sentence(found: tuple | None, tested: int) -> str:
    """One claim's adjusted verdict for its page's opening: the word in bold, which way the estimate points, the
    effect with its interval, p before and after Holm's adjustment across the ``tested`` claims, the smallest effect
    the design detects, and each part of a claim with parts."""
    if found is None:
        return "**not computed by this preset**"
    verdict, adjusted = found
    c = verdict.of
    word = adjusted_word(verdict, adjusted)
    if verdict.word == statistics.UNTESTED:
        return f"**{word}**: {verdict.note or 'too few seeds'}."
    if adjusted is None:
        return f"**{word}**, {c.says} as measured: {wording.effect(verdict)}" + (f"; {verdict.note}" if verdict.note
                                                                                 else "") + "."
    margin = c.margin is not None
    out = (f"**{word}**{', negligible' if verdict.negligible else ''}: {wording.effect(verdict)}, "
           f"{'' if margin else 'pointing '}{wording.pointing(c, verdict.effect)}; {wording.p_text(verdict.p)}, "
           f"{adjusted:.2g} after Holm's adjustment across {tested} claims; "
           f"{verdict.test} over {verdict.n} {verdict.unit}{'' if verdict.n == 1 else 's'}")
    if word.startswith(statistics.INCONCLUSIVE):
        label = "equivalence shown 80% of the time within" if c.margin is not None else "detectable 80% of the time"
        out += f"; {label}: {wording.detectable(verdict)}"
    if verdict.parts:
        out += f". Each part: {_parts_text(verdict)}"
    elif verdict.note:
        out += f"; {verdict.note}"
    return out + (f". The paper: {c.paper_value}." if c.paper_value else ".")


OPENING_CLASS = "verdict"
"""The CSS class of a page's opening verdict (the browser test finds it by it)."""


def opening_markdown(notebook: str, judged: Mapping[str, tuple | None], preset: str) -> str | None:
    """The opening of a figure's page: its headline claims' verdicts (``judged``: ``holm_verdicts`` of the build), a
    sentence each (``claim_sentence``), in an admonition, linked to the Verdicts page; None for a page without a
    headline claim."""
    mine = [c for c in claims.CLAIMS.values() if c.notebook == notebook]
    if not mine:
        return None
    tested = sum(v is not None and v[1] is not None for v in judged.values())
    items = [f"- *{c.paper}*: {claim_sentence(judged.get(c.name), tested)}" for c in mine]
    # no backticks in the title: a fence's info string cannot hold any (CommonMark)
    return "\n".join([f"```{{admonition}} The verdict at the {preset} preset", f":class: {OPENING_CLASS}",
                      *items, "", f"The rule, for every test on this page: {wording.RULE}. A headline claim's "
                      "verdict is significant only when its p after Holm's adjustment across the book's claims is "
                      "below 0.05; every other comparison on the page is exploratory. Every headline claim with its "
                      "primary test: {doc}`/book/verdicts`.", "```"])


def _verdict_cell(found: tuple | None, missing: str) -> str:
    """One verdict in a table cell: the word after Holm's adjustment in bold, the effect with its interval, the
    unadjusted and adjusted p, and the smallest effect detected 80% of the time; a word that Holm's adjustment
    changed says what it was before."""
    if found is None:
        return missing
    verdict, adjusted = found
    if adjusted is None:
        return f"**{verdict.word}**" + (f": {wording.effect(verdict)}" if verdict.word != statistics.UNTESTED else
                                        f" ({verdict.note})" if verdict.note else "")
    negligible = ", negligible" if verdict.negligible else ""
    return (f"**{adjusted_word(verdict, adjusted)}**{negligible}: {wording.effect(verdict)} "
            f"({wording.pointing(verdict.of, verdict.effect)}); p = {verdict.p:.2g}, Holm {adjusted:.2g}; "
            f"detectable: {wording.detectable(verdict)}")
