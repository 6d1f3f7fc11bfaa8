"""The whole loop on one device: local-llm sampling in bf16, the proxy recording, the trainer
stepping beside it, each adapter swapped back into the engine.

A model is built from a config with random weights (gpu_check's Qwen2-style builder, SmolLM2-135M's
shape; `--tiny`: 2 layers of width 64) and the bundled SmolLM2 tokenizer (or `--tokenizer DIR`), so nothing is
downloaded and the files that travel stay small. `art-proxy local-llm --device D --dtype bfloat16`
serves it, `art-proxy serve` records every call into SQLite, and `art-proxy train --agent` (run in
this process, `--device D`) trains the agent of `loop_check_agent.py` for `--steps` steps: two
tokens left to sample by the call's logit bias, rewarded by the share of one of them, which a model
with random weights learns in a few steps.

Per step it prints the reward, the importance ratio pi_trainer/pi_sampler of the sampled tokens at
the sampling weights (the engine samples in bf16, the trainer scores with its own numerics): its
mean without the correction (the weight an uncorrected loss takes as 1) and the mean weight the
trainer applies (truncated at --is-cap, the correction on), their tokens' mean |log ratio|, the
step's training and swap time, rollouts per second, and the peak memory of the engine's process
and the trainer's (on CUDA: the device memory each process holds, from nvidia-smi, and the
trainer's torch peak; on a CPU: each process's peak resident memory). The last line says whether
every step applied, no call failed while adapters were swapped in, and the reward rose.

    .venv/bin/python benchmarks/loop_check.py            # a CUDA machine: the 135M shape, bf16
    .venv/bin/python benchmarks/loop_check.py --tiny     # anywhere: the tiny form (make test)
    .venv/bin/python benchmarks/loop_check.py --save-tokenizer .gpu/tokenizer   # to carry it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, the repository root is not on the path

from art_proxy.testing.loopback import free_port, wait_healthy  # noqa: E402  # after the path
from art_proxy_trainer.memory import ModelShape  # noqa: E402
from benchmarks.gpu_check_build import build  # noqa: E402
from benchmarks.loop_check_agent import TOKENS_ENV  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

console = Console(width=max(Console().width, 140))  # the table whole, in a log too
SCENARIOS = ("Answer yes or no.", "Is it raining?", "Shall we go?", "Do you agree?")


@dataclass(frozen=True)
class LoopModel:
    shape: ModelShape  # its vocabulary: the bundled tokenizer's
    init_std: float  # the random weights' spread (larger: a tiny model can prefer tokens)


SMOLLM2_135M = LoopModel(ModelShape("SmolLM2-135M shape", 576, 1536, 30, 9, 3, 49152, True), 0.02)
TINY = LoopModel(ModelShape("tiny", 64, 128, 2, 4, 2, 49152, True), 0.1)


@dataclass
class PeakMemory:
    """The most memory each watched process held while the loop ran, polled in a thread."""

    engine_pid: int
    cuda: bool
    engine_mb: float = 0.0
    trainer_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> threading.Thread:
        thread = threading.Thread(target=self._poll, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            used = _cuda_process_mb() if self.cuda else {}
            engine = used.get(self.engine_pid, 0.0) if self.cuda else _peak_rss_mb(self.engine_pid)
            trainer = used.get(os.getpid(), 0.0) if self.cuda else _own_peak_rss_mb()
            self.engine_mb = max(self.engine_mb, engine)
            self.trainer_mb = max(self.trainer_mb, trainer)


def _cuda_process_mb() -> dict[int, float]:
    """Device memory per process, as nvidia-smi counts it (a process's whole share: its CUDA
    context, the caching allocator's reserve); empty where nvidia-smi is not there."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    used = {}
    for line in listing.splitlines():
        pid, _, megabytes = line.partition(",")
        if pid.strip().isdigit():
            used[int(pid)] = float(megabytes.strip() or 0)
    return used


def _peak_rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _own_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@dataclass(frozen=True)
class StepRow:
    step: int
    applied: bool
    reward: float
    ratio_uncorrected: float  # mean pi_trainer/pi_sampler, before any cap
    weight_corrected: float  # mean importance weight as applied (truncated at --is-cap)
    log_ratio: float  # mean |log pi_trainer - log pi_sampler|
    train_s: float
    swap_s: float | None  # None: nothing was swapped
    rollouts_per_s: float


def build_model(
    model: LoopModel, tokenizer_dir: Path, out: Path, seed: int
) -> PreTrainedTokenizerBase:
    """`model` with random weights (gpu_check's builder) and the tokenizer in `tokenizer_dir`,
    saved as a Hugging Face directory local-llm and the trainer load."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    if len(tokenizer) != model.shape.vocabulary:
        raise SystemExit(
            f"{tokenizer_dir}: {len(tokenizer)} tokens, the model has {model.shape.vocabulary}"
        )
    torch.manual_seed(seed)
    built = build(model.shape, torch.device("cpu"), init_std=model.init_std)
    for config in (built.config, built.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    built.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return tokenizer


def bundled_tokenizer(out: Path) -> Path:
    """The bundled SmolLM2's tokenizer saved alone in `out` (a few MB, where the model is not)."""
    from transformers import AutoTokenizer

    from art_proxy.local.model_loading import model_files

    AutoTokenizer.from_pretrained(
        model_files(None).directory, local_files_only=True
    ).save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.save_tokenizer:
        bundled_tokenizer(Path(args.save_tokenizer))
        console.print(f"tokenizer saved in {args.save_tokenizer}")
        return 0
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    import torch

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    model = TINY if args.tiny else SMOLLM2_135M
    work = Path(tempfile.mkdtemp(prefix="art-loop-check-"))
    started = time.monotonic()
    tokenizer = Path(args.tokenizer) if args.tokenizer else bundled_tokenizer(work / "tokenizer")
    built = build_model(model, tokenizer, work / "model", args.seed)
    yes, no = (built.encode(word)[0] for word in (" yes", " no"))
    os.environ[TOKENS_ENV] = f"{yes},{no}"
    (work / "scenarios.jsonl").write_text(
        "".join(json.dumps({"input": text}) + "\n" for text in SCENARIOS)
    )
    console.print(
        f"loop check on {device}: {model.shape.name} (random weights, built in "
        f"{time.monotonic() - started:.0f} s), local-llm in bf16, work in {work}"
    )
    llm_port, proxy_port = free_port(), free_port()
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    threads = ["--threads", str(args.threads)] if args.threads else []
    llm_argv = [art_proxy, "local-llm", "--model", str(work / "model")]
    llm_argv += ["--port", str(llm_port), *threads]
    llm_argv += ["--device", device, "--dtype", "bfloat16", "--max-model-len", "512"]
    store = f"sqlite:///{work / 'art.db'}"
    proxy_argv = [art_proxy, "serve", "--store", store, "--port", str(proxy_port)]
    proxy_argv += ["--upstream", f"http://127.0.0.1:{llm_port}/v1"]
    with (work / "local-llm.log").open("wb") as llm_log, (work / "serve.log").open("wb") as log:
        engine = subprocess.Popen(llm_argv, stdout=llm_log, stderr=subprocess.STDOUT)
        proxy = subprocess.Popen(proxy_argv, stdout=log, stderr=subprocess.STDOUT)
        peak = PeakMemory(engine.pid, cuda)
        try:
            ports = (llm_port, proxy_port)
            asyncio.run(_run(args, work, device, (engine, proxy), ports, peak, started))
        finally:
            for process in (proxy, engine):
                process.terminate()
            for process in (proxy, engine):
                process.wait(timeout=60)
    rows = _rows(work / "train" / "metrics.jsonl")
    failed_calls, rollout_errors = _failures(work / "art.db")
    console.print(_table(rows, model.shape.name, device))
    torch_peak = (
        f", its torch peak {torch.cuda.max_memory_allocated() / 2**20:,.0f} MB" if cuda else ""
    )
    what = "device memory (nvidia-smi)" if cuda else "peak resident memory"
    console.print(
        f"{what}: engine {peak.engine_mb:,.0f} MB, trainer {peak.trainer_mb:,.0f} MB{torch_peak}; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    applied = sum(row.applied for row in rows)
    first, last = (rows[0].reward, rows[-1].reward) if rows else (0.0, 0.0)
    rose = last > first
    passed = (
        applied == args.steps == len(rows) and failed_calls == 0 and rollout_errors == 0 and rose
    )
    console.print(
        f"loop check on {device.upper() if cuda else 'CPU'}: {applied}/{args.steps} steps applied, "
        f"{failed_calls} calls failed and {rollout_errors} rollouts with an error while "
        f"{sum(row.swap_s is not None for row in rows)} adapters were swapped in, reward "
        f"{first:.2f} -> {last:.2f}: {'PASS' if passed else 'FAIL'}",
        soft_wrap=True,
    )
    if passed:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


async def _run(
    args: argparse.Namespace,
    work: Path,
    device: str,
    processes: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]],
    ports: tuple[int, int],
    peak: PeakMemory,
    started: float,
) -> None:
    """Once local-llm and the proxy answer, the trainer's whole loop, memory watched."""
    import torch

    from art_proxy.config import TrainSettings
    from art_proxy_trainer.command import run_train

    (engine, proxy), (llm_port, proxy_port) = processes, ports
    await wait_healthy(f"http://127.0.0.1:{llm_port}/health", engine, timeout_s=600)
    await wait_healthy(f"http://127.0.0.1:{proxy_port}/health", proxy, timeout_s=120)
    console.print(f"local-llm and the proxy answer ({time.monotonic() - started:.0f} s)")
    peak.watch()
    if peak.cuda:
        torch.cuda.reset_peak_memory_stats()

    settings = TrainSettings.model_validate(
        {
            "store": f"sqlite:///{work / 'art.db'}",
            "proxy": f"http://127.0.0.1:{proxy_port}",
            "upstream": [f"http://127.0.0.1:{llm_port}/v1"],
            "model": str(work / "model"),
            "out": str(work / "train"),
            "agent": f"{Path(__file__).parent / 'loop_check_agent.py'}:rollout",
            "scenarios": str(work / "scenarios.jsonl"),
            "steps": args.steps,
            "group_size": args.group_size,
            "groups_per_step": 2,
            "concurrency": args.group_size * 2,
            "val_every": 0,
            "learning_rate": args.learning_rate,
            "device": device,
            "seed": args.seed,
            **({"threads": args.threads} if args.threads else {}),
        }
    )
    try:
        await run_train(settings, console)
    finally:
        peak.stop()


