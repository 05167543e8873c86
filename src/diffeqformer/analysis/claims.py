"""The paper's headline claims, each with the one primary test that judges it, named here before any number is seen.

Exactly one test per claim (``CLAIMS``) decides its verdict; everything else a page tests is exploratory. A claim of
several things at once (F2: both matrices; F6: sharing worse than both models) combines them by the intersection-union
test (``intersection``). The book adjusts the primary tests together by Holm's method (``report.verdicts``). A
notebook judges its claims with ``judge``, ``intersection`` or ``measured`` and glues each ``Verdict`` (``publish``).
"""

from __future__ import annotations

import json
import math
import dataclasses
from dataclasses import asdict, dataclass
from typing import Mapping

from . import multiplicity, statistics

PERCENT, PLAIN = "percent", "plain"
"""How a claim's effect is written: ``PERCENT``, a log ratio (of perplexities) shown as the percent change of the
ratio, 100 (e^x - 1), interval and detectable effect alike; ``PLAIN``, the test's own number with ``Claim.unit``."""

NEGLIGIBLE_PERCENT = 1.0
"""The practical threshold of a perplexity ratio: a change within +-1% is negligible at any scale this book trains
(a significant one is reported as such, and as negligible)."""
EQUIVALENCE_PERCENT = 5.0
"""The margin of "comparable" (F7 under full fine-tuning): a ratio of perplexities within +-5%, stated before the
numbers."""


@dataclass(frozen=True)
class Claim:
    """One headline claim of the paper and the one test that judges it."""

    name: str
    """Key, also the stem of its glued verdict (``glue_name``), e.g. ``f6_ours``."""
    figure: str
    """The book's figure id (F2, ..., F11)."""
    notebook: str
    """The notebook that judges it."""
    paper: str
    """The claim, as ``PAPER.md`` states it."""
    test: str
    """The primary test in words: which number per unit (seed, simulation, pretraining), which test."""
    rule: str
    """How the verdict follows from the test, in one sentence (the combining rule, where several tests combine)."""
    says: str
    """What the claim says at this scale, as a clause: "DiffEqFormer ends below GPT-2" (the opening of its page,
    ``report.verdicts.opening_markdown``)."""
    direction: int
    """The sign of the effect the paper claims (+1 or -1); 0 for a claim of equivalence (``margin``)."""
    scale: str = PERCENT
    """``PERCENT`` or ``PLAIN``: how the effect is written."""
    unit: str = ""
    """Words after the number (after its % where ``PERCENT``), e.g. `` per unit t``."""
    digits: int = 1
    """Decimals of the written effect."""
    paper_value: str | None = None
    """The paper's own number for the effect, where the paper gives one."""
    margin: float | None = None
    """The equivalence margin of a claim of "comparable", in the test's units (a log ratio for ``PERCENT``)."""
    negligible: float | None = None
    """The practical threshold, in written units: a significant effect smaller than it is negligible."""
    measured: bool = False
    """A measurement without seeds to test it by (F9's memory): a verdict without p."""
    limit: float | None = None
    """The largest size the effect can have, in written units (a difference of two rates: 1): its 95% interval is
    written cut at +-limit (the t interval of a few seeds can reach past it), and a detectable effect beyond it is
    none."""

    @property
    def glue_name(self) -> str:
        """The name its notebook glues the verdict (JSON) under."""
        return f"{self.name}_claim"

    def written(self, value: float) -> float:
        """A value of the test's scale in the claim's written units (``scale``)."""
        return statistics.percent(value) if self.scale == PERCENT else value

    def format(self, value: float, *, sign: bool = True, unit: bool = True) -> str:
        """``-9.2%`` or ``+0.10 per unit p`` (``unit`` False: ``+0.10``, a percentage keeping its ``%``)."""
        if not math.isfinite(value):
            return "n/a" if math.isnan(value) else "none"
        written = self.unit if unit else ""
        return f"{value:{'+' if sign else ''}.{self.digits}f}{'%' if self.scale == PERCENT else ''}{written}"


