"""Train on an art-proxy export with TRL: each group's best trajectory, on its exact tokens.

    .venv/bin/art-proxy export --store sqlite:///art.db --format parquet --out calls.parquet
    .venv/bin/python -m examples.trl_export.train --data calls.parquet --out trl-out

Rejection sampling (best-of-n fine-tuning): of each `train` group whose rewards differ, the calls
of its best trajectory become supervised data, everything else is left out. A trajectory's reward
is its judged one (RULER's) where the group was judged, else the one the agent or a user gave.
Each row is `prompt_token_ids + completion_token_ids` as the upstream sampled them: TRL trains on
the tokens the model saw, with no chat template rendered again, and `completion_mask` keeps the
loss on the sampled tokens. TRL's `SFTTrainer` trains a LoRA adapter (peft) that vLLM or
`art-proxy local-llm` can serve. The model must be the one that sampled the export (its
tokenizer's ids); without `--model`, the bundled SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets


@dataclass(frozen=True)
class Trained:
    rows: int  # supervised rows (calls of the groups' best trajectories)
    groups: int  # groups that had a best trajectory
    loss: float  # the last logged training loss
    adapter: Path


def best_of_groups(calls: datasets.Dataset) -> tuple[datasets.Dataset, int]:
    """`input_ids` and `completion_mask` of every trainable call of each train group's best
    trajectories (ties at the top all kept; a group whose rewards are all equal gives none), and
    how many groups gave some."""
    rewards: dict[str, dict[str, float]] = defaultdict(dict)
    for row in calls:
        reward = row["judged_reward"] if row["judged_reward"] is not None else row["reward"]
        if row["split"] == "train" and reward is not None:
            rewards[row["group_id"]][row["trajectory_id"]] = reward
    best: set[str] = set()
    groups = 0
    for members in rewards.values():
        top, bottom = max(members.values()), min(members.values())
        if top > bottom:
            groups += 1
            best |= {trajectory for trajectory, reward in members.items() if reward == top}
    kept = calls.filter(
        lambda row: row["trajectory_id"] in best and row["trainable"] and row["split"] == "train"
    )
    return kept.map(_tokens, remove_columns=kept.column_names), groups


def _tokens(row: dict[str, Any]) -> dict[str, list[int]]:
    prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
    return {
        "input_ids": prompt + completion,
        "completion_mask": [0] * len(prompt) + [1] * len(completion),
    }


def train(
    data: Path,
    out: Path,
    *,
    model: str | None = None,
    steps: int = 20,
    learning_rate: float = 1e-4,
) -> Trained:
    """Fine-tune a LoRA adapter on `data`'s best trajectories (see the module); saved in `out`."""
    from peft import LoraConfig
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from art_proxy.local.model_loading import model_files

    calls = datasets.load_dataset("parquet", data_files=str(data), split="train")
    rows, groups = best_of_groups(calls)
    if len(rows) == 0:
        raise SystemExit(f"{data}: no train group has trajectories with different rewards")
    config = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=learning_rate,
        completion_only_loss=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=str(model_files(model).directory),
        args=config,
        train_dataset=rows,
        peft_config=LoraConfig(
            r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
    )
    trainer.train()
    adapter = out / "adapter"
    trainer.save_model(str(adapter))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return Trained(len(rows), groups, losses[-1] if losses else math.nan, adapter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="an `export --format parquet` file"
    )
    parser.add_argument("--out", type=Path, required=True, help="where the adapter is saved")
    parser.add_argument(
        "--model", help="the model that sampled the export (default: the bundled one)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (write one with `art-proxy export`)")
    _quiet_libraries()
    done = train(
        args.data, args.out, model=args.model, steps=args.steps, learning_rate=args.learning_rate
    )
    print(
        f"{done.rows} calls of the best trajectories of {done.groups} groups, {args.steps} steps: "
        f"last loss {done.loss:.3f}; adapter in {done.adapter}"
    )


def _quiet_libraries() -> None:
    """The step lines TRL logs stay; the libraries' deprecation notices and per-map progress
    bars say nothing to someone training."""
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)
    datasets.disable_progress_bars()
    # transformers leaves both unannotated.
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
