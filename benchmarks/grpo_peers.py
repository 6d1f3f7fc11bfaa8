"""The art-proxy stack's peers on its learning-curve task: a minimal in-process GRPO loop and TRL.

Both learn what `learning_curve.py` learns through the stack, with the same parts: the task of
`examples/single_word/` (its system prompt, scenarios and `rate`), the bundled SmolLM2-135M in
float32 on the CPU, LoRA r 8 / alpha 16 on every linear projection, AdamW (lr as given, no weight
decay, constant), the gradient norm clipped at 1, groups of `group_size` samples at temperature 1
with 8 new tokens, `groups_per_step` scenarios a step, advantages = reward - group mean (no std
scaling) and a token-mean loss. Neither has a proxy, a store, an HTTP hop, a swap or a second
process: the difference to the stack's time is what those cost.

- `in-process loop`: generate with `model.generate`, score, one gradient step, in one process
  (ratio 1 by construction: it trains at the weights it sampled with).
- `TRL GRPOTrainer`: TRL's own trainer (`pip install -e '.[peers]'`), generating with transformers.

Each reports per step the mean reward of its training samples and the seconds since it started
(model loading excluded, as the stack's figure starts when its trainer starts).
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from rich.console import Console

from art_proxy.local.model_loading import load_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "single_word"
SEED = 0


@dataclass
class PeerResult:
    name: str
    steps: list[tuple[float, float]] = field(default_factory=list)  # (mean reward, seconds)
    reached: tuple[int, float] | None = None  # (step, seconds) of the first mean >= target
    best: float = math.nan
    unavailable: str | None = None  # why it did not run

    def record(self, reward: float, seconds: float, target: float) -> None:
        self.steps.append((reward, seconds))
        self.best = max(reward, self.best) if not math.isnan(self.best) else reward
        if self.reached is None and reward >= target:
            self.reached = (len(self.steps), seconds)


def _task() -> tuple[str, list[str], Callable[[str | None, str], float]]:
    """The example's system prompt, questions and reward, loaded as the stack loads its agent."""
    spec = importlib.util.spec_from_file_location("single_word_agent", EXAMPLE / "agent.py")
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    lines = (EXAMPLE / "scenarios.jsonl").read_text().splitlines()
    questions = [str(json.loads(line)["input"]) for line in lines if line.strip()]
    return agent.SYSTEM, questions, agent.rate


def _lora() -> LoraConfig:
    return LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"
    )


@dataclass(frozen=True)
class PeerRun:
    """What each peer runs: the stack's own settings for the task."""

    steps: int
    group_size: int
    groups_per_step: int
    learning_rate: float
    target: float  # the mean training reward whose first step and seconds are the figure
    console: Console


def run_peers(run: PeerRun) -> list[PeerResult]:
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    results = [in_process_loop(run), trl_grpo(run)]
    for result in results:
        if result.unavailable:
            run.console.print(f"{result.name} left out: {result.unavailable}")
    return results


# ---------------------------------------------------------------- the in-process loop


def in_process_loop(run: PeerRun) -> PeerResult:
    result = PeerResult("in-process loop")
    system, questions, rate = _task()
    torch.manual_seed(SEED)
    order = random.Random(SEED).sample(questions, len(questions))
    loaded = load_model(None)
    tokenizer = loaded.tokenizer
    model = get_peft_model(loaded.model, _lora())
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=run.learning_rate, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    run.console.rule("in-process GRPO loop")
    started = time.monotonic()
    for step in range(1, run.steps + 1):
        sequences: list[tuple[list[int], list[int], float]] = []  # prompt, completion, advantage
        rewards: list[float] = []
        for g in range(run.groups_per_step):
            question = order[((step - 1) * run.groups_per_step + g) % len(order)]
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            prompt = list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
            completions = _sample(model, prompt, run.group_size, eos)
            group = [
                rate(str(tokenizer.decode(ids, skip_special_tokens=True)), finish)
                for ids, finish in completions
            ]
            mean = math.fsum(group) / len(group)
            sequences += [
                (prompt, ids, r - mean) for (ids, _), r in zip(completions, group, strict=True)
            ]
            rewards += group
        model.train()
        optimizer.zero_grad()
        _policy_gradient(model, [s for s in sequences if s[2] != 0], eos)
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        model.eval()
        mean_reward = math.fsum(rewards) / len(rewards)
        seconds = time.monotonic() - started
        result.record(mean_reward, seconds, run.target)
        run.console.print(f"  step {step}: reward {mean_reward:.3f}, {seconds:.0f} s")
    return result


