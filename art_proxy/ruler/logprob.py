"""Logprob scoring: a trajectory's score is the expected digit under the judge's distribution.

A small judge asked for one digit 0-9 per trajectory answers noisily, but the probabilities it puts
on the ten digits carry more than the one it samples: `E[d] / 9` over the digit tokens among the
`top_logprobs` at the digit's position is a smooth score in [0, 1] that separates trajectories the
sampled digits would tie. Digits written with a leading space (" 7") count as the digit.

The scorer reads each digit at a position it fixes: the judge's answer is begun for it, up to
`t2:` (the earlier lines filled in with their likeliest digits), and the judge is asked to go on
(vLLM's `continue_final_message`); the distribution is read at the first token it writes, so a
judge that would have written prose still gives every trajectory a score (`digit_after_label`).
A judge that cannot be prefilled (a hosted API) writes the whole answer, which must read `t1: 7`
per line (`parse_logprob_answer`); anything else is an `InvalidAnswer`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from art_proxy.ruler.errors import InvalidAnswer
from art_proxy.ruler.parse import ParsedScore

# vLLM's and local-llm's limit; enough to hold all ten digits when the judge is unsure.
TOP_LOGPROBS = 20
# ASCII only: str.isdigit() also accepts "²" and other digits a judge may put among its runners-up.
_DIGITS = frozenset("0123456789")


@dataclass(frozen=True)
class TokenChoice:
    """One generated token: its text, its logprob, and the runners-up at its position."""

    token: str
    logprob: float
    top: Sequence[tuple[str, float]]  # (token, logprob), best first


def digit_distribution(top: Sequence[tuple[str, float]]) -> dict[int, float]:
    """Probabilities of the digits 0-9 among `top`, renormalised to sum to 1 (empty: none)."""
    mass: dict[int, float] = {}
    for token, logprob in top:
        text = token.strip()
        if text in _DIGITS and math.isfinite(logprob):
            mass[int(text)] = mass.get(int(text), 0.0) + math.exp(logprob)
    total = sum(mass.values())
    return {digit: p / total for digit, p in sorted(mass.items())} if total > 0 else {}


def expected_score(distribution: dict[int, float]) -> float:
    """E[digit] / 9: 0 when all mass is on 0, 1 when all is on 9."""
    return sum(digit * p for digit, p in distribution.items()) / 9.0


def digit_after_label(tokens: Sequence[TokenChoice]) -> dict[int, float]:
    """The digit distribution at the first token a prefilled judge wrote that is not whitespace
    (empty when no digit is among its likeliest tokens there)."""
    for choice in tokens:
        if choice.token.strip():
            return digit_distribution(choice.top) or digit_distribution([(choice.token, 0.0)])
        if any(token.strip() in _DIGITS for token, _ in choice.top):
            # The judge wrote a space, but a digit (" 7") was among its choices right here.
            return digit_distribution(choice.top)
    return {}


def score_of(distribution: dict[int, float]) -> ParsedScore:
    return ParsedScore(expected_score(distribution), _explain(distribution))


def parse_logprob_answer(
    tokens: Sequence[TokenChoice], labels: Sequence[str]
) -> dict[str, ParsedScore]:
    """One expected-digit score per label, read at the digit that follows each label."""
    text = "".join(choice.token for choice in tokens)
    starts = []
    offset = 0
    for choice in tokens:
        starts.append(offset)
        offset += len(choice.token)
    scores: dict[str, ParsedScore] = {}
    missing = []
    for label in labels:
        match = re.search(rf"(?<![A-Za-z0-9]){re.escape(label)}(?![0-9])\W*?([0-9])", text)
        if match is None:
            missing.append(label)
            continue
        index = _token_at(starts, match.start(1))
        choice = tokens[index]
        if choice.token.strip() != match.group(1):
            missing.append(f"{label} (its digit is part of the token {choice.token!r})")
            continue
        # The sampled digit alone when no runner-up is a digit (top_logprobs not returned).
        distribution = digit_distribution(choice.top) or digit_distribution([(choice.token, 0.0)])
        scores[label] = score_of(distribution)
    if missing:
        raise InvalidAnswer(f"no digit score for {', '.join(missing)}; answer `t1: <digit>` lines")
    return scores


def _token_at(starts: Sequence[int], char_offset: int) -> int:
    index = 0
    for position, start in enumerate(starts):
        if start > char_offset:
            break
        index = position
    return index


def _explain(distribution: dict[int, float]) -> str:
    likely = sorted(distribution.items(), key=lambda item: -item[1])[:3]
    shown = ", ".join(f"{digit}: {p:.2f}" for digit, p in likely)
    return f"expected digit {expected_score(distribution) * 9:.2f} (most likely {shown})"
