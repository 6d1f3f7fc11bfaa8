"""The generation engine: one worker thread advances every running request as one batch.

Requests arrive on the event loop (`submit`) and queue as rows, one per choice. Between two forward
passes the worker admits queued rows up to `max_batch_size`, prefills them together (a prompt that
n choices share is computed once), joins them to the running batch, and then advances every row by
one token: continuous batching on a left-padded KV cache (`kv_batch`). Finished and cancelled rows
leave at the next step. Each step's output reaches the event loop through `call_soon_threadsafe`,
so streams see tokens as they are made and the loop never waits on torch. Adapter loads and unloads
run on the worker too, between steps, so no forward pass sees a model half changed.

Sampling (`sampling`) reports the processed logprobs, the distribution each token was drawn from.
A stop id (EOS or a `stop_token_ids` entry) is the last id of its choice with its own logprob, and
its text is left out; a stop string cuts the text but keeps every id, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from art_proxy.local.adapters import Adapter, AdapterRegistry
from art_proxy.local.detokenizer import Detokenizer
from art_proxy.local.errors import AdapterNotFound
from art_proxy.local.generation import Generation
from art_proxy.local.kv_batch import KvBatch
from art_proxy.local.sampling import Sampled, SamplingParams, prompt_logprobs, sample
from art_proxy.vllm_api.engine import ChoiceDelta, EngineFailure, FinishReason, PromptLogprobs

log = logging.getLogger(__name__)

# Padded prompt tokens one prefill pass may take: this bounds its memory (attention is quadratic
# in the prompt) and how long running rows wait for it. One row is always admitted.
_PREFILL_TOKENS = 8192


@dataclass
class EngineStats:
    """Counters for tests and benchmarks; written by the engine thread only."""

    prefills: int = 0  # forward passes that admitted new rows
    decode_steps: int = 0  # forward passes that advanced running rows by one token
    rows_admitted: int = 0
    peak_rows: int = 0  # the most rows one forward pass carried
    tokens_generated: int = 0


@dataclass(eq=False)
class _Row:
    generation: Generation
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    adapter: Adapter | None
    generator: torch.Generator | None
    detokenizer: Detokenizer
    prompt_key: tuple[str, tuple[int, ...]]  # rows with equal keys share one prefill
    generated: int = 0
    next_input: int = 0  # the id sampled last, fed to the next decode step
    done: bool = False
    prompt_logprobs: PromptLogprobs | None = None  # sent on the row's first delta, when asked


@dataclass(eq=False)
class _Command:
    action: Callable[[], None]
    future: asyncio.Future[None] = field(repr=False)


class Engine:
    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, max_batch_size: int
    ) -> None:
        self.adapters = AdapterRegistry(model)
        self.stats = EngineStats()
        # A copy for this thread's decoding: a Rust tokenizer shared with the event loop, which
        # encodes prompts meanwhile, can fail with "Already borrowed".
        self._tokenizer = copy.deepcopy(tokenizer)
        self._max_batch_size = max_batch_size
        self._stop_ids = _eos_ids(model, tokenizer)
        # Where the weights are (a CPU, or one CUDA device): every input goes there.
        self._device = next(model.parameters()).device
        self._cond = threading.Condition()
        self._waiting: deque[_Row] = deque()
        self._commands: deque[_Command] = deque()
        self._closing = False
        self._live_rows = 0  # submitted and not yet retired, under `_cond`
        self._running: list[_Row] = []  # engine thread only, in batch order
        self._batch: KvBatch | None = None
        self._thread = threading.Thread(target=self._work, name="local-llm-engine", daemon=True)

    @property
    def active_rows(self) -> int:
        """Rows waiting for a slot or generating."""
        with self._cond:
            return self._live_rows

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self._fail([*self._waiting, *self._running], EngineFailure("The server is shutting down."))
        self._waiting.clear()
        self.adapters.close()

    def submit(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        n: int,
        adapter: str | None,
    ) -> Generation:
        """Queue `n` choices per prompt, choice `p * n + i` for prompt p; call on the event loop
        that will read the deltas. An unknown adapter raises `AdapterNotFound`."""
        chosen = None
        if adapter is not None:
            chosen = self.adapters.acquire(adapter, len(prompts) * n)
            if chosen is None:
                raise AdapterNotFound(f"The model `{adapter}` does not exist.")
        generation = Generation(len(prompts) * n, asyncio.get_running_loop())
        # One generator per request: its choices differ, yet the request replays with its seed.
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed)
        adapter_key = chosen.peft_name if chosen else ""
        keys = [(adapter_key, tuple(prompt)) for prompt in prompts]
        rows = [
            _Row(
                generation,
                index,
                prompts[index // n],
                params,
                chosen,
                generator,
                Detokenizer(self._tokenizer, prompts[index // n], params.stop),
                keys[index // n],
            )
            for index in range(len(prompts) * n)
        ]
        with self._cond:
            self._waiting.extend(rows)
            self._live_rows += len(rows)
            self._cond.notify()
        return generation

    async def load_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        await self._on_worker(lambda: self.adapters.load(name, path, replace=replace))

    async def unload_adapter(self, name: str) -> None:
        await self._on_worker(lambda: self.adapters.unload(name))

    async def _on_worker(self, action: Callable[[], None]) -> None:
        command = _Command(action, asyncio.get_running_loop().create_future())
        with self._cond:
            self._commands.append(command)
            self._cond.notify()
        await command.future

    # -- engine thread -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._commands or self._running or self._closing):
                    self._cond.wait()
                if self._closing:
                    return
                commands = list(self._commands)
                self._commands.clear()
                admitted = self._admit()
            for command in commands:
                _run_command(command)
            try:
                with torch.inference_mode():
                    self._drop_cancelled()
                    if admitted:
                        self._prefill(admitted)
                    if self._running:
                        self._decode()
            except Exception as exc:  # a failed forward pass ends its requests, not the server
                log.exception("generation step failed")
                self._fail([*admitted, *self._running], EngineFailure(f"Generation failed: {exc}"))
            try:
                self.adapters.collect()
            except Exception:  # the adapter stays in the model, unused; serving goes on
                log.exception("removing an unloaded adapter failed")

    def _admit(self) -> list[_Row]:
        admitted: list[_Row] = []
        prompts: set[tuple[str, tuple[int, ...]]] = set()
        longest = 0
        while self._waiting and len(self._running) + len(admitted) < self._max_batch_size:
            row = self._waiting[0]
            if row.generation.cancelled:
                self._retire(self._waiting.popleft())
                continue
            new_prompts = len(prompts | {row.prompt_key})
            new_longest = max(longest, len(row.prompt_ids))
            if admitted and new_prompts * new_longest > _PREFILL_TOKENS:
                break
            admitted.append(self._waiting.popleft())
            prompts.add(row.prompt_key)
            longest = new_longest
        return admitted

    def _prefill(self, rows: list[_Row]) -> None:
        unique: dict[tuple[str, tuple[int, ...]], int] = {}
        for row in rows:
            unique.setdefault(row.prompt_key, len(unique))
        source_of_row = [unique[row.prompt_key] for row in rows]
        firsts = {index: row for row, index in zip(rows, source_of_row, strict=True)}
        prompts = [firsts[index] for index in range(len(unique))]
        length = max(len(row.prompt_ids) for row in prompts)
        ids_U_T = torch.tensor(
            [[0] * (length - len(r.prompt_ids)) + r.prompt_ids for r in prompts],
            device=self._device,
        )
        mask_U_T = torch.tensor(
            [[0] * (length - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in prompts],
            device=self._device,
        )
        out = self.adapters.model(
            input_ids=ids_U_T,
            attention_mask=mask_U_T,
            position_ids=(mask_U_T.cumsum(dim=1) - 1).clamp(min=0),
            past_key_values=DynamicCache(),
            use_cache=True,
            # Every position's logits where a prompt's logprobs are asked for, else the last's.
            logits_to_keep=0 if any(r.params.prompt_logprobs is not None for r in prompts) else 1,
            **self.adapters.forward_kwargs([r.adapter for r in prompts]),
        )
        for index, first in enumerate(prompts):
            k = first.params.prompt_logprobs
            if k is not None:
                pad = length - len(first.prompt_ids)
                scored = prompt_logprobs(out.logits[index, pad:], first.prompt_ids, k)
                for row, source in zip(rows, source_of_row, strict=True):
                    if source == index:
                        row.prompt_logprobs = scored
        self.stats.prefills += 1
        self.stats.rows_admitted += len(rows)
        self.stats.peak_rows = max(self.stats.peak_rows, len(prompts) + len(self._running))
        logits_R_V = out.logits[:, -1][torch.tensor(source_of_row, device=self._device)]
        done = self._advance(rows, sample(logits_R_V, *_sampling_inputs(rows)))
        survivors = [i for i, finished in enumerate(done) if not finished]
        if not survivors:
            return
        batch = KvBatch(out.past_key_values, mask_U_T)
        batch.keep([source_of_row[i] for i in survivors])
        if self._batch is None:
            self._batch = batch
        else:
            self._batch.extend(batch)
        self._running += [rows[i] for i in survivors]

    def _decode(self) -> None:
        batch, rows = self._batch, self._running
        assert batch is not None  # rows are running, so a batch holds their cache
        out = self.adapters.model(
            input_ids=torch.tensor([[row.next_input] for row in rows], device=self._device),
            attention_mask=batch.mask_with_next_B_T(),
            position_ids=batch.positions_B1(),
            past_key_values=batch.cache,
            use_cache=True,
            **self.adapters.forward_kwargs([row.adapter for row in rows]),
        )
        batch.advanced(out.past_key_values)
        self.stats.decode_steps += 1
        self.stats.peak_rows = max(self.stats.peak_rows, len(rows))
        done = self._advance(rows, sample(out.logits[:, -1], *_sampling_inputs(rows)))
        if any(done):
            self._keep([i for i, finished in enumerate(done) if not finished])

    def _advance(self, rows: Sequence[_Row], sampled: Sampled) -> list[bool]:
        """Record each row's new token, send it out, and say which rows have finished."""
        deltas: dict[Generation, list[ChoiceDelta]] = {}
        done = []
        for row, token_id, logprob in zip(
            rows, sampled.token_ids_B, sampled.logprobs_B, strict=True
        ):
            row.generated += 1
            row.next_input = token_id
            finish, stop_reason = self._stop_of(row, token_id)
            if finish is not None:
                row.detokenizer.finish()
            text = row.detokenizer.release(final=finish is not None)
            delta = ChoiceDelta(row.index, (token_id,), (logprob,), text, finish, stop_reason)
            if row.prompt_logprobs is not None:
                delta.prompt_logprobs, row.prompt_logprobs = row.prompt_logprobs, None
            deltas.setdefault(row.generation, []).append(delta)
            if finish is not None:
                self._retire(row)
            done.append(finish is not None)
        self.stats.tokens_generated += len(rows)  # before delivery: readers see it with the deltas
        for generation, items in deltas.items():
            generation.deliver(items)
        return done

    def _stop_of(self, row: _Row, token_id: int) -> tuple[FinishReason | None, str | int | None]:
        if token_id in self._stop_ids and not row.params.ignore_eos:
            return "stop", None
        if token_id in row.params.stop_token_ids:
            return "stop", token_id
        # Only text that did not end the choice by id is decoded, so a stop id adds no text.
        row.detokenizer.append(token_id)
        if row.detokenizer.stop_hit is not None:
            return "stop", row.detokenizer.stop_hit
        if row.generated >= row.params.max_tokens:
            return "length", None
        return None, None

    def _drop_cancelled(self) -> None:
        keep = [i for i, row in enumerate(self._running) if not row.generation.cancelled]
        if len(keep) < len(self._running):
            for row in self._running:
                if row.generation.cancelled:
                    self._retire(row)
            self._keep(keep)

    def _keep(self, indices: list[int]) -> None:
        self._running = [self._running[i] for i in indices]
        if not self._running:
            self._batch = None
        elif self._batch is not None:
            self._batch.keep(indices)

    def _retire(self, row: _Row) -> None:
        if row.done:
            return
        row.done = True
        if row.adapter is not None:
            self.adapters.release(row.adapter)
        with self._cond:
            self._live_rows -= 1

    def _fail(self, rows: list[_Row], failure: EngineFailure) -> None:
        """End these rows' requests with `failure`, and with them the running batch."""
        generations = {row.generation: None for row in rows if not row.done}
        for row in rows:
            self._retire(row)
        for generation in generations:
            # Its rows still waiting for a slot are skipped at admission.
            generation.cancelled = True
            generation.deliver(failure)
        self._running = []
        self._batch = None


def _sampling_inputs(
    rows: Sequence[_Row],
) -> tuple[list[SamplingParams], list[torch.Generator | None]]:
    return [row.params for row in rows], [row.generator for row in rows]


def _run_command(command: _Command) -> None:
    error: BaseException | None = None
    try:
        command.action()
    except Exception as exc:  # handed to the awaiting request, which answers with its status
        error = exc
    loop = command.future.get_loop()

    def settle() -> None:
        if command.future.done():
            return
        if error is None:
            command.future.set_result(None)
        else:
            command.future.set_exception(error)

    with contextlib.suppress(RuntimeError):  # the requester's loop has closed
        loop.call_soon_threadsafe(settle)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """EOS of the tokenizer and of generation_config.json, which may list several (vLLM stops on all)."""
    ids: set[int] = set()
    config_ids = getattr(model.generation_config, "eos_token_id", None)
    for candidate in (tokenizer.eos_token_id, config_ids):
        if isinstance(candidate, int):
            ids.add(candidate)
        elif isinstance(candidate, list):
            ids.update(i for i in candidate if isinstance(i, int))
    return frozenset(ids)
