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
removed: `transforms` carries, per position, the logit changes the call asked for (`SampledFrom`:
temperature, top-k, top-p, min_p, penalties, logit bias; none on context; a tensor is None when no
row uses it). Rows are padded on the right; padding has attention 0, mask 0, old logprob 0 and no
sampling transform.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch

from art_proxy.proxy.attribution import canonical_message, reply_messages
from art_proxy.records import CallRecord, JsonObject, StepKind
from art_proxy_trainer.errors import EmptyBatchError
from art_proxy_trainer.grammar import GrammarReplay, leaves_ids_out
from art_proxy_trainer.sampled import (
    NO_TRANSFORMS,
    NOT_FILTERED,
    SampledFrom,
    SamplingTransforms,
    sampled_from,
)

# The choice of a trajectory's last call that is trained (see the module docstring).
LAST_CALL_CHOICE = 0


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
    # Per token, where the completion of the call that sampled it starts (context: itself).
    call_starts: list[int] = field(default_factory=list)
    # Per token, the packed bitmask of what its call's grammar allowed (None: no grammar).
    allowed: list[torch.Tensor | None] = field(default_factory=list)
    # Per token, the teacher's logprob of it (NaN: context, or no teacher scored it).
    teacher_logprobs: list[float] = field(default_factory=list)

    def add_context(self, token_ids: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(token_ids)
        self.mask.extend([0] * len(token_ids))
        self.old_logprobs.extend([0.0] * len(token_ids))
        self.sampled_from.extend([NOT_FILTERED] * len(token_ids))
        self.call_starts.extend(range(start, start + len(token_ids)))
        self.allowed.extend([None] * len(token_ids))
        self.teacher_logprobs.extend([math.nan] * len(token_ids))

    def add_demonstrated(self, token_ids: Sequence[int]) -> None:
        """Tokens a demonstration wrote: trained, with no sampler and so no recorded logprob."""
        self.call_starts.extend([len(self.tokens)] * len(token_ids))
        self.allowed.extend([None] * len(token_ids))
        self.tokens.extend(token_ids)
        self.mask.extend([1] * len(token_ids))
        self.old_logprobs.extend([0.0] * len(token_ids))
        self.sampled_from.extend([NOT_FILTERED] * len(token_ids))
        self.teacher_logprobs.extend([math.nan] * len(token_ids))

    def add_sampled(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        sampled_from: SampledFrom = NOT_FILTERED,
        allowed_N_W: torch.Tensor | None = None,
        teacher_logprobs: Sequence[float] | None = None,
    ) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} completion ids but {len(logprobs)} logprobs")
        if teacher_logprobs is not None and len(teacher_logprobs) != len(token_ids):
            raise ValueError(
                f"{len(token_ids)} completion ids but {len(teacher_logprobs)} teacher logprobs"
            )
        self.teacher_logprobs.extend(
            teacher_logprobs if teacher_logprobs is not None else [math.nan] * len(token_ids)
        )
        self.call_starts.extend([len(self.tokens)] * len(token_ids))
        self.allowed.extend(
            list(allowed_N_W) if allowed_N_W is not None else [None] * len(token_ids)
        )
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
    # The kind of step it is for: grpo, the policy gradient of recorded samples (old logprobs and
    # advantages used); sft, the likelihood of demonstrated tokens (a warm start; neither used).
    objective: StepKind = "grpo"
    # float32, a teacher's logprob of each sampled token (NaN: none); None: no teacher scored any.
    teacher_logprobs_B_T: torch.Tensor | None = None

    @property
    def trained_tokens(self) -> int:
        return int(self.mask_B_T.sum().item())

    def to(self, device: torch.device) -> TrainingBatch:
        """The batch on `device` (itself where it is there already)."""
        if self.tokens_B_T.device == device:
            return self
        return replace(
            self,
            tokens_B_T=self.tokens_B_T.to(device),
            attention_mask_B_T=self.attention_mask_B_T.to(device),
            mask_B_T=self.mask_B_T.to(device),
            old_logprobs_B_T=self.old_logprobs_B_T.to(device),
            advantages_B=self.advantages_B.to(device),
            transforms=self.transforms.to(device),
            teacher_logprobs_B_T=(
                None if self.teacher_logprobs_B_T is None else self.teacher_logprobs_B_T.to(device)
            ),
        )

    def take(self, rows: list[int]) -> TrainingBatch:
        """These rows alone, in this order (a rank's share of the batch)."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.tokens_B_T.device)
        return replace(
            self,
            tokens_B_T=self.tokens_B_T[index],
            attention_mask_B_T=self.attention_mask_B_T[index],
            mask_B_T=self.mask_B_T[index],
            old_logprobs_B_T=self.old_logprobs_B_T[index],
            advantages_B=self.advantages_B[index],
            transforms=self.transforms.rows(index, self.tokens_B_T.shape[1]),
            teacher_logprobs_B_T=(
                None if self.teacher_logprobs_B_T is None else self.teacher_logprobs_B_T[index]
            ),
            trajectory_ids=(
                tuple(self.trajectory_ids[row] for row in rows) if self.trajectory_ids else ()
            ),
        )


def _trainable(call: CallRecord) -> bool:
    return (
        call.status == "ok"
        and call.trainable
        and call.prompt_token_ids is not None
        and bool(call.completion_token_ids)
        and bool(call.logprobs)
    )


# A teacher's logprobs of a call's trained choice, by (call id, choice); a choice it did not score
# is absent or None.
TeacherLogprobs = Mapping[tuple[str, int], Sequence[float] | None]
NO_TEACHER: TeacherLogprobs = MappingProxyType({})


def trained_choices(calls: Iterable[CallRecord]) -> list[tuple[CallRecord, int | None]]:
    """A trajectory's calls in order, each with the choice of it that is trained (None: none is,
    see the module docstring): what a teacher is asked to score."""
    ordered = sorted(calls, key=lambda c: c.seq)
    return [
        (call, _continued_choice(call, ordered[position + 1 :]) if _trainable(call) else None)
        for position, call in enumerate(ordered)
    ]


def sequences_from_calls(
    trajectory_id: str,
    calls: Iterable[CallRecord],
    grammars: GrammarReplay | None = None,
    teacher: TeacherLogprobs = NO_TEACHER,
) -> tuple[list[TrainingSequence], SequenceStats]:
    """Stitch a trajectory's calls into as few sequences as their token ids allow. A call vLLM
    left ids out of (a grammar, `allowed_token_ids`, `min_tokens`) is replayed with `grammars`
    (skipped without one, or when the replay refuses a recorded token). `teacher`: the teacher's
    logprobs of the trained choices it scored."""
    sequences: list[TrainingSequence] = []
    stitch_misses = skipped = 0
    for call, choice in trained_choices(calls):
        if choice is None:
            skipped += 1
            continue
        # _trainable checked these are present.
        assert call.prompt_token_ids is not None
        assert call.completion_token_ids is not None and call.logprobs is not None
        allowed_N_W = None
        if leaves_ids_out(call.request):
            scorable = False
            if grammars is not None:
                ids = call.completion_token_ids[choice]
                start = grammars.reasoning_end(_reply(call, choice), ids)
                scorable, allowed_N_W = grammars.allowed_tokens(call.request, ids, start)
            if not scorable:
                skipped += 1
                continue
        prompt = trained_prompt(call)
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
            allowed_N_W,
            teacher.get((call.id, choice)),
        )
    return sequences, SequenceStats(len(sequences), stitch_misses, skipped)


def _reply(call: CallRecord, choice: int) -> JsonObject | None:
    """The recorded message of choice `choice` (its reasoning, where a parser split it off)."""
    choices = (call.response or {}).get("choices")
    if not isinstance(choices, list):
        return None
    for entry in choices:
        if isinstance(entry, dict) and entry.get("index", 0) == choice:
            message = entry.get("message")
            return message if isinstance(message, dict) else None
    return None


def trained_prompt(call: CallRecord) -> list[int]:
    """The prompt ids the trainer scores a call's tokens after: those the model saw, less the
    guidance a guided retry added (proxy/guidance.py), so the policy learns to answer so without
    it. The same guidance sits at the same place in every call of a trajectory, so the calls
    still stitch."""
    assert call.prompt_token_ids is not None
    if call.guidance is None:
        return call.prompt_token_ids
    ids = call.prompt_token_ids
    return ids[: call.guidance.start] + ids[call.guidance.end :]


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


def build_batch(
    samples: Iterable[TrajectorySample],
    *,
    pad_token_id: int = 0,
    grammars: GrammarReplay | None = None,
    teacher: TeacherLogprobs = NO_TEACHER,
) -> TrainingBatch:
    """Right-padded tensors for every sequence of every sample; raises EmptyBatchError if none.
    `grammars` replays the grammars of calls vLLM constrained (without it they are skipped);
    `teacher` holds a teacher's logprobs of the trained choices it scored."""
    rows: list[tuple[TrainingSequence, float]] = []
    stats = SequenceStats()
    for sample in samples:
        sequences, sample_stats = sequences_from_calls(
            sample.trajectory_id, sample.calls, grammars, teacher
        )
        rows.extend((sequence, sample.advantage) for sequence in sequences)
        stats += sample_stats
    if not rows:
        raise EmptyBatchError("no call of these trajectories carried trainable token ids")
    return _padded(rows, stats, pad_token_id, "grpo")


