"""A synthetic language whose next token depends on one earlier token that we know: ground truth for attribution.

Two kinds of sentence, mixed in every document:

* **agreement**: ``<distractor> <verb> the <noun> . <name> <verb> the <noun> with <his|her> ...`` -- the
  possessive pronoun agrees with the gender of the current sentence's subject ``<name>`` (the distractor, in the
  sentence before, has the other gender). Ground truth for predicting the pronoun: the position of ``<name>``.
* **induction**: ``copy w1 w2 ... wk | w1 w2 ... wj`` -- a random word sequence, then its repetition; the next word
  is w_{j+1}. Ground truth: the position of w_{j+1} in the first copy (what an induction head attends to).

Words are whole tokens (a word-level tokenizer saved for Levanter), so a prompt's positions are its words'.
``attribution_benchmark`` scores how often each attribution method ranks the true token first (hit@1) or in its
top three (hit@3) over held-out prompts. This turns the paper's qualitative Fig. 3 into a measurement.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import paths

MALE = ("arthur", "bernard", "cedric", "duncan", "edmund", "felix", "gregory", "harold", "ivan", "julian")
FEMALE = ("alice", "beatrice", "celia", "diana", "emma", "flora", "grace", "helena", "iris", "juliet")
VERBS = ("takes", "finds", "brings", "keeps", "sells", "paints", "hides", "mends")
NOUNS = ("book", "lamp", "coat", "sword", "letter", "ring", "cup", "map", "key", "boat", "horse", "bell")
COPY_WORDS = tuple(f"c{i}" for i in range(24))
SPECIALS = ("<|endoftext|>",)
PUNCT = (".", "the", "with", "his", "her", "copy", "|")
UNKNOWN = "<unk>"  # never in the corpus; Levanter probes tokenizers with text of its own
VOCABULARY = SPECIALS + PUNCT + MALE + FEMALE + VERBS + NOUNS + COPY_WORDS + (UNKNOWN,)


@dataclass(frozen=True)
class Prompt:
    """A held-out prompt: ``words`` (the model predicts the word after the last), its answer, the ground truth."""

    words: tuple[str, ...]
    answer: str
    true_position: int  # index into words (BOS not counted)
    task: str  # "agreement" or "induction"


def _agreement(rng: random.Random) -> tuple[list[str], int, int]:
    """Words of one agreement item, the index of the pronoun, the index of its antecedent."""
    male = rng.random() < 0.5
    name = rng.choice(MALE if male else FEMALE)
    distractor = rng.choice(FEMALE if male else MALE)
    words = [distractor, rng.choice(VERBS), "the", rng.choice(NOUNS), "."]
    subject = len(words)
    words += [name, rng.choice(VERBS), "the", rng.choice(NOUNS), "with"]
    pronoun = len(words)
    words += ["his" if male else "her", rng.choice(NOUNS), "."]
    return words, pronoun, subject


def _induction(rng: random.Random) -> tuple[list[str], int, int]:
    """Words of one induction item, the index of a word to predict in the copy, the index of its first occurrence."""
    k = rng.randint(4, 7)
    seq = rng.sample(COPY_WORDS, k)
    words = ["copy", *seq, "|", *seq, "."]
    j = rng.randint(1, k - 1)  # predict seq[j] given seq[:j] in the copy
    target = 1 + k + 1 + j
    return words, target, 1 + j


def document(rng: random.Random, items: int = 12) -> str:
    """A training document: ``items`` sentences of both kinds, in random order."""
    words: list[str] = []
    for _ in range(items):
        w, _, _ = (_agreement if rng.random() < 0.5 else _induction)(rng)
        words += w
    return " ".join(words)


def prompts(n: int, seed: int = 10_000, context_items: int = 2) -> list[Prompt]:
    """``n`` held-out prompts (half of each task), each after ``context_items`` full sentences of context."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        context: list[str] = []
        for _ in range(context_items):
            w, _, _ = (_agreement if rng.random() < 0.5 else _induction)(rng)
            context += w
        task = "agreement" if i % 2 == 0 else "induction"
        w, target, truth = (_agreement if task == "agreement" else _induction)(rng)
        words = tuple(context + w[:target])
        out.append(Prompt(words, w[target], len(context) + truth, task))
    return out


