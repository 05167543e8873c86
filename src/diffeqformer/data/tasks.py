"""Downstream tasks built from the Shakespeare corpus's held-out (validation) documents, as lm-evaluation-harness
task files (F11): two public benchmarks that can be rebuilt offline from any held-out text.

* ``shakespeare_lastword``, as LAMBADA (Paperno et al. 2016): predict a passage's last word, one that an earlier line
  of the passage holds and its own line does not before it, of ``MIN_WORD_LETTERS`` letters or more and none of the
  ``COMMON_WORDS`` commonest. Scored as LAMBADA: accuracy (greedy) and the target word's perplexity.
* ``shakespeare_nextline``, as HellaSwag (Zellers et al. 2019): the line that follows a passage against
  ``NUM_CHOICES - 1`` lines that follow other passages, of a length within ``DISTRACTOR_LENGTH`` of it. Scored by
  the log-likelihood per byte (``acc_norm``, as the harness normalises HellaSwag) and the plain log-likelihood.

A passage is a run of a document's lines, from one that is not blank, as many as fit in ``max_tokens`` tokens with
its answer; a task's examples do not overlap. Candidates shuffled with ``seed`` give the ``num_examples`` test
examples, then the ``num_fewshot`` few-shot pool; ``max_tokens = example_budget(max_seq_len, k)`` keeps a k-shot
prompt within the model's context. Below the corpus cache, ``tasks/<key>/`` holds ``<task>.yaml`` (what lm-eval reads
with ``--include_path``), ``<task>.{test,fewshot}.jsonl`` and ``manifest.json`` (parameters, documents, counts, every
file's SHA-256); ``<key>`` hashes the parameters, the held-out texts and the tokenizer.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tokenizers import Tokenizer

from .. import paths
from ..cache import digest, file_sha256, write_atomically
from ..numerics import check_positive_int
from . import corpora

LASTWORD, NEXTLINE = "shakespeare_lastword", "shakespeare_nextline"
TASKS = (LASTWORD, NEXTLINE)
"""The held-out tasks, by their lm-evaluation-harness names."""
SPLITS = ("test", "fewshot")
"""The examples evaluated, and the pool the harness draws few-shot examples from."""
FEWSHOT_DELIMITER = "\n\n"
"""Between the examples of a few-shot prompt (the harness's default)."""

MIN_WORD_LETTERS, COMMON_WORDS = 3, 100
MIN_CONTEXT_TOKENS = 8
"""A passage has at least this many tokens before its answer."""
NUM_CHOICES, MIN_LINE_WORDS, DISTRACTOR_LENGTH = 4, 4, 0.3
"""Choices per next-line example (as HellaSwag's), the words a next line has at least, and how far (a fraction) a
distractor's length in characters may lie from the true line's."""
_RULES_VERSION = 1  # bump when a rule changes what is built, so that cached task files are rebuilt

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
# What is not a line of speech: a speaker's name ("CHARLES."), a stage direction ("[Exit DENNIS.]"), a heading.
_NOT_SPEECH = re.compile(r"^\s*(\[.*|[A-Z0-9 ,.'&-]+\.?\s*)$")


@dataclass(frozen=True)
class Example:
    """One example of a task: the passage of lines ``first_line`` .. ``last_line`` (the answer's) of ``document``,
    ``context`` followed by ``answer`` (the last word with its space, or the next line); multiple choice: ``choices``
    and ``label``."""

    document: str
    first_line: int
    last_line: int
    context: str
    answer: str
    choices: tuple[str, ...] = ()
    label: int = -1

    def record(self) -> dict:
        """The example as a line of the task's JSONL file."""
        out = {"document": self.document, "lines": [self.first_line, self.last_line], "context": self.context}
        if self.choices:
            return {**out, "choices": list(self.choices), "label": self.label}
        return {**out, "target": self.answer}


@dataclass(frozen=True)
class TaskFiles:
    """What ``build_tasks`` wrote: the folder to hand lm-eval (``include_path``) and its manifest."""

    directory: Path
    manifest: dict

    @classmethod
    def read(cls, directory: Path) -> "TaskFiles":
        """The task files in ``directory``, by its manifest."""
        return cls(directory, json.loads((directory / "manifest.json").read_text()))

    @property
    def hashes(self) -> dict[str, str]:
        """SHA-256 of every task file by name: what a figure's provenance records."""
        return dict(self.manifest["files"])


def example_budget(max_seq_len: int, shots: int) -> int:
    """Tokens one example may have so that a ``shots``-shot prompt (the examples and the query, a blank line of about
    one token between them, one token of slack for merges at the joins) fits in ``max_seq_len``."""
    budget = (max_seq_len - 2 * shots - 1) // (shots + 1)
    if budget < MIN_CONTEXT_TOKENS + 2:
        raise ValueError(f"a {shots}-shot prompt leaves {budget} tokens per example in {max_seq_len}: too few for a "
                         f"passage of {MIN_CONTEXT_TOKENS} tokens and its answer")
    return budget


# ---------------------------------------------------------------------------------------------------- building


class _Document:
    """A document's lines with their offsets and token counts."""

    def __init__(self, name: str, text: str, encode: Callable[[list[str]], list[list[int]]]):
        self.name, self.text = name, text
        self.lines = text.split("\n")
        self.starts = np.cumsum([0] + [len(line) + 1 for line in self.lines[:-1]])
        # tokens of each line with its newline: their sum estimates a passage's length (then counted exactly)
        self.tokens = np.array([len(ids) for ids in encode([line + "\n" for line in self.lines])])

    def span(self, first: int, end: int) -> str:
        """The text of lines ``first`` .. ``end - 1`` with the newline after each; empty where ``first >= end``."""
        if first >= end:
            return ""
        return self.text[self.starts[first]:self.starts[end]] if end < len(self.lines) else self.text[
            self.starts[first]:] + "\n"

    def first_line(self, last: int, budget: int) -> int:
        """The earliest line from which lines ``first`` .. ``last`` hold at most ``budget`` tokens (estimated)."""
        total, first = 0, last + 1
        while first > 0 and total + self.tokens[first - 1] <= budget:
            first -= 1
            total += self.tokens[first]
        return first


def _fit(encode, doc: _Document, first: int, last: int, context_of: Callable[[int], str], answer: str, budget: int):
    """(first line, context) of the passage from the earliest line at or after ``first``, not blank, whose context
    and answer hold at most ``budget`` tokens and at least ``MIN_CONTEXT_TOKENS`` before the answer; else None."""
    while first < last:
        if doc.lines[first].strip():
            context = context_of(first)
            context_tokens, total = (len(ids) for ids in encode([context, context + answer]))
            if total <= budget:
                return (first, context) if context_tokens >= MIN_CONTEXT_TOKENS else None
        first += 1
    return None


def lastword_candidates(doc: _Document, encode, budget: int, common: frozenset[str]) -> list[Example]:
    """Every passage of ``doc`` within ``budget`` that ends in a word its earlier lines hold (module docstring)."""

    def words(text: str) -> set[str]:
        return {w.lower() for w in _WORD.findall(text)}

    out = []
    for last, line in enumerate(doc.lines):
        for match in _WORD.finditer(line):
            word, at = match.group(), match.start()
            if (at == 0 or line[at - 1] != " " or "'" in word or len(word) < MIN_WORD_LETTERS
                    or word.lower() in common):
                continue
            head = line[:at - 1]  # the line before the target word and its space
            earliest = doc.first_line(last, budget)  # a passage that fits starts here or later
            if word.lower() in words(head) or word.lower() not in words(doc.span(earliest, last)):
                continue
            found = _fit(encode, doc, earliest, last, lambda first: doc.span(first, last) + head, " " + word, budget)
            if found is not None and word.lower() in words(doc.span(found[0], last)):
                out.append(Example(doc.name, found[0], last, found[1], " " + word))
    return out


def is_next_line(line: str) -> bool:
    """Whether a line can be a next line: speech of ``MIN_LINE_WORDS`` words or more, not a speaker's name, a stage
    direction or a heading."""
    return len(_WORD.findall(line)) >= MIN_LINE_WORDS and not _NOT_SPEECH.match(line)


def nextline_candidates(doc: _Document, encode, budget: int) -> list[Example]:
    """Every passage of ``doc`` within ``budget`` that holds speech and is followed by a line that ``is_next_line``
    (its choices are added later)."""
    out = []
    for last, line in enumerate(doc.lines):
        if last == 0 or not is_next_line(line):
            continue
        answer = line.strip()
        found = _fit(encode, doc, doc.first_line(last, budget), last, lambda first: doc.span(first, last), answer,
                     budget)
        if found is not None and any(is_next_line(line) for line in doc.lines[found[0]:last]):
            out.append(Example(doc.name, found[0], last, found[1], answer))
    return out


def select(candidates: Sequence[Example], n: int, rng: np.random.Generator) -> list[Example]:
    """Up to ``n`` candidates in a random order (``rng``), skipping any that shares a line with one taken."""
    taken: list[Example] = []
    used: dict[str, set[int]] = {}
    for i in rng.permutation(len(candidates)):
        c = candidates[i]
        lines = set(range(c.first_line, c.last_line + 1))
        if lines & used.setdefault(c.document, set()):
            continue
        used[c.document] |= lines
        taken.append(c)
        if len(taken) == n:
            break
    return taken


def add_choices(example: Example, pool: Sequence[Example], rng: np.random.Generator) -> Example:
    """``example`` with ``NUM_CHOICES - 1`` distractors: next lines of ``pool``'s other passages, none alike, of a
    length within ``DISTRACTOR_LENGTH`` of the answer's."""
    length = len(example.answer)
    seen = {example.answer.lower()}
    distractors = []
    for i in rng.permutation(len(pool)):
        other = pool[i]
        line = other.answer
        if (other.document == example.document and example.first_line <= other.last_line <= example.last_line
                or line.lower() in seen or abs(len(line) - length) > DISTRACTOR_LENGTH * length):
            continue
        seen.add(line.lower())
        distractors.append(line)
        if len(distractors) == NUM_CHOICES - 1:
            break
    if len(distractors) < NUM_CHOICES - 1:
        raise ValueError(f"only {len(distractors)} distractors of the answer's length for {example.answer!r}")
    label = int(rng.integers(NUM_CHOICES))
    choices = distractors[:label] + [example.answer] + distractors[label:]
    return dataclasses.replace(example, choices=tuple(choices), label=label)


def build_examples(documents: Sequence[tuple[str, str]], encode: Callable[[list[str]], list[list[int]]], *,
                   num_examples: int, num_fewshot: int, max_tokens: int,
                   seed: int = 0) -> tuple[dict[str, dict[str, list[Example]]], dict[str, int]]:
    """The examples of every task by task and split, from ``documents`` (name, text) measured with ``encode`` (texts
    -> their token ids), and the candidates each task found; ``ValueError`` where the documents give too few."""
    check_positive_int(num_examples, "num_examples")
    if not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise ValueError(f"num_fewshot must be a non-negative integer, got {num_fewshot!r}")
    check_positive_int(max_tokens, "max_tokens")
    docs = [_Document(name, text, encode) for name, text in documents]
    counts = Counter(w.lower() for d in docs for w in _WORD.findall(d.text))  # the commonest, ties alphabetically:
    common = frozenset(w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:COMMON_WORDS])
    found = {LASTWORD: [c for d in docs for c in lastword_candidates(d, encode, max_tokens, common)],
             NEXTLINE: [c for d in docs for c in nextline_candidates(d, encode, max_tokens)]}
    need = num_examples + num_fewshot
    out, offered = {}, {}
    for i, task in enumerate(TASKS):
        rng = np.random.default_rng([seed, i])
        taken = select(found[task], need, rng)
        offered[task] = len(found[task])
        if len(taken) < need:
            raise ValueError(
                f"the held-out documents ({', '.join(d.name for d in docs)}) give {len(taken)} non-overlapping "
                f"{task} examples of at most {max_tokens} tokens ({len(found[task])} candidates), fewer than the "
                f"{need} asked for ({num_examples} test + {num_fewshot} few-shot): ask for fewer examples, or "
                f"allow longer ones")
        if task == NEXTLINE:
            taken = [add_choices(e, found[task], rng) for e in taken]
        split = {"test": taken[:num_examples], "fewshot": taken[num_examples:]}
        out[task] = {s: sorted(split[s], key=lambda e: (e.document, e.first_line)) for s in SPLITS}
    return out, offered