def _rows(metrics_file: Path) -> list[StepRow]:
    rows = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        metrics = record["metrics"]
        rollouts = metrics.get("rollouts", 0.0)
        rollout_s = metrics.get("seconds_rollouts", 0.0)
        rows.append(
            StepRow(
                step=record["step"],
                applied=record["status"] == "applied",
                reward=metrics.get("reward_mean", float("nan")),
                ratio_uncorrected=metrics.get("mean_ratio", float("nan")),
                weight_corrected=metrics.get("is_weight", float("nan")),
                log_ratio=metrics.get("mismatch", float("nan")),
                train_s=metrics.get("seconds_train", float("nan")),
                swap_s=metrics.get("seconds_swap"),
                rollouts_per_s=rollouts / rollout_s if rollout_s else float("nan"),
            )
        )
    return rows


def _failures(database: Path) -> tuple[int, int]:
    """Calls the proxy recorded as not answered, and rollouts that ended with an error."""
    with sqlite3.connect(database) as connection:
        failed = connection.execute("SELECT count(*) FROM calls WHERE status != 'ok'").fetchone()[0]
        errors = connection.execute(
            "SELECT count(*) FROM trajectories WHERE metadata LIKE '%rollout_error%'"
        ).fetchone()[0]
    return int(failed), int(errors)


def _table(rows: list[StepRow], model: str, device: str) -> Table:
    table = Table(title=f"the loop on {device}: {model}, sampled in bf16")
    for column in (
        "step",
        "applied",
        "reward",
        "ratio, uncorrected",
        "weight, corrected",
        "|log ratio|",
        "train s",
        "swap s",
        "rollouts/s",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row.step),
            "yes" if row.applied else "no",
            f"{row.reward:.3f}",
            f"{row.ratio_uncorrected:.4f}",
            f"{row.weight_corrected:.4f}",
            f"{row.log_ratio:.4f}",
            f"{row.train_s:.2f}",
            "-" if row.swap_s is None else f"{row.swap_s:.2f}",
            f"{row.rollouts_per_s:.1f}",
        )
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, for a CPU")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", help="a tokenizer directory (default: the bundled one)")
    parser.add_argument("--save-tokenizer", help="save the bundled tokenizer here and stop")
    return parser


if __name__ == "__main__":
    sys.exit(main())
