"""A synthetic language whose next token depends on one earlier token that we know: ground truth for attribution.

Two kinds of sentence, mixed in every document:

* **agreement**: ``<distractor> <verb> the <noun> . <name> <verb> the <noun> with <his|her> ...`` -- the
  possessive pronoun agrees with the gender of the current sentence's subject ``<name>`` (the distractor, in the
  sentence before, has the other gender). Ground truth for predicting the pronoun: the position of ``<name>``.
* **induction**: ``copy w1 w2 ... wk | w1 w2 ... wj`` -- a random word sequence, then its repetition; the next word
  is w_{j+1}. Ground truth: the position of w_{j+1} in the first copy (what an induction head attends to).

Words are whole tokens (a word-level tokenizer saved for Levanter), so a prompt's positions are its words'.
This module is the language (its documents, prompts and tokenizer) and nothing of the analysis:
``attribution.attribution_benchmark`` scores the attribution methods on its prompts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import paths

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
    from levanter.data.text.datasets import DatasetComponent, LmDataConfig, UrlDatasetSourceConfig
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
    source = UrlDatasetSourceConfig(
        train_urls=[str(base / "jsonl" / "train.jsonl")], validation_urls=[str(base / "jsonl" / "validation.jsonl")]
    )
    component = DatasetComponent(source=source, cache_dir=str(base / "levanter"), tags=[])
    return LmDataConfig(tokenizer=str(base / "tokenizer"), components={"synthetic": component})


def encode(prompt: Prompt) -> np.ndarray:
    """Token ids of a prompt: BOS, then one id per word (the word-level vocabulary)."""
    index = {w: i for i, w in enumerate(VOCABULARY)}
    return np.asarray([0] + [index[w] for w in prompt.words], dtype=np.int32)
