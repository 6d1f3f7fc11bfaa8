"""Training sequences built from the token ids the proxy recorded (never a re-rendered template).

Calls of a trajectory are walked in `seq` order. A call whose prompt ids start with the sequence built
so far extends it: the new prompt ids are context (mask 0), its completion ids are sampled (mask 1). A
call that does not extend it is a stitch miss: the sequence so far is closed and the call starts a new
one. The ids decide, not the recorded `stitched` flag, which the proxy sets against any choice of the
previous call only. Of a call with several choices (`n > 1`) only the one the agent continued is
trained, with the trajectory's advantage: the choice whose ids the next call's prompt extends, else
the one whose reply the next call's messages carry; the last call's is choice 0 (what an agent that
reads one answer takes). A call whose continued choice cannot be told is skipped, never credited
with tokens the agent dropped. Calls without captured ids are skipped and counted; their
completion still reaches a later prompt, where it is context like a tool result.

Position `t` of `mask_B_T`, `old_logprobs_B_T` and the sampling transforms describe token `t` of
`tokens_B_T` (predicting it from the tokens before), so the loss sees the tensors aligned. Recorded
logprobs are those of the distribution sampled from (vLLM's processed logprobs), so a token sampled
at temperature 0.7 with top_p 0.9 is scored from logits divided by 0.7 with what top-p leaves out
removed: `transforms` carries, per position, the temperature, top-k and top-p the call asked for (1,
0 and 1 where it set none or asked for greedy decoding, and on context; a tensor is None when no row
uses it). Rows are padded on the right; padding has attention 0, mask 0, old logprob 0 and no
sampling transform.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from art_proxy.proxy.attribution import canonical_message, reply_messages
from art_proxy.records import CallRecord
from art_proxy_trainer.errors import EmptyBatchError
from art_proxy_trainer.scoring import NO_TRANSFORMS, SamplingTransforms

# The choice of a trajectory's last call that is trained (see the module docstring).
LAST_CALL_CHOICE = 0


@dataclass(frozen=True)
class SampledFrom:
    """The transforms of the logits a call's tokens were drawn from (none: 1, 0, 1)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off (vLLM's -1 too)
    top_p: float = 1.0  # 1 = off


NOT_FILTERED = SampledFrom()


def sampled_from(call: CallRecord) -> SampledFrom:
    """What the call asked for; greedy decoding (temperature 0) reports the raw distribution."""
    temperature = _number(call.sampling.get("temperature"), 1.0)
    if temperature <= 0:
        return NOT_FILTERED
    top_k = _number(call.sampling.get("top_k"), 0)
    top_p = _number(call.sampling.get("top_p"), 1.0)
    return SampledFrom(temperature, max(int(top_k), 0), min(top_p, 1.0) if top_p > 0 else 1.0)


def _number(value: object, default: float) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


@dataclass(frozen=True)
class TrajectorySample:
    """A trajectory's calls and the advantage every one of its sampled tokens gets."""

    trajectory_id: str
    calls: Sequence[CallRecord]
    advantage: float


@dataclass
class TrainingSequence:
    trajectory_id: str
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    sampled_from: list[SampledFrom] = field(default_factory=list)

    def add_context(self, token_ids: Sequence[int]) -> None:
        self.tokens.extend(token_ids)
        self.mask.extend([0] * len(token_ids))
        self.old_logprobs.extend([0.0] * len(token_ids))
        self.sampled_from.extend([NOT_FILTERED] * len(token_ids))

    def add_sampled(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        sampled_from: SampledFrom = NOT_FILTERED,
    ) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} completion ids but {len(logprobs)} logprobs")
        self.tokens.extend(token_ids)
        self.mask.extend([1] * len(token_ids))
        self.old_logprobs.extend(logprobs)
        self.sampled_from.extend([sampled_from] * len(token_ids))


@dataclass(frozen=True)
class SequenceStats:
    sequences: int = 0
    stitch_misses: int = 0
    skipped_calls: int = 0

    def __add__(self, other: SequenceStats) -> SequenceStats:
        return SequenceStats(
            self.sequences + other.sequences,
            self.stitch_misses + other.stitch_misses,
            self.skipped_calls + other.skipped_calls,
        )