def task_definition(task: str, data_files: dict[str, str]) -> dict:
    """The lm-evaluation-harness task config (its YAML) of ``task``, reading its examples from ``data_files``."""
    if task not in TASKS:
        raise ValueError(f"unknown held-out task {task!r}; the held-out tasks are {', '.join(TASKS)}")
    # fields by name, not as Jinja templates ("{{context}}"), which lm-eval compiles again for every example
    common = {"task": task, "dataset_path": "json", "dataset_kwargs": {"data_files": data_files},
              "test_split": "test", "fewshot_split": "fewshot", "doc_to_text": "context",
              "target_delimiter": "", "fewshot_delimiter": FEWSHOT_DELIMITER, "metadata": {"version": _RULES_VERSION}}
    if task == LASTWORD:  # as lm-eval's lambada_openai
        return {**common, "output_type": "loglikelihood", "doc_to_target": "target", "metric_list": [
            {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    return {**common, "output_type": "multiple_choice", "doc_to_target": "label", "doc_to_choice": "choices",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},  # as hellaswag
                            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]}


def write_tasks(examples: dict[str, dict[str, list[Example]]], directory: Path, manifest: dict) -> TaskFiles:
    """Write every task's YAML and JSONL files and the manifest (``manifest`` plus the files' SHA-256) into
    ``directory`` (atomically: the manifest last)."""
    directory = Path(directory)

    def write(manifest_path: Path):
        folder = manifest_path.parent
        for task, splits in examples.items():
            for split, items in splits.items():
                (folder / f"{task}.{split}.jsonl").write_text("".join(json.dumps(e.record()) + "\n" for e in items))
            definition = task_definition(task, {split: str(directory / f"{task}.{split}.jsonl") for split in splits})
            (folder / f"{task}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
        files = {f.name: file_sha256(f) for f in sorted(folder.iterdir()) if f != manifest_path}
        manifest_path.write_text(json.dumps({**manifest, "files": files}, indent=1) + "\n")

    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "manifest.json", write)
    return TaskFiles.read(directory)


def build_tasks(root: Path = paths.DATA, *, num_examples: int, max_tokens: int, num_fewshot: int = 50,
                seed: int = 0, domain: str = "all", tokenizer: str | Path | None = None,
                vocab_size: int = corpora.DEFAULT_VOCAB_SIZE) -> TaskFiles:
    """The task files of ``TASKS`` built from the validation documents of the Shakespeare corpus below ``root``
    (prepared first if needed), with ``num_examples`` test and ``num_fewshot`` few-shot examples per task of at most
    ``max_tokens`` tokens of ``tokenizer`` (a directory or hub name; default: the corpus's BPE of ``vocab_size``).
    Built once, in a folder named by a hash of all that."""
    info = corpora.prepare_corpus(root, vocab_size=vocab_size if tokenizer is None else None)
    documents = [(d.name, d.text) for d in info.select(domain, "validation")]
    tokenizer = info.tokenizer_dir if tokenizer is None else tokenizer
    tokenizer_file = Path(tokenizer) / "tokenizer.json"
    key = {"rules_version": _RULES_VERSION, "num_examples": num_examples, "num_fewshot": num_fewshot,
           "max_tokens": max_tokens, "seed": seed, "domain": domain,
           "documents": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in documents},
           "tokenizer": file_sha256(tokenizer_file) if tokenizer_file.exists() else str(tokenizer)}
    directory = info.layout.cache / "tasks" / digest(key)
    if (directory / "manifest.json").exists():
        return TaskFiles.read(directory)
    if tokenizer_file.exists():  # the Rust tokenizer: faster on short texts than Levanter's wrapper
        fast = Tokenizer.from_file(str(tokenizer_file))

        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
    else:
        encode = corpora.load_tokenizer(tokenizer).encode_batch

    examples, offered = build_examples(documents, encode, num_examples=num_examples, num_fewshot=num_fewshot,
                                       max_tokens=max_tokens, seed=seed)
    counts = {t: {**{s: len(examples[t][s]) for s in SPLITS}, "candidates": offered[t]} for t in TASKS}
    manifest = {**key, "tokenizer_path": paths.home_relative(tokenizer) if tokenizer_file.exists() else str(tokenizer),
                "counts": counts, "rules": {
                    "min_word_letters": MIN_WORD_LETTERS, "common_words": COMMON_WORDS,
                    "min_context_tokens": MIN_CONTEXT_TOKENS, "num_choices": NUM_CHOICES,
                    "min_line_words": MIN_LINE_WORDS, "distractor_length": DISTRACTOR_LENGTH}}
    return write_tasks(examples, directory, manifest)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m diffeqformer.data tasks``: build the task files and print where they are, with their counts."""
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.data tasks",
                                     description="Build F11's tasks from the corpus's held-out documents.")
    parser.add_argument("--examples", type=int, default=200, help="test examples per task")
    parser.add_argument("--fewshot", type=int, default=50, help="few-shot examples per task (drawn apart)")
    parser.add_argument("--max-tokens", type=int, default=example_budget(64, 1),
                        help="tokens of one example, context and answer (default: a 1-shot prompt in 64 tokens)")
    parser.add_argument("--vocab-size", type=int, default=corpora.DEFAULT_VOCAB_SIZE, help="the corpus's BPE")
    args = parser.parse_args(argv)
    try:
        files = build_tasks(num_examples=args.examples, num_fewshot=args.fewshot, max_tokens=args.max_tokens,
                            vocab_size=args.vocab_size)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"tasks in {files.directory}")
    for task, n in files.manifest["counts"].items():
        print(f"{task}: {n['test']} test, {n['fewshot']} few-shot examples (of {n['candidates']} candidates)")
    for name, sha in files.hashes.items():
        print(f"{sha}  {name}")
