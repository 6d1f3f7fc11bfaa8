"""The trainer's own step on a GPU, for models built from a config (random weights, no download).

For each size (a Qwen2-shaped 0.5B and 7B; `--tiny`: a 2-layer model small enough for a CPU) it
builds the model with random weights in bfloat16 on the device, wraps it with the trainer's
`lora_model` (r 8, every linear projection) and takes, on one GRPO batch of `--rows` rows of
`--prompt-tokens` + `--completion-tokens` tokens (the completions trained, advantages spread):

- `raw peft`: the baseline, a forward and backward of the same peft model on the same tokens with
  the model's own head (full logits, bf16) and a plain policy-gradient loss, then AdamW's step;
- `train_step`: the trainer's step, activations kept (`--no-gradient-checkpointing`);
- `train_step, recompute`: the trainer's default, activations recomputed;
- `top_p only`: the trainer's default step on a batch sampled with top_p 0.9 and no top_k (the
  OpenAI SDK's case), which must apply and stay finite;
- `every logit change`: the same with everything else the trainer reproduces of vLLM's sampler
  (a grammar's mask, a logit bias, the three penalties, min_p) on every trained token;
- `sidecar, memory capped`: the sidecar's own path, for the first size only: the model saved as a
  Hugging Face directory, loaded and placed as `art-proxy train` does (`--device auto`: bf16 base
  and float32 adapter on CUDA), then two steps with activations kept. On CUDA the process's memory
  is capped so the whole batch cannot fit in one pass: the first step must halve its micro-batch
  until it fits and apply; the second must start at the size that fit (no retry).

Each arm reports tokens per second (the batch's tokens over the step's median time), peak memory
(`torch.cuda.max_memory_allocated`; on a CPU, not measured) and, for the trainer's arms, the
peak that `art_proxy_trainer.memory` predicts (the README's arithmetic). The last line says
whether every arm applied and every peak stayed within 1.25x of the prediction.

    .venv/bin/python benchmarks/gpu_check.py                # on a CUDA machine: 0.5B and 7B
    .venv/bin/python benchmarks/gpu_check.py --tiny         # anywhere: the tiny form
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import torch
from peft import PeftModel
from rich.table import Table
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy.config import TrainerConfig
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.memory import QWEN2_0_5B, QWEN2_7B, ModelShape, step_memory
from art_proxy_trainer.policy import base_dtype, load_policy, training_device
from art_proxy_trainer.step import train_step
from benchmarks.gpu_check_build import TINY, Row, batch_of, build, console


def raw_step(model: PeftModel, optimizer: torch.optim.Optimizer, batch: TrainingBatch) -> None:
    logits_B_T_V = model(
        input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T, use_cache=False
    ).logits
    logprobs_B_T = (
        torch.log_softmax(logits_B_T_V[:, :-1].float(), dim=-1)
        .gather(-1, batch.tokens_B_T[:, 1:, None])
        .squeeze(-1)
    )
    mask_B_T = batch.mask_B_T[:, 1:]
    loss = -(logprobs_B_T * batch.advantages_B[:, None] * mask_B_T).sum() / mask_B_T.sum()
    torch.autograd.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(step: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, float]:
    """(median seconds of a step after a warm-up, peak GB of the steps after it). The warm-up is
    left out of the peak: it may try a micro-batch that does not fit before it halves it."""
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
    return statistics.median(seconds), peak


def resident_gb(device: torch.device) -> float:
    """GB allocated on `device` now (nan on a CPU), after a collection."""
    gc.collect()
    return torch.cuda.memory_allocated() / 1e9 if device.type == "cuda" else float("nan")


def check(
    shape: ModelShape, device: torch.device, rows: int, prompt: int, completion: int, repeats: int
) -> list[Row]:
    results: list[Row] = []
    tokens = rows * (prompt + completion)
    arms: tuple[tuple[str, bool, Literal["none", "top_p", "every change"], bool], ...] = (
        ("raw peft", False, "none", True),
        ("train_step", False, "none", False),
        ("train_step, recompute", True, "none", False),
        ("top_p only", True, "top_p", False),
        ("every logit change", True, "every change", False),
    )
    for arm, recompute, sampling, raw in arms:
        config = TrainerConfig(gradient_checkpointing=recompute)
        before = resident_gb(device)
        model = lora_model(build(shape, device), config)
        optimizer = make_optimizer(model, config)
        batch = batch_of(shape, rows, prompt, completion, device, sampling)
        # As Policy.train does: every step starts at the micro-batch size the last one fit.
        state: dict[str, object] = {"applied": True, "fit": None}

        def step(
            model: PeftModel = model,
            optimizer: torch.optim.Optimizer = optimizer,
            batch: TrainingBatch = batch,
            config: TrainerConfig = config,
            raw: bool = raw,
            state: dict[str, object] = state,
        ) -> None:
            if raw:
                raw_step(model, optimizer, batch)
                return
            fit = state["fit"]
            result = train_step(
                model,
                optimizer,
                batch,
                config,
                micro_batch_tokens=fit if isinstance(fit, int) else None,
            )
            state["applied"] = bool(state["applied"]) and result.applied
            state["fit"] = result.micro_batch_tokens

        try:
            seconds, peak = timed(step, device, repeats)
        except torch.OutOfMemoryError:
            # Only the baseline can: it has no micro-batches to fall back on.
            results.append(Row(shape.name, arm, None, None, None, raw, "out of memory"))
            console.print(f"{shape.name}: {arm}: out of memory")
        else:
            fit = state["fit"] if isinstance(state["fit"], int) and state["fit"] else tokens
            micro = min(tokens, config.micro_batch_tokens, fit)
            predicted = (
                None
                if raw
                else step_memory(shape, micro_batch_tokens=micro, recompute=recompute).total / 1e9
            )
            note = "" if raw or micro == min(tokens, config.micro_batch_tokens) else f"fit {micro}"
            results.append(
                Row(
                    shape.name,
                    arm,
                    tokens / seconds,
                    None if peak != peak else peak,
                    predicted,
                    bool(state["applied"]),
                    note,
                )
            )
            console.print(
                f"{shape.name}: {arm}: {tokens / seconds:,.0f} tokens/s, peak {peak:.1f} GB, "
                f"{before:.2f} GB allocated before the model was built {note}"
            )
        del model, optimizer, batch, step
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
    return results


def save_model(shape: ModelShape, directory: Path) -> None:
    """A model directory `art-proxy train --model` loads: random weights, a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(shape.vocabulary)}, "t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=tokenizer, eos_token="t1", pad_token="t2"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(directory)
    build(shape, torch.device("cpu")).save_pretrained(directory)