@dataclass(frozen=True)
class TrainingBatch:
    tokens_B_T: torch.Tensor  # int64
    attention_mask_B_T: torch.Tensor  # int64, 1 on real tokens
    mask_B_T: torch.Tensor  # float32, 1 on sampled tokens (the loss mask)
    old_logprobs_B_T: torch.Tensor  # float32, pi_old of each sampled token
    advantages_B: torch.Tensor  # float32, the row's trajectory advantage
    stats: SequenceStats
    transforms: SamplingTransforms = NO_TRANSFORMS
    trajectory_ids: tuple[str, ...] = ()  # each row's trajectory (empty: not known)

    @property
    def trained_tokens(self) -> int:
        return int(self.mask_B_T.sum().item())

    def to(self, device: torch.device) -> TrainingBatch:
        """The batch on `device` (itself where it is there already)."""
        if self.tokens_B_T.device == device:
            return self
        return TrainingBatch(
            self.tokens_B_T.to(device),
            self.attention_mask_B_T.to(device),
            self.mask_B_T.to(device),
            self.old_logprobs_B_T.to(device),
            self.advantages_B.to(device),
            self.stats,
            self.transforms.to(device),
            self.trajectory_ids,
        )

    def take(self, rows: list[int]) -> TrainingBatch:
        """These rows alone, in this order (a rank's share of the batch)."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.tokens_B_T.device)
        return TrainingBatch(
            self.tokens_B_T[index],
            self.attention_mask_B_T[index],
            self.mask_B_T[index],
            self.old_logprobs_B_T[index],
            self.advantages_B[index],
            self.stats,
            self.transforms.rows(index, self.tokens_B_T.shape[1]),
            tuple(self.trajectory_ids[row] for row in rows) if self.trajectory_ids else (),
        )


def _trainable(call: CallRecord) -> bool:
    return (
        call.status == "ok"
        and call.trainable
        and call.prompt_token_ids is not None
        and bool(call.completion_token_ids)
        and bool(call.logprobs)
    )


def sequences_from_calls(
    trajectory_id: str, calls: Iterable[CallRecord]
) -> tuple[list[TrainingSequence], SequenceStats]:
    """Stitch a trajectory's calls into as few sequences as their token ids allow."""
    sequences: list[TrainingSequence] = []
    stitch_misses = skipped = 0
    ordered = sorted(calls, key=lambda c: c.seq)
    for position, call in enumerate(ordered):
        choice = _continued_choice(call, ordered[position + 1 :]) if _trainable(call) else None
        if choice is None:
            skipped += 1
            continue
        # _trainable checked these are present.
        assert call.prompt_token_ids is not None
        assert call.completion_token_ids is not None and call.logprobs is not None
        prompt = call.prompt_token_ids
        current = sequences[-1] if sequences else None
        if current is not None and prompt[: len(current.tokens)] == current.tokens:
            current.add_context(prompt[len(current.tokens) :])
        else:
            if current is not None:
                stitch_misses += 1
            current = TrainingSequence(trajectory_id)
            current.add_context(prompt)
            sequences.append(current)
        current.add_sampled(
            call.completion_token_ids[choice],
            call.logprobs[choice],
            sampled_from(call),
        )
    return sequences, SequenceStats(len(sequences), stitch_misses, skipped)


def _continued_choice(call: CallRecord, later: Sequence[CallRecord]) -> int | None:
    """The choice of `call` its trajectory went on from; None when that cannot be told."""
    assert call.prompt_token_ids is not None and call.completion_token_ids is not None
    if len(call.completion_token_ids) == 1:
        return 0
    following = next((c for c in later if c.status == "ok"), None)
    if following is None:
        return LAST_CALL_CHOICE
    if following.prompt_token_ids is not None:
        for choice, ids in enumerate(call.completion_token_ids):
            sequence = call.prompt_token_ids + ids
            if following.prompt_token_ids[: len(sequence)] == sequence:
                return choice
    # Re-rendered by the agent: the reply it echoed back, compared as attribution compares it.
    asked = call.request.get("messages")
    echoed = following.request.get("messages")
    if call.response is None or not isinstance(asked, list) or not isinstance(echoed, list):
        return None
    if len(echoed) <= len(asked) or not isinstance(echoed[len(asked)], dict):
        return None
    sent_back = canonical_message(echoed[len(asked)])
    replies = reply_messages(call.response)
    return next(
        (i for i, reply in enumerate(replies) if canonical_message(reply) == sent_back), None
    )


def build_batch(samples: Iterable[TrajectorySample], *, pad_token_id: int = 0) -> TrainingBatch:
    """Right-padded tensors for every sequence of every sample; raises EmptyBatchError if none."""
    rows: list[tuple[TrainingSequence, float]] = []
    stats = SequenceStats()
    for sample in samples:
        sequences, sample_stats = sequences_from_calls(sample.trajectory_id, sample.calls)
        rows.extend((sequence, sample.advantage) for sequence in sequences)
        stats += sample_stats
    if not rows:
        raise EmptyBatchError("no call of these trajectories carried trainable token ids")
    length = max(len(sequence.tokens) for sequence, _ in rows)
    tokens_B_T = torch.full((len(rows), length), pad_token_id, dtype=torch.int64)
    attention_mask_B_T = torch.zeros((len(rows), length), dtype=torch.int64)
    mask_B_T = torch.zeros((len(rows), length), dtype=torch.float32)
    old_logprobs_B_T = torch.zeros((len(rows), length), dtype=torch.float32)
    temperatures_B_T = torch.ones((len(rows), length), dtype=torch.float32)
    top_k_B_T = torch.zeros((len(rows), length), dtype=torch.int64)
    top_p_B_T = torch.ones((len(rows), length), dtype=torch.float32)
    for row, (sequence, _) in enumerate(rows):
        n = len(sequence.tokens)
        tokens_B_T[row, :n] = torch.tensor(sequence.tokens, dtype=torch.int64)
        attention_mask_B_T[row, :n] = 1
        mask_B_T[row, :n] = torch.tensor(sequence.mask, dtype=torch.float32)
        old_logprobs_B_T[row, :n] = torch.tensor(sequence.old_logprobs, dtype=torch.float32)
        temperatures_B_T[row, :n] = torch.tensor([s.temperature for s in sequence.sampled_from])
        top_k_B_T[row, :n] = torch.tensor([s.top_k for s in sequence.sampled_from])
        top_p_B_T[row, :n] = torch.tensor([s.top_p for s in sequence.sampled_from])
    advantages_B = torch.tensor([advantage for _, advantage in rows], dtype=torch.float32)
    return TrainingBatch(
        tokens_B_T,
        attention_mask_B_T,
        mask_B_T,
        old_logprobs_B_T,
        advantages_B,
        stats,
        SamplingTransforms(
            temperatures_B_T if bool((temperatures_B_T != 1.0).any()) else None,
            top_k_B_T if bool((top_k_B_T != 0).any()) else None,
            top_p_B_T if bool((top_p_B_T != 1.0).any()) else None,
        ),
        tuple(sequence.trajectory_id for sequence, _ in rows),
    )