def demonstration_batch(
    sequences: Sequence[TrainingSequence], *, pad_token_id: int = 0
) -> TrainingBatch:
    """A warm start's batch: demonstrated sequences (`add_demonstrated` marks what is learnt)."""
    rows = [(sequence, 0.0) for sequence in sequences if any(sequence.mask)]
    if not rows:
        raise EmptyBatchError("no demonstration has a token to learn")
    return _padded(rows, SequenceStats(len(rows)), pad_token_id, "sft")


def _padded(
    rows: Sequence[tuple[TrainingSequence, float]],
    stats: SequenceStats,
    pad_token_id: int,
    objective: StepKind,
) -> TrainingBatch:
    """Right-padded tensors of the rows (each a sequence and its advantage)."""
    length = max(len(sequence.tokens) for sequence, _ in rows)
    tokens_B_T = torch.full((len(rows), length), pad_token_id, dtype=torch.int64)
    attention_mask_B_T = torch.zeros((len(rows), length), dtype=torch.int64)
    mask_B_T = torch.zeros((len(rows), length), dtype=torch.float32)
    old_logprobs_B_T = torch.zeros((len(rows), length), dtype=torch.float32)
    for row, (sequence, _) in enumerate(rows):
        n = len(sequence.tokens)
        tokens_B_T[row, :n] = torch.tensor(sequence.tokens, dtype=torch.int64)
        attention_mask_B_T[row, :n] = 1
        mask_B_T[row, :n] = torch.tensor(sequence.mask, dtype=torch.float32)
        old_logprobs_B_T[row, :n] = torch.tensor(sequence.old_logprobs, dtype=torch.float32)
    advantages_B = torch.tensor([advantage for _, advantage in rows], dtype=torch.float32)
    teacher_B_T = None
    if any(not math.isnan(v) for sequence, _ in rows for v in sequence.teacher_logprobs):
        teacher_B_T = torch.full((len(rows), length), math.nan, dtype=torch.float32)
        for row, (sequence, _) in enumerate(rows):
            n = len(sequence.tokens)
            teacher_B_T[row, :n] = torch.tensor(sequence.teacher_logprobs, dtype=torch.float32)
    return TrainingBatch(
        tokens_B_T,
        attention_mask_B_T,
        mask_B_T,
        old_logprobs_B_T,
        advantages_B,
        stats,
        _transforms([sequence for sequence, _ in rows], length),
        tuple(sequence.trajectory_id for sequence, _ in rows),
        objective,
        teacher_B_T,
    )


