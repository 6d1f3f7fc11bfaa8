"""Guided decoding replayed: the trainer scores a constrained call's tokens under the distribution
restricted to what the call's grammar allowed, and never trains a call it cannot replay."""

from __future__ import annotations

import json

import pytest
import torch

from art_proxy.guided_decoding import Grammar
from art_proxy.local.model_loading import load_model
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.bitmask import allowed_mask, packed
from art_proxy_trainer.grammar import GrammarReplay
from art_proxy_trainer.scoring import token_logprobs
from tests.trainer.records import call

JSON_OBJECT = {"response_format": {"type": "json_object"}}


@pytest.fixture(scope="module")
def replay() -> GrammarReplay:
    loaded = load_model(None)  # the bundled SmolLM2's tokenizer
    return GrammarReplay(loaded.tokenizer, loaded.model.config.vocab_size)


def _ids(replay: GrammarReplay, text: str) -> list[int]:
    tokenizer = replay.tokenizer
    ids: list[int] = tokenizer.encode(text)
    return [*ids, tokenizer.eos_token_id]


def test_the_replay_allows_at_each_token_what_the_grammar_does(replay: GrammarReplay) -> None:
    ids = _ids(replay, '{"city": "Paris"}')
    bits = replay.allowed(Grammar("json_schema", json.dumps({"type": "object"})), ids)
    assert bits is not None
    allowed = allowed_mask(bits, replay.vocab_size)
    assert allowed.shape == (len(ids), replay.vocab_size)
    assert all(allowed[position, token] for position, token in enumerate(ids))
    # An object opens with "{" and nothing else; it ends with EOS alone.
    opening = [replay.tokenizer.decode([i]) for i in allowed[0].nonzero()[:, 0].tolist()]
    assert opening and all(text.lstrip().startswith("{") for text in opening)
    assert allowed[-1].nonzero()[:, 0].tolist() == [ids[-1]]


def test_a_call_whose_tokens_its_grammar_refuses_is_not_trained(replay: GrammarReplay) -> None:
    """The breach: a replay that does not match what vLLM ran would score every token of the call
    under a distribution it was not drawn from."""
    plain = call(0, [1, 2], [3, 4], [-0.5, -0.5], trajectory_id="plain")
    refused = call(0, [1, 2], _ids(replay, "hello"), [-0.5] * 2, trajectory_id="refused")
    refused = refused.model_copy(update={"request": JSON_OBJECT})
    samples = [TrajectorySample(c.trajectory_id, [c], 1.0) for c in (plain, refused)]
    batch = build_batch(samples, grammars=replay)
    assert batch.stats.skipped_calls == 1 and batch.trajectory_ids == ("plain",)


def test_a_constrained_call_is_not_trained_without_a_replay(replay: GrammarReplay) -> None:
    ids = _ids(replay, "{}")
    constrained = call(0, [1, 2], ids, [-0.1] * len(ids)).model_copy(
        update={"request": JSON_OBJECT}
    )
    plain = call(0, [1, 2], [3, 4], [-0.5, -0.5], trajectory_id="plain")
    samples = [TrajectorySample(c.trajectory_id, [c], 1.0) for c in (constrained, plain)]
    assert build_batch(samples).stats.skipped_calls == 1
    with_replay = build_batch(samples, grammars=replay)
    assert with_replay.stats.skipped_calls == 0
    assert with_replay.transforms.allowed_K_W is not None


def test_scored_under_the_grammar_each_token_takes_the_mass_the_grammar_left_out(
    replay: GrammarReplay,
) -> None:
    ids = _ids(replay, "{}")
    constrained = call(0, [1, 2], ids, [-0.1] * len(ids)).model_copy(
        update={"request": JSON_OBJECT}
    )
    batch = build_batch([TrajectorySample("t1", [constrained], 1.0)], grammars=replay)
    torch.manual_seed(0)
    logits = torch.randn(1, batch.tokens_B_T.shape[1], replay.vocab_size)
    masked = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
    free = token_logprobs(logits, batch.tokens_B_T)
    sampled = batch.mask_B_T.bool()
    # Fewer ids share the mass: every sampled token is likelier under the grammar.
    assert bool((masked[sampled] > free[sampled]).all())
    assert masked[0, -1].item() == pytest.approx(0.0, abs=1e-6)  # EOS was the only id allowed


