"""The policy being trained: the upstream's base model with a LoRA adapter, and its optimiser.

The base is loaded exactly as the local server loads it (same GGUF conversion, float32), so the
logprobs the trainer computes are those of the model that sampled the tokens, up to float noise.
What a checkpoint holds of it (`PolicyState`) is whole, in one process's form, however many ranks
hold the policy and however they split it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from peft import PeftModel

from art_proxy.config import TrainerConfig
from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import load_model, weights_dtype
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.errors import TrainerError
from art_proxy_trainer.grammar import GrammarReplay
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.step import train_step
from art_proxy_trainer.step_result import StepResult


@dataclass(frozen=True)
class PolicyState:
    """The trained part of the policy: the adapter's weights by parameter name, and the
    optimiser's state in torch's own format (parameters by position)."""

    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


def trained_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The adapter's parameters, in the order the optimiser holds them."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


class Leader(Protocol):
    """Rank 0 of several (distributed.py's `Leader`): each call runs on every rank in step."""

    def train(
        self, batch: TrainingBatch, config: TrainerConfig, fresh_optimizer: bool = False
    ) -> StepResult: ...

    def gather(self) -> PolicyState: ...

    def load(self, state: PolicyState) -> None: ...

    def close(self) -> None: ...  # the other ranks stop


@dataclass
class Policy:
    model: PeftModel
    optimizer: torch.optim.AdamW
    pad_token_id: int
    served_name: str  # the name the local server would serve it as
    names: set[str]  # every name an upstream may list it under (served name, source path)
    leader: Leader | None = None  # rank 0 of several: the other ranks train in step with it
    # The micro-batch size the last step fit in (None: none yet, the configured one).
    micro_batch_tokens: int | None = None
    # Replays the grammars of calls vLLM constrained (None: such calls are not trained).
    grammars: GrammarReplay | None = None
    # A token id's text, as the tokenizer decodes it alone (None: no tokenizer; ids shown).
    token_text: Callable[[int], str] | None = None
    # Renders a demonstration as the local server renders a conversation (None: no warm start).
    renderer: ChatRenderer | None = None
    end_of_turn: int = 0  # the token the model ends its turn with

    def train(
        self, batch: TrainingBatch, config: TrainerConfig, *, fresh_optimizer: bool = False
    ) -> StepResult:
        """One training step on `batch`, on every rank when there are several
        (`fresh_optimizer`: from a cleared optimiser state, step.train_step)."""
        if self.leader is not None:
            return self.leader.train(batch, config, fresh_optimizer)
        result = train_step(
            self.model,
            self.optimizer,
            batch,
            config,
            micro_batch_tokens=self.micro_batch_tokens,
            fresh_optimizer=fresh_optimizer,
        )
        if result.applied or result.reason != "out_of_memory":
            self.micro_batch_tokens = result.micro_batch_tokens
        return result

    def state(self) -> PolicyState:
        """The adapter and optimiser state, whole (gathered from every rank's shard)."""
        if self.leader is not None:
            return self.leader.gather()
        return self.state_here()

    def state_here(self) -> PolicyState:
        """The adapter and optimiser state this process holds."""
        return PolicyState(
            {name: p.detach() for name, p in trained_parameters(self.model)},
            self.optimizer.state_dict(),
        )

    def load(self, state: PolicyState) -> None:
        """Continue from `state` (a checkpoint's), on every rank when there are several."""
        if self.leader is not None:
            self.leader.load(state)
            return
        load_into(self.model, self.optimizer, state)


def training_device(setting: str, config: TrainerConfig, local_rank: int = 0) -> torch.device:
    """Where this process trains: `auto` takes its CUDA device when torch sees one."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        if config.base_dtype == "bfloat16":
            raise TrainerError(
                "--base-dtype bfloat16 is for CUDA devices: on a CPU the trainer runs in float32"
            )
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainerError("--device cuda: torch sees no CUDA device (a CPU build of torch?)")
    if local_rank >= torch.cuda.device_count():
        raise TrainerError(
            f"rank {local_rank} of this machine has no GPU of its own: torch sees "
            f"{torch.cuda.device_count()} (--nproc at most that many, or --device cpu)"
        )
    return torch.device("cuda", local_rank)


def load_into(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: PolicyState) -> None:
    unexpected = model.load_state_dict(state.adapter, strict=False).unexpected_keys
    if unexpected:
        raise KeyError(f"the checkpoint has parameters this model lacks: {unexpected[:3]}")
    optimizer.load_state_dict(state.optimizer)


def base_dtype(config: TrainerConfig, device: torch.device) -> torch.dtype:
    """The frozen base's dtype on `device` (`auto`: bfloat16 on CUDA, float32 elsewhere)."""
    return weights_dtype(config.base_dtype, device)


def load_policy(
    model: str | None,
    config: TrainerConfig,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> Policy:
    """The base in `dtype` with a float32 LoRA adapter (peft keeps an adapter's weights in
    float32 over a bfloat16 base). Raises art_proxy.local.errors.ModelLoadError when the model
    cannot be loaded."""
    torch.manual_seed(seed)
    loaded = load_model(model, dtype=dtype)
    peft_model = lora_model(loaded.model, config)
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = getattr(loaded.model.generation_config, "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    # An instruct tokenizer's EOS is its end of turn (SmolLM2's <|im_end|>, which it stops on).
    end_of_turn = next(
        (e for e in (tokenizer.eos_token_id, *eos_ids) if isinstance(e, int)), pad or 0
    )
    return Policy(
        peft_model,
        make_optimizer(peft_model, config),
        int(pad or 0),
        loaded.default_name,
        {loaded.default_name, loaded.source},
        grammars=GrammarReplay(tokenizer, loaded.model.config.vocab_size, eos_ids),
        renderer=ChatRenderer(tokenizer),
        end_of_turn=int(end_of_turn),
        token_text=lambda token_id: str(tokenizer.decode([token_id])),
    )