def _transforms(sequences: Sequence[TrainingSequence], length: int) -> SamplingTransforms:
    """Each position's logit changes as tensors; a change no position uses is None."""
    shape = (len(sequences), length)

    def per_position(read: Callable[[SampledFrom], float], off: float) -> torch.Tensor | None:
        values = [[read(s) for s in sequence.sampled_from] for sequence in sequences]
        if all(value == off for row in values for value in row):
            return None
        tensor = torch.full(shape, off, dtype=torch.float32)
        for row, row_values in enumerate(values):
            tensor[row, : len(row_values)] = torch.tensor(row_values, dtype=torch.float32)
        return tensor

    top_k_B_T = per_position(lambda s: s.top_k, 0)
    penalized = any(s.penalized for sequence in sequences for s in sequence.sampled_from)
    call_start_B_T = position_B_T = None
    if penalized:
        position_B_T = torch.arange(length).expand(shape).contiguous()
        call_start_B_T = position_B_T.clone()
        for row, sequence in enumerate(sequences):
            call_start_B_T[row, : len(sequence.call_starts)] = torch.tensor(sequence.call_starts)
    bias_ids_B_T_M = bias_B_T_M = None
    widest = max((len(s.logit_bias) for q in sequences for s in q.sampled_from), default=0)
    if widest:
        bias_ids_B_T_M = torch.full((*shape, widest), -1, dtype=torch.int64)
        bias_B_T_M = torch.zeros((*shape, widest), dtype=torch.float32)
        for row, sequence in enumerate(sequences):
            for position, sampled in enumerate(sequence.sampled_from):
                if sampled.logit_bias:
                    ids, biases = zip(*sampled.logit_bias, strict=True)
                    bias_ids_B_T_M[row, position, : len(ids)] = torch.tensor(ids)
                    bias_B_T_M[row, position, : len(ids)] = torch.tensor(biases)
    allowed_index_B_T = allowed_K_W = None
    constrained = [
        (r, t, bits)
        for r, q in enumerate(sequences)
        for t, bits in enumerate(q.allowed)
        if bits is not None
    ]
    if constrained:
        allowed_index_B_T = torch.full(shape, -1, dtype=torch.int64)
        for index, (row, position, _) in enumerate(constrained):
            allowed_index_B_T[row, position] = index
        allowed_K_W = torch.stack([bits for _, _, bits in constrained])
    return SamplingTransforms(
        per_position(lambda s: s.temperature, 1.0),
        None if top_k_B_T is None else top_k_B_T.long(),
        per_position(lambda s: s.top_p, 1.0),
        per_position(lambda s: s.min_p, 0.0),
        per_position(lambda s: s.repetition_penalty, 1.0),
        per_position(lambda s: s.frequency_penalty, 0.0),
        per_position(lambda s: s.presence_penalty, 0.0),
        call_start_B_T,
        position_B_T,
        bias_ids_B_T_M,
        bias_B_T_M,
        allowed_index_B_T,
        allowed_K_W,
    )
