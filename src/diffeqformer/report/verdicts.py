"""The Verdicts page: every headline claim of the paper (``analysis.claims.CLAIMS``) with the verdict its notebook
glued in this build and in the GPU edition, Holm-adjusted across the claims tested in each, and how each claim is
decided (the method page shows that list too)."""

from __future__ import annotations

from typing import Mapping

from ..analysis import claims, seeds

NO_GPU_VERDICT = "no GPU edition yet"


def verdicts_markdown(preset: str, here: Mapping[str, Mapping[str, str]],
                      gpu: Mapping[str, Mapping[str, str]] | None, gpu_folder: str = "gpu") -> str:
    """The book's headline verdicts as one table: per claim (``claims.CLAIMS``, its page linked), the paper's number
    where the paper gives one, the verdict of this build's ``preset`` (``here``: notebook -> the values its execution
    glued) and the GPU edition's (``gpu``, its pages staged in ``gpu_folder``; None: ``NO_GPU_VERDICT``), each with its
    effect and 95% interval in the claim's units and its p adjusted by Holm's method across the claims tested in that
    build (``holm_verdicts``); under it, the primary test and the combining rule of each claim, a sentence each."""
    ours = holm_verdicts(here)
    theirs = holm_verdicts(gpu) if gpu is not None else {}
    tested = sum(v is not None and v[1] is not None for v in ours.values())
    out = [f"Each headline claim of the paper, judged by one primary test named before the numbers (listed under the "
           f"table), at the `{preset}` preset this book was built with and in the GPU edition (`gpu` preset). "
           f"The verdicts: *reproduced* (significant in the paper's direction), *contradicted* (significant against "
           f"it), *inconclusive* (not significant: the interval and the smallest effect the design detects 80% of the "
           f"time say how much it could have missed), *untested*. The {tested} claims tested here are adjusted "
           f"together by Holm's method: a verdict is significant only when its adjusted p is below 0.05 (the "
           f"figure's page gives the unadjusted p). The rule: {seeds.RULE}.", "",
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
    names = [n for n, v in found.items() if v is not None and v.word != seeds.UNTESTED and not v.of.measured]
    adjusted = dict(zip(names, seeds.holm([found[n].p for n in names])))
    return {n: (v, adjusted.get(n)) if v is not None else None for n, v in found.items()}


def _verdict_cell(found: tuple | None, missing: str) -> str:
    """One verdict in a table cell: the word after Holm's adjustment in bold, the effect with its interval, the
    unadjusted and adjusted p, and the smallest effect detected 80% of the time; a word that Holm's adjustment
    changed says what it was before."""
    if found is None:
        return missing
    verdict, adjusted = found
    if adjusted is None:
        return f"**{verdict.word}**" + (f": {verdict.effect_text()}" if verdict.word != seeds.UNTESTED else
                                        f" ({verdict.note})" if verdict.note else "")
    word = verdict.word
    # an equivalence claim is contradicted by its two-sided interval, not by its p (the TOST's): Holm leaves it
    holds = verdict.of.margin is not None and word == seeds.CONTRADICTED
    if word in (seeds.REPRODUCED, seeds.CONTRADICTED) and not holds and not adjusted < seeds.LEVEL:
        word = f"{seeds.INCONCLUSIVE} after Holm ({verdict.word} before)"
    negligible = ", negligible" if verdict.negligible else ""
    return (f"**{word}**{negligible}: {verdict.effect_text()}; p = {verdict.p:.2g}, Holm {adjusted:.2g}; "
            f"detectable: {verdict.detectable_text()}")
