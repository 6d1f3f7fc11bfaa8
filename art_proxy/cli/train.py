"""`art-proxy train`: the trainer (art_proxy_trainer), one process or one rank of several."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys

import typer
from rich.console import Console

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import configure_logging, fail
from art_proxy.config import TrainSettings
from art_proxy.errors import ConfigError, StoreError
from art_proxy.local import INSTALL_LOCAL, LOCAL_PACKAGES


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "train",
        TrainSettings,
        "Train a LoRA adapter with GRPO on scored groups and hot-swap it in; with --agent and "
        "--scenarios, run the whole loop (rollouts, rewards, training, swap).",
    )(train)


# The trainer is its own distribution in the repository (trainer/, `art-proxy-trainer`), kept
# apart so that the proxy installs without torch; it is on no package index.
INSTALL_TRAINER = "pip install -e ./trainer from a checkout of art-proxy (make setup does)"


def trainer_missing(exc: ImportError) -> str:
    """What `art-proxy train` says when its imports fail: the trainer itself, or what it needs."""
    if importlib.util.find_spec("art_proxy_trainer") is None:
        return f"art-proxy train needs the trainer (art-proxy-trainer): {INSTALL_TRAINER}"
    if exc.name in LOCAL_PACKAGES:
        return f"art-proxy train needs {exc.name} (the [local] extra): {INSTALL_LOCAL}"
    return f"art-proxy train cannot import {exc.name or 'the trainer'}: {exc}"


def train(settings: TrainSettings) -> None:
    try:
        from art_proxy_trainer.command import run_follower, run_train
        from art_proxy_trainer.distributed import Ranks, exit_rank
        from art_proxy_trainer.errors import TrainerError
        from art_proxy_trainer.launch import launch_ranks
    except ImportError as exc:
        fail(trainer_missing(exc))
    from art_proxy.local.errors import ModelLoadError
    from art_proxy.ruler.errors import RubricError

    configure_logging()
    ranks = Ranks.of_environment()
    try:
        if ranks is None and settings.nproc > 1:
            launch_ranks(settings.nproc, sys.argv[1:])  # each rank runs this same command
            return
        if ranks is not None and not ranks.leads:
            # Rank 0 says when to stop (Ctrl-C reaches every rank of the terminal's group).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            run_follower(settings, ranks)
            exit_rank()
        console = Console()
        summary = asyncio.run(run_train(settings, console))
    except (TrainerError, ModelLoadError, RubricError, ConfigError, StoreError, OSError) as exc:
        fail(str(exc) if ranks is None else f"rank {ranks.rank}: {exc}")
    except RuntimeError as exc:  # torch.distributed's errors: a rank or the network is gone
        if ranks is None:
            raise
        fail(f"rank {ranks.rank}: {exc}")
    console.print(summary.table())
    if ranks is not None:
        exit_rank()