LOG_RATIO_TEST = "the paired t-test over seeds of the final validation log-perplexities"

CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("f2_growth", "F2", "f2_spectra", "the QK and OV eigenvalue magnitudes grow with t (Fig. 2a-b)",
          "per seed, the least-squares slope of the log spectral radius (head mean) against t, for QK and for OV; "
          "the one-sample t-test of the seeds' slopes against 0",
          "reproduced only when both matrices grow (the intersection-union test: both slopes positive at p < 0.05, "
          "its p the larger of the two); contradicted when either shrinks significantly",
          "the QK and OV spectral radii grow with t",
          +1, PLAIN, " per unit t", 2),
    Claim("f3_dispersion", "F3", "f3_trajectories", "with W(t) = t^p W(0) tokens cluster less as p grows (Fig. 2c-d, "
          "Fig. 13): the paper's random weights, accurate solve",
          "per simulation, the least-squares slope of the fraction of clustered token pairs at T against p "
          "(p = 0..4); the one-sample t-test of the simulations' slopes against 0 (the exact sign-flip test where "
          "every simulation has the same slope)",
          "reproduced when the fraction falls with p (a negative slope) at p < 0.05; the simulation is the unit",
          "the fraction of clustered token pairs falls as the growth power p rises",
          -1, PLAIN, " per unit p", 3),
    Claim("f5_agreement", "F5", "f5_lyapunov", "token-level Lyapunov exponents attribute a prediction to the tokens "
          "it depends on, more soundly than attention maps (Fig. 3): agreement prompts",
          "per seed's model, hit@1 of the largest exponent less hit@1 of attention on the synthetic language's "
          "agreement prompts; the paired t-test over the models (the exact McNemar test over prompts with one model)",
          "reproduced when the largest exponent ranks the source token first more often than attention, p < 0.05",
          "the largest Lyapunov exponent finds the source token of agreement prompts more often than attention",
          +1, PLAIN, " hit@1", 3, limit=1.0),
    Claim("f5_induction", "F5", "f5_lyapunov", "as above, on the synthetic language's induction prompts",
          "as for agreement, on the induction prompts",
          "reproduced when the largest exponent ranks the source token first more often than attention, p < 0.05",
          "the largest Lyapunov exponent finds the source token of induction prompts more often than attention",
          +1, PLAIN, " hit@1", 3, limit=1.0),
    Claim("f6_ours", "F6", "f6_perplexity", "DiffEqFormer reaches a lower validation perplexity than GPT-2 "
          "(Tables 1-2)", f"{LOG_RATIO_TEST}, DiffEqFormer less GPT-2 (a ratio of perplexities)",
          "reproduced when DiffEqFormer's perplexity is lower at p < 0.05",
          "DiffEqFormer ends at a lower validation perplexity than GPT-2",
          -1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f6_shared", "F6", "f6_perplexity", "weight sharing is worst (Table 1)",
          f"{LOG_RATIO_TEST}, the weight-shared model less GPT-2 and less DiffEqFormer",
          "reproduced only when it is worse than both (the intersection-union test: both ratios above 1 at "
          "p < 0.05, its p the larger); the effect shown is the one that decides",
          "the weight-shared model ends worse than both GPT-2 and DiffEqFormer",
          +1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f6_overfit", "F6", "f6_perplexity", "DiffEqFormer overfits less than GPT-2 (Fig. 4)",
          "per seed, how far the final validation perplexity ends above the run's best (log ratio); the paired "
          "t-test over seeds, DiffEqFormer less GPT-2",
          "reproduced when DiffEqFormer ends closer to its best at p < 0.05; the training-validation gap is "
          "exploratory", "DiffEqFormer's validation perplexity ends closer to its best than GPT-2's",
          -1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f6_llama", "F6", "f6_perplexity", "the DiffEqFormer variant of Llama beats Llama (Table 2, Fig. 8)",
          f"{LOG_RATIO_TEST}, DiffEqFormer's Llama variant less Llama",
          "reproduced when the variant's perplexity is lower at p < 0.05",
          "DiffEqFormer's Llama variant ends below Llama",
          -1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f7_lora", "F7", "f7_finetuning", "under LoRA, the 18-step DiffEqFormer discretised to 9-24 steps "
          "fine-tunes better than a 24-layer GPT-2 (Fig. 5)",
          "per pretraining seed (each model pretrained with that seed, then fine-tuned once), the mean over both "
          "directions and every N of the final validation log-perplexity of DiffEqFormer less GPT-2's; the "
          "one-sample t-test over the pretraining seeds",
          "reproduced when DiffEqFormer's mean perplexity is lower at p < 0.05; each direction and N is exploratory",
          "under LoRA the fine-tuned DiffEqFormers end below the fine-tuned GPT-2",
          -1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f7_full", "F7", "f7_finetuning", "under full fine-tuning DiffEqFormer and GPT-2 are comparable (Fig. 5)",
          "the same mean over directions and N under full fine-tuning, tested for equivalence within "
          f"+-{EQUIVALENCE_PERCENT:g}% by two one-sided t-tests (TOST) over the pretraining seeds",
          f"reproduced when the ratio lies within +-{EQUIVALENCE_PERCENT:g}% (both one-sided tests at p < 0.05), "
          "contradicted when its 95% interval lies wholly outside",
          f"under full fine-tuning DiffEqFormer and GPT-2 end within +-{EQUIVALENCE_PERCENT:g}% of each other", 0,
          margin=math.log1p(EQUIVALENCE_PERCENT / 100)),  # its margin is the threshold: no second, 'negligible' one
    Claim("f7_overfit", "F7", "f7_finetuning", "under full fine-tuning, fewer steps N overfit less on WikiText-103 "
          "(Fig. 5); here prose -> plays, plays standing for WikiText-103",
          "per pretraining seed, the rise of the final validation perplexity above the run's best (log ratio) of "
          "DiffEqFormer fine-tuned with each N; the slope of the rise against N with an intercept per pretraining "
          "seed, by its t-test",
          "reproduced when the rise grows with N (a positive slope) at p < 0.05",
          "under full fine-tuning the validation perplexity of DiffEqFormer rises further above its best the more "
          "steps N it is fine-tuned with",
          +1, PERCENT, " per step N", 2),
    Claim("f8_beta2", "F8", "f8_beta2", "beta2 = 0.95 helps DiffEqFormer and hurts GPT-2 (Fig. 7, App. C.5)",
          "per seed, the interaction: DiffEqFormer's log-perplexity change from beta2 = 0.999 to 0.95 less "
          "GPT-2's; the one-sample t-test over seeds (seed k of all four settings shares its data order)",
          "reproduced when the lower beta2 does DiffEqFormer more good (or less harm) than GPT-2 at p < 0.05; each "
          "model's own change is exploratory", "the lower beta2 does DiffEqFormer more good than GPT-2",
          -1, negligible=NEGLIGIBLE_PERCENT),
    Claim("f9_dt", "F9", "f9_time_embedding", "perplexity improves with the time embedding's size d_t (Fig. 14)",
          "the least-squares slope of every seed's final validation log-perplexity against log2 d_t, with an "
          "intercept per seed, by its t-test",
          "reproduced when perplexity falls as d_t doubles at p < 0.05", "perplexity falls as d_t grows",
          -1, unit=" per doubling"),
    Claim("f9_memory", "F9", "f9_time_embedding", "peak memory grows far less than the parameter count with d_t "
          "(Fig. 16)", "from the smallest d_t to the largest, the relative growth of the peak memory of a training "
          "step over the parameter count's: (memory ratio - 1) / (parameter ratio - 1); what an added parameter "
          "costs is exploratory", "reproduced when the memory grows by less than half as much as the parameters "
          "(below 0.5); a measurement (one per d_t), not a test over seeds",
          "the peak memory grows by less than half as much as the parameter count",
          -1, PLAIN, " of the parameters' growth", 2, measured=True),
    Claim("f10_hypernet", "F10", "f10_hypernetwork", "the per-weight hypernetwork beats one MLP shared by every "
          "weight (Fig. 18)", f"{LOG_RATIO_TEST}, per-weight MLPs less one shared MLP",
          "reproduced when the per-weight design's perplexity is lower at p < 0.05",
          "per-weight MLPs end below one shared MLP",
          -1,
          negligible=NEGLIGIBLE_PERCENT),
    Claim("f11_lastword", "F11", "f11_downstream", "DiffEqFormer gains on zero- and five-shot tasks, significantly on "
          "LAMBADA (Tables 4-5)",
          "the zero-shot accuracy on the LAMBADA-style last-word task (LAMBADA itself where the preset evaluates the "
          "paper's tasks), DiffEqFormer less GPT-2, by the paired t-test over seeds",
          "reproduced when DiffEqFormer is more accurate at p < 0.05; every other task, shot count and model pair is "
          "exploratory", "DiffEqFormer answers the last-word task right more often than GPT-2",
          +1, PLAIN, " accuracy", 3,
          paper_value="+0.0115 (LAMBADA OpenAI zero-shot, 37.24% to 38.39% against GPT-large, Table 4)"),
)}
"""Every headline claim, in the order of the book (the verdicts page's rows)."""


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict (``statistics.WORDS``), effect, 95% interval, the smallest effect the design detects 80% of
    the time (in the claim's units), and the primary test's unadjusted p, units and name."""

    claim: str
    word: str
    effect: float
    low: float
    high: float
    p: float
    detectable: float
    n: int
    unit: str
    test: str
    note: str = ""
    """What else the reader needs (which test decided an intersection, why there is no interval)."""
    parts: tuple = ()
    """For a claim that needs several things at once (``intersection``): per part, (its name, effect, 95% interval
    low and high in the claim's units, p), so that each part's sign shows."""

    @property
    def of(self) -> Claim:
        return CLAIMS[self.claim]

    @property
    def negligible(self) -> bool:
        """Significant and smaller than the claim's practical threshold."""
        c = self.of
        return (c.negligible is not None and self.word in (statistics.REPRODUCED, statistics.CONTRADICTED)
                and abs(self.effect) < c.negligible)

    def to_json(self) -> str:
        def plain(v):
            return None if isinstance(v, float) and math.isnan(v) else [plain(x) for x in v] if isinstance(
                v, (list, tuple)) else v

        return json.dumps({k: plain(v) for k, v in asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> "Verdict":
        values = json.loads(text)
        values["parts"] = tuple(tuple(math.nan if x is None else x for x in part) for part in values.get("parts", ()))
        return cls(**{k: (math.nan if v is None and k in FLOATS else v) for k, v in values.items()})

    def glue(self) -> None:
        """Glue the verdict (as JSON, under ``Claim.glue_name``) for the book's job (``report.verdicts``)."""
        from ..report import figures

        figures.glue(self.of.glue_name, self.to_json())


FLOATS = ("effect", "low", "high", "p", "detectable")


def judge(name: str, judged: statistics.Judged, *, note: str = "", unit: str | None = None,
          if_untested: str = "") -> Verdict:
    """``Verdict`` of claim ``name`` from its primary test ``judged`` (a ``statistics.Comparison``, ``Trend`` or, for a
    claim with a ``margin``, the comparison tested for equivalence by ``statistics.equivalence``); ``unit`` names what
    the test counts when it is not a seed (a simulation, a pretraining seed); ``if_untested`` is added to the note of an
    untested verdict (why what did move at this scale does not decide the claim)."""
    claim = CLAIMS[name]
    if claim.measured:
        raise ValueError(f"{name} is a measurement: use claims.measured")
    if claim.margin is not None:
        if not isinstance(judged, statistics.Comparison):
            raise ValueError(f"{name} is a claim of equivalence: judge it from a statistics.Comparison")
        judged = statistics.equivalence(judged, claim.margin)
        word = judged.word()
    else:
        word = judged.word(claim.direction)
    if isinstance(judged, statistics.Trend):
        n, counted, low, high = judged.groups, "seed", judged.low, judged.high
    else:
        base = judged.comparison if isinstance(judged, statistics.Equivalence) else judged
        n, counted, low, high = base.n, base.unit, base.low, base.high
    why = f"; {if_untested}" if if_untested else ""
    if claim.margin is None and judged.nothing_moved:
        return Verdict(name, statistics.UNTESTED, math.nan, math.nan, math.nan, math.nan, math.nan, n, unit or counted,
                       judged.test, NOTHING_MOVED + (f"; {note}" if note else "") + why)
    if judged.exact and not note:
        note = "no spread between the units: the exact test of their signs decides"
    if word == statistics.UNTESTED:
        note += why
    detectable = judged.detectable
    return Verdict(name, word, claim.written(judged.effect), claim.written(low), claim.written(high),
                   float(judged.p), claim.written(detectable) if math.isfinite(detectable) else detectable, n,
                   unit or counted, judged.test, note)


NOTHING_MOVED = "every difference is exactly 0: the measure does not move at this scale (a floor or a ceiling)"
"""Why a claim whose every unit differs by exactly 0 is untested (``statistics.Judged.nothing_moved``): no run overfit,
every model scored 0, both methods ranked every prompt alike. The exact tests have nothing to count, and
'inconclusive' with a detectable effect of 0 (or an interval from 0 to 0) would say the opposite."""


def intersection(name: str, tests: Mapping[str, statistics.Judged]) -> Verdict:
    """``Verdict`` of claim ``name``, which needs every one of ``tests`` (part -> test): the intersection-union test's
    word (``multiplicity.intersection``), the deciding test's numbers and every part's (``Verdict.parts``)."""
    claim = CLAIMS[name]
    word, deciding = multiplicity.intersection(list(tests.values()), claim.direction)
    which = next(k for k, t in tests.items() if t is deciding)
    parts = tuple((k, claim.written(t.effect), claim.written(t.low), claim.written(t.high), float(t.p))
                  for k, t in tests.items())
    note = f"{which} is untested" if word == statistics.UNTESTED else f"decided by {which}"
    return dataclasses.replace(judge(name, deciding, note=note), word=word, parts=parts)


def measured(name: str, reproduced: bool, effect: float, note: str = "") -> Verdict:
    """``Verdict`` of a claim that is a measurement without seeds (``Claim.measured``): reproduced or contradicted
    by what was measured, without p."""
    claim = CLAIMS[name]
    if not claim.measured:
        raise ValueError(f"{name} is tested over seeds: use claims.judge")
    word = statistics.REPRODUCED if reproduced else statistics.CONTRADICTED
    return Verdict(name, word, effect, math.nan, math.nan, math.nan, math.nan, 1, "measurement", "measured", note)


def untested(name: str, note: str) -> Verdict:
    """``Verdict`` of a claim the preset cannot test (``note`` says why)."""
    return Verdict(name, statistics.UNTESTED, math.nan, math.nan, math.nan, math.nan, math.nan, 0, "seed", "", note)


def publish(verdicts: Mapping[str, Verdict]) -> None:
    """Glue every verdict (``Verdict.glue``) for the book: its job adjusts them together (``report.verdicts``) and
    opens each figure's page with its claims' verdicts, as the verdicts page shows them."""
    for verdict in verdicts.values():
        verdict.glue()