def _policy_gradient(
    model: Any, sequences: list[tuple[list[int], list[int], float]], pad: int
) -> None:
    """Backpropagate the token-mean of -advantage x logprob over every completion token, in one
    right-padded batch (at the sampling weights the ratio is 1: this is GRPO's gradient there)."""
    if not sequences:
        return
    length = max(len(prompt) + len(ids) for prompt, ids, _ in sequences)
    rows = [
        prompt + ids + [pad] * (length - len(prompt) - len(ids)) for prompt, ids, _ in sequences
    ]
    mask_B_T = torch.tensor(
        [[1] * (len(p) + len(i)) + [0] * (length - len(p) - len(i)) for p, i, _ in sequences]
    )
    tokens_B_T = torch.tensor(rows)
    logits_B_T_V = model(input_ids=tokens_B_T, attention_mask=mask_B_T).logits[:, :-1].float()
    logprobs_B_T = (
        torch.log_softmax(logits_B_T_V, dim=-1).gather(-1, tokens_B_T[:, 1:, None]).squeeze(-1)
    )
    completion_B_T = torch.zeros_like(logprobs_B_T)
    advantages_B = torch.tensor([advantage for _, _, advantage in sequences])
    for row, (prompt, ids, _) in enumerate(sequences):
        completion_B_T[row, len(prompt) - 1 : len(prompt) - 1 + len(ids)] = 1
    loss = -(advantages_B[:, None] * logprobs_B_T * completion_B_T).sum() / completion_B_T.sum()
    torch.autograd.backward(loss)


def sample_with_logprobs(
    model: Any, prompt: list[int], n: int, eos: int
) -> list[tuple[list[int], list[float], str]]:
    """`n` completions of `prompt` at temperature 1, 8 new tokens, each cut after its EOS, with
    each token's logprob under the model that sampled it and the finish reason ("stop" or
    "length", as vLLM would say)."""
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt] * n),
            attention_mask=torch.ones(n, len(prompt), dtype=torch.long),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=8,
            pad_token_id=eos,
            output_scores=True,
            return_dict_in_generate=True,
        )
    logprobs_N_T = torch.stack(
        [torch.log_softmax(scores.float(), dim=-1) for scores in out.scores], dim=1
    )
    completions = []
    for row, ids in enumerate(out.sequences[:, len(prompt) :].tolist()):
        end = ids.index(eos) + 1 if eos in ids else len(ids)
        picked = [float(logprobs_N_T[row, t, ids[t]]) for t in range(end)]
        completions.append((ids[:end], picked, "stop" if eos in ids else "length"))
    return completions


def _sample(model: Any, prompt: list[int], n: int, eos: int) -> list[tuple[list[int], str]]:
    return [(ids, finish) for ids, _, finish in sample_with_logprobs(model, prompt, n, eos)]


# ---------------------------------------------------------------- TRL


def trl_grpo(run: PeerRun) -> PeerResult:
    result = PeerResult("TRL GRPOTrainer")
    try:
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer
    except ImportError as exc:
        result.unavailable = f"{exc.name} is not installed: .venv/bin/pip install -e '.[peers]'"
        return result
    system, questions, rate = _task()
    loaded = load_model(None)
    eos = loaded.tokenizer.eos_token_id
    max_new_tokens = 8

    def single_word(
        completions: list[Any], completion_ids: list[list[int]], **_: Any
    ) -> list[float | None]:
        rewards: list[float | None] = []
        for completion, ids in zip(completions, completion_ids, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            ended = len(ids) < max_new_tokens or (bool(ids) and ids[-1] == eos)
            rewards.append(rate(text, "stop" if ended else "length"))
        return rewards

    started: list[float] = []

    class Timing(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            started.append(time.monotonic())

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs")
            if logs and "reward" in logs:
                seconds = time.monotonic() - started[0]
                result.record(float(logs["reward"]), seconds, run.target)
                run.console.print(
                    f"  step {state.global_step}: reward {logs['reward']:.3f}, {seconds:.0f} s"
                )

    prompts = [
        [{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions
    ]
    batch = run.group_size * run.groups_per_step
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out:
        config = GRPOConfig(
            output_dir=out,
            learning_rate=run.learning_rate,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            num_generations=run.group_size,
            max_completion_length=max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            beta=0.0,
            scale_rewards="none",
            loss_type="dapo",  # the token mean over the batch
            max_steps=run.steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=SEED,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=loaded.model,
            reward_funcs=single_word,
            args=config,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=loaded.tokenizer,
            peft_config=_lora(),
            callbacks=[Timing()],
        )
        trainer.remove_callback(PrinterCallback)  # its dict per step; Timing prints the figures
        run.console.rule("TRL GRPOTrainer")
        trainer.train()
    return result
