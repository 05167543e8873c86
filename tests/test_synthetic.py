"""The synthetic language: its ground truth is right, its tokenizer is Levanter's, the benchmark runs."""

import random

import haliax as hax
import jax
import numpy as np
import pytest

from diffeqformer import DiffEqFormerConfig
from diffeqformer.synthetic import (
    FEMALE,
    MALE,
    VOCABULARY,
    attribution_benchmark,
    document,
    encode,
    prepare,
    prompts,
    summarize,
)


def test_ground_truth_of_prompts():
    items = prompts(200, seed=1)
    assert {p.task for p in items} == {"agreement", "induction"}
    for p in items:
        truth = p.words[p.true_position]
        if p.task == "agreement":
            assert p.words[-1] == "with"
            assert (truth in MALE and p.answer == "his") or (truth in FEMALE and p.answer == "her")
            # the distractor in the sentence before has the other gender
            distractor = p.words[p.true_position - 5]
            assert (distractor in MALE) != (truth in MALE)
        else:
            assert truth == p.answer  # first occurrence of the word to copy
            bar = len(p.words) - 1 - p.words[::-1].index("|")
            assert p.true_position < bar


def test_documents_are_deterministic_and_in_vocabulary():
    a, b = document(random.Random(3)), document(random.Random(3))
    assert a == b
    assert set(a.split()) <= set(VOCABULARY)


def test_tokenizer_matches_encode(tmp_path):
    from levanter.compat.hf_checkpoints import load_tokenizer

    config = prepare(tmp_path, train_documents=5, validation_documents=2)
    tok = load_tokenizer(config.tokenizer)
    p = prompts(1, seed=2)[0]
    ids = tok(" ".join(p.words))["input_ids"]
    assert list(encode(p)[1:]) == [i for i in ids if i != tok.bos_token_id][: len(p.words)]
    assert len(tok) == len(VOCABULARY)


def test_benchmark_runs_on_a_random_model():
    config = DiffEqFormerConfig(seq_len=64, hidden_dim=16, num_layers=2, num_heads=2, mlp_scale=2,
                                time_embed_dim=4, sinusoidal_dim=4)
    model = config.build(hax.Axis("vocab", len(VOCABULARY)), key=jax.random.PRNGKey(0))
    items = prompts(4, seed=5, context_items=1)
    results = attribution_benchmark(model, items)
    assert len(results) == 4 * 5
    lengths = results["length"].to_numpy()
    assert np.all(results["rank"] >= 1) and np.all(results["rank"] <= lengths - 2)
    table = summarize(results)
    assert set(table.columns) >= {"task", "method", "hit_at_1", "hit_at_3", "model_accuracy"}
    assert np.all((table.hit_at_1 <= table.hit_at_3) & (table.hit_at_3 <= 1))
