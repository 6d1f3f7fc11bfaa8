"""Fitting a group's prompts to the judge: `--judge-max-prompt-tokens`, and the judges' context
where their servers say it (`/v1/models` `max_model_len`), with room left for the answer twice
and a note, since a re-ask sends the prompt, the invalid answer and what was wrong."""

from __future__ import annotations

from collections.abc import Sequence

from art_proxy.ruler.client import JudgeClient
from art_proxy.ruler.errors import PromptTooLong
from art_proxy.ruler.orders import permutations
from art_proxy.ruler.prompt import JudgePrompt, Member, TokenCounter, build_prompt
from art_proxy.ruler.settings import RulerSettings

# Room for a json answer in the judge's context: a score and a sentence or two a trajectory.
ANSWER_TOKENS_PER_LABEL = 120
# A checklist's answer: a mark and a sentence for each criterion of each trajectory.
CRITERION_TOKENS = 60
# Logprob mode reads a digit a trajectory ("t12: 7\n", about 5 tokens).
DIGIT_TOKENS_PER_LABEL = 8
# What a re-ask adds besides the invalid answer: the message saying what was wrong.
REASK_TOKENS = 64
# Rebuilds of a prompt the judge's own tokenizer found longer than the estimate allowed.
FITS = 3


class PromptFitter:
    """A group's prompt in each order it is judged, and the cap on the judge's answer."""

    def __init__(
        self, judges: Sequence[JudgeClient], settings: RulerSettings, count_tokens: TokenCounter
    ) -> None:
        self._judges = judges
        self._settings = settings
        self._count_tokens = count_tokens

    async def prompts(self, members: Sequence[Member]) -> list[JudgePrompt]:
        """The group's prompt in each order, fitted to `--judge-max-prompt-tokens` and to the
        judges' context where their servers say it: room is left for the answer twice and a
        note, since a re-ask sends the prompt, the invalid answer and what was wrong. The prompt
        is counted by the estimate, then by the judge's own tokenizer where its server counts,
        and built again smaller while the judge's count is over. Raises PromptTooLong."""
        room = self._context_room(len(members))
        budget = self._settings.max_prompt_tokens
        if room is not None:
            budget = min(budget, room) if budget else room
        for _ in range(FITS):
            prompts = [
                build_prompt(
                    [members[index] for index in order],
                    self._settings.rubric,
                    self._settings.mode,
                    max_tokens=budget,
                    count_tokens=self._count_tokens,
                )
                for order in permutations(len(members), self._settings.orders)
            ]
            if room is None:
                return prompts
            counted = [await self._judge_count(prompt) for prompt in prompts]
            longest = max((c for c in counted if c is not None), default=None)
            if longest is None or longest <= room:
                return prompts
            # The estimate undercounted this judge's tokens: shrink by what it missed.
            budget = max(1, int(budget * room / longest * 0.95))
        raise PromptTooLong(
            f"the group does not fit the judge's context of {self._context()} tokens with room "
            "for its answer, even with long texts trimmed: judge smaller groups, or a judge with "
            "a longer context"
        )

    def _context(self) -> int | None:
        contexts = [judge.context_tokens for judge in self._judges if judge.context_tokens]
        return min(contexts) if contexts else None

    def _context_room(self, labels: int) -> int | None:
        """Prompt tokens the judges' smallest known context leaves (None: none is known)."""
        context = self._context()
        if context is None:
            return None
        return max(1, context - 2 * self._answer_room(labels) - REASK_TOKENS)

    def _answer_room(self, labels: int) -> int:
        """Tokens an answer over `labels` trajectories may take (a checklist's: a mark and a
        sentence for each criterion of each), and a reasoning judge's thinking before it."""
        rubric = self._settings.rubric
        if self._settings.mode == "logprob":  # read off a begun answer: no room to think
            return DIGIT_TOKENS_PER_LABEL * labels + 16
        if isinstance(rubric, str):
            per_label = ANSWER_TOKENS_PER_LABEL
        else:
            per_label = CRITERION_TOKENS * len(rubric.criteria)
        return per_label * labels + 16 + self._settings.thinking_tokens

    async def _judge_count(self, prompt: JudgePrompt) -> int | None:
        counts = [await judge.prompt_tokens(prompt.messages) for judge in self._judges]
        known = [count for count in counts if count is not None]
        return max(known) if known else None

    def answer_tokens(self, labels: int) -> int | None:
        """The cap on an answer where a judge's context is known (the room `_context_room`
        leaves it), else none."""
        return None if self._context() is None else self._answer_room(labels)