def sidecar_check(
    shape: ModelShape, device: torch.device, rows: int, prompt: int, completion: int, capped: bool
) -> Row:
    """The sidecar's load and placement, then steps with activations kept: with `capped` (on
    CUDA), the first under a memory cap that the whole batch cannot fit in."""
    import tempfile

    tokens = rows * (prompt + completion)
    with tempfile.TemporaryDirectory() as directory:
        save_model(shape, Path(directory))
        # As `art-proxy train --device auto` places it on one process (command._placed_policy).
        settings = TrainerConfig(gradient_checkpointing=False)
        placed_on = training_device("auto", settings)
        policy = load_policy(directory, settings, seed=0, dtype=base_dtype(settings, placed_on))
        policy.model.to(placed_on)
    base = next(p for n, p in policy.model.named_parameters() if "lora_" not in n)
    adapter = next(p for n, p in policy.model.named_parameters() if "lora_" in n)
    placed = (
        base.device.type == device.type
        and adapter.device.type == device.type
        and base.dtype == (torch.bfloat16 if device.type == "cuda" else torch.float32)
        and adapter.dtype == torch.float32
    )
    batch = batch_of(shape, rows, prompt, completion, device)
    settings = settings.model_copy(update={"micro_batch_tokens": tokens})
    fits = min(tokens, settings.micro_batch_tokens) // 4
    capped = capped and device.type == "cuda"
    if capped:
        # Room for the weights and a quarter of the batch's activations, not for all of them.
        cap = step_memory(shape, micro_batch_tokens=fits, recompute=False).total * 1.25 + 1e9
        torch.cuda.synchronize()
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, cap / torch.cuda.get_device_properties(device).total_memory)
        )
    try:
        first = policy.train(batch, settings)
        remembered = policy.micro_batch_tokens
        seconds, peak = timed(lambda: policy.train(batch, settings), device, repeats=1)
    finally:
        if capped:
            torch.cuda.set_per_process_memory_fraction(1.0)
    halved = not capped or (remembered is not None and 0 < remembered < tokens)
    console.print(
        f"{shape.name}: sidecar: placed {base.dtype} base, {adapter.dtype} adapter on "
        f"{base.device}; first step applied {first.applied}, micro-batch {tokens} -> {remembered}"
    )
    predicted = step_memory(shape, micro_batch_tokens=remembered or tokens, recompute=False)
    return Row(
        shape.name,
        "sidecar, memory capped" if capped else "sidecar",
        tokens / seconds,
        None if peak != peak else peak,
        predicted.total / 1e9,
        placed and first.applied and halved and policy.micro_batch_tokens == remembered,
    )