def prepare(root: Path = paths.DATA, *, train_documents: int = 4000, validation_documents: int = 200, seed: int = 0):
    """Write the synthetic corpus (JSONL) and its word-level tokenizer below ``root``; return the Levanter config."""
    from levanter.data.text import UrlSingleDatasetLMConfig
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = Path(root) / paths.DATA_CACHE.relative_to(paths.DATA) / "synthetic"
    stamp = base / "stamp.json"
    settings = {"train": train_documents, "validation": validation_documents, "seed": seed, "version": 2}
    if not (stamp.exists() and json.loads(stamp.read_text()) == settings):
        rng = random.Random(seed)
        for split, count in (("train", train_documents), ("validation", validation_documents)):
            path = base / "jsonl" / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps({"text": document(rng)}) for _ in tqdm(range(count), desc=f"synthetic {split}",
                                                                         leave=False)]
            path.write_text("\n".join(lines) + "\n")
        vocab = {w: i for i, w in enumerate(VOCABULARY)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[0], unk_token=UNKNOWN,
            model_input_names=["input_ids", "attention_mask"],
        )
        wrapped.save_pretrained(base / "tokenizer")
        stamp.write_text(json.dumps(settings))
    return UrlSingleDatasetLMConfig(
        train_urls=[str(base / "jsonl" / "train.jsonl")],
        validation_urls=[str(base / "jsonl" / "validation.jsonl")],
        tokenizer=str(base / "tokenizer"),
        cache_dir=str(base / "levanter"),
        tags=["synthetic"],
    )


def encode(prompt: Prompt) -> np.ndarray:
    """Token ids of a prompt: BOS, then one id per word (the word-level vocabulary)."""
    index = {w: i for i, w in enumerate(VOCABULARY)}
    return np.asarray([0] + [index[w] for w in prompt.words], dtype=np.int32)


def attribution_benchmark(model, items: list[Prompt], *, methods=None) -> pd.DataFrame:
    """Per prompt: the model's prediction, and for each attribution method the rank of the true token.

    Scores are computed for the last position (which predicts the answer); the output position itself and the BOS
    token are excluded from the ranking, since the question is which *earlier* token drives the prediction.
    Returns a DataFrame with one row per (prompt, method); ``summarize`` turns it into hit rates.
    """
    import haliax as hax
    import jax.numpy as jnp
    from levanter.layers.attention import AttentionMask

    from .lyapunov import attention_rollout, gradient_x_input, raw_attention_scores, token_lyapunov

    if methods is None:
        lyap_cache: dict = {}

        def lyap(m, ids, out):  # one solve serves both Lyapunov scores of a prompt
            key = (id(ids), out)
            if key not in lyap_cache:
                lyap_cache.clear()
                lyap_cache[key] = token_lyapunov(m, ids, output_position=out)
            return lyap_cache[key]

        methods = {
            "lyapunov (max exponent)": lambda m, ids, out: lyap(m, ids, out).max_exponent.values,
            "lyapunov (sum)": lambda m, ids, out: lyap(m, ids, out).sum_exponents.values,
            "raw attention": raw_attention_scores,
            "attention rollout": attention_rollout,
            "gradient x input": gradient_x_input,
        }
    index = {i: w for i, w in enumerate(VOCABULARY)}
    length = model.config.seq_len
    rows = []
    for p_i, item in enumerate(tqdm(items, desc="attribution benchmark")):
        ids = encode(item)
        if len(ids) > length:
            raise ValueError(f"prompt {p_i} has {len(ids)} tokens, more than model.seq_len = {length}")
        out = len(ids) - 1
        # Every prompt is padded to seq_len after its output position: a causal model's scores for positions up to
        # `out` do not see the padding, and one shape means one compilation for all prompts.
        padded = np.concatenate([ids, np.zeros(length - len(ids), np.int32)])
        named = hax.named(jnp.asarray(padded), "position")
        logits = model(named, AttentionMask.causal()).rearrange(("position", "vocab")).array[out]
        predicted = index.get(int(jnp.argmax(logits[: len(VOCABULARY)])), "?")
        truth = item.true_position + 1  # + BOS
        for name, fn in methods.items():
            scores = np.array(fn(model, named, out), dtype=float)[: out + 1]
            candidates = scores[1:-1]  # drop BOS and the output position
            order = np.argsort(-np.nan_to_num(candidates, nan=-np.inf), kind="stable")
            rank = int(np.where(order == truth - 1)[0][0]) + 1
            rows.append({"prompt": p_i, "task": item.task, "method": name, "rank": rank,
                         "correct_prediction": predicted == item.answer, "length": len(ids)})
    return pd.DataFrame(rows)


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Hit rate @1 and @3 per task and method (and the model's accuracy on each task)."""
    table = results.assign(hit1=results["rank"] <= 1, hit3=results["rank"] <= 3)
    summary = table.groupby(["task", "method"]).agg(hit_at_1=("hit1", "mean"), hit_at_3=("hit3", "mean"),
                                                    prompts=("prompt", "nunique"),
                                                    model_accuracy=("correct_prediction", "mean"))
    return summary.reset_index()