def test_a_grammar_xgrammar_cannot_compile_is_replayed_with_llguidance(
    replay: GrammarReplay,
) -> None:
    """vLLM hands such a regex to llguidance (an engine whose first grammar it was runs
    llguidance): the trainer's masks are llguidance's own, as vLLM's llguidance backend fills
    them."""
    import llguidance
    import llguidance.hf
    import llguidance.torch

    ids = _ids(replay, "Paris")
    bits = replay.allowed(Grammar("regex", r"\p{Lu}[a-z]+"), ids)
    assert bits is not None
    tokenizer = llguidance.hf.from_tokenizer(replay.tokenizer, replay.vocab_size)
    matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("regex", r"\p{Lu}[a-z]+"))
    expected = llguidance.torch.allocate_token_bitmask(len(ids), replay.vocab_size)
    for position, token in enumerate(ids):
        llguidance.torch.fill_next_token_bitmask(matcher, expected, position)
        assert matcher.consume_token(token)
    assert torch.equal(bits, expected)
    # The breach: a token the regex refuses (a lower-case start) is not scored.
    assert replay.allowed(Grammar("regex", r"\p{Lu}[a-z]+"), _ids(replay, "paris")) is None


def test_a_grammar_neither_engine_reads_is_not_replayed(replay: GrammarReplay) -> None:
    """Lookbehind: vLLM then runs outlines, whose masks the trainer does not have."""
    assert replay.allowed(Grammar("regex", "(?<=a)b"), _ids(replay, "b")) is None


@pytest.mark.parametrize("token_id", [0, 31, 32, 63, 100])
def test_a_packed_id_unpacks_to_itself_whichever_bit_it_takes(token_id: int) -> None:
    """Bit 31 of a word is the int32's sign: setting or clearing it must not wrap."""
    only = packed(torch.tensor([token_id]), 101)
    assert allowed_mask(only[None], 101)[0].nonzero()[:, 0].tolist() == [token_id]
    every_but = packed(torch.arange(101), 101) & ~only
    assert allowed_mask(every_but[None], 101)[0].sum().item() == 100


@pytest.fixture(scope="module")
def reasoning_replay() -> GrammarReplay:
    """A tokenizer with a reasoning model's `<think>` and `</think>` as tokens of their own."""
    tokenizer = load_model(None).tokenizer
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return GrammarReplay(tokenizer, len(tokenizer))


def test_a_reasoning_models_reply_is_constrained_only_after_its_reasoning_ends(
    reasoning_replay: GrammarReplay,
) -> None:
    """vLLM with a reasoning parser masks the answer, not the reasoning before it: the replay
    once refused `<think>` under the JSON grammar and left the call out."""
    tokenizer = reasoning_replay.tokenizer
    think, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    reasoning = tokenizer.encode("a city of France", add_special_tokens=False)
    answer = _ids(reasoning_replay, '{"city": "Paris"}')
    ids = [think, *reasoning, end, *answer]
    reply = {"role": "assistant", "content": '{"city": "Paris"}', "reasoning": "a city of France"}
    constrained = call(0, [1, 2], ids, [-0.1] * len(ids)).model_copy(
        update={
            "request": JSON_OBJECT,
            "response": {"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]},
        }
    )
    batch = build_batch([TrajectorySample("t1", [constrained], 1.0)], grammars=reasoning_replay)
    assert batch.stats.skipped_calls == 0
    assert batch.transforms.allowed_K_W is not None
    allowed = allowed_mask(batch.transforms.allowed_K_W, reasoning_replay.vocab_size)
    answer_at = len(reasoning) + 2
    assert bool(allowed[:answer_at].all())  # the reasoning and its end: every id
    opening = allowed[answer_at].nonzero()[:, 0].tolist()
    assert answer[0] in opening and think not in opening  # the answer: the grammar's
    # Without the parser's split (no reasoning on the reply), vLLM masked from the first token.
    plain = constrained.model_copy(
        update={"response": {"choices": [{"index": 0, "message": {**reply, "reasoning": None}}]}}
    )
    other = call(0, [1, 2], [3, 4], [-0.5, -0.5], trajectory_id="other")
    samples = [TrajectorySample("t2", [plain], 1.0), TrajectorySample("other", [other], 1.0)]
    unsplit = build_batch(samples, grammars=reasoning_replay)
    assert unsplit.stats.skipped_calls == 1 and unsplit.trajectory_ids == ("other",)