def recorded(shape: ModelShape, what: str, run: Callable[[], list[Row]]) -> list[Row]:
    """`run`'s rows, or one failed row saying what it raised (the other sizes' rows still show)."""
    try:
        return run()
    except Exception as exc:  # a check that breaks is a result: the device time is not wasted
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        console.print(f"{shape.name}: {what}: {message}")
        return [Row(shape.name, what, None, None, None, False, message[:120])]


def report(rows: list[Row]) -> bool:
    table = Table(title="the trainer's step on a GPU (bf16 base, LoRA r 8, random weights)")
    for column in ("model", "arm", "tokens/s", "peak GB", "predicted GB", "applied", "note"):
        table.add_column(column, justify="right")
    ok = True
    for row in rows:
        within = (
            row.peak_gb is None
            or row.predicted_gb is None
            or row.peak_gb <= 1.25 * row.predicted_gb
        )
        ok = ok and row.applied and within
        table.add_row(
            row.model,
            row.arm,
            "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}",
            "-" if row.peak_gb is None else f"{row.peak_gb:.1f}",
            "-" if row.predicted_gb is None else f"{row.predicted_gb:.1f}",
            "yes" if row.applied else "NO",
            row.note,
        )
    console.print(table)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny model, on any device")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--completion-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        console.print("gpu_check: torch sees no CUDA device; --tiny runs the tiny form here")
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    shapes = [TINY] if args.tiny else [QWEN2_0_5B, QWEN2_7B]
    if args.tiny:
        args.rows, args.prompt_tokens, args.completion_tokens, args.repeats = 4, 24, 8, 1
    rows: list[Row] = []
    sizes = (args.rows, args.prompt_tokens, args.completion_tokens)
    for shape in shapes:
        rows += recorded(
            shape, "trainer arms", functools.partial(check, shape, device, *sizes, args.repeats)
        )
    rows += recorded(
        shapes[0],
        "sidecar",
        lambda: [sidecar_check(shapes[0], device, *sizes, capped=not args.tiny)],
    )
    ok = report(rows)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    console.print(
        f"gpu_check on {name}: every step applied and within 1.25x of the arithmetic: "
        f"{'PASS' if ok else 'FAIL'}",
        soft_wrap=True,  # the verdict is one line, whatever the terminal's width
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
