"""`art-proxy train --nproc N`: the same command as N ranks, started by torch's elastic launcher.

The launcher is torchrun's own engine: it rendezvous the ranks on a free loopback port, gives each
its RANK, WORLD_SIZE and LOCAL_RANK, and when one rank fails it stops the others, so a dead rank
never leaves the rest hanging. Under torchrun (several machines) the ranks are started by torchrun
itself and this module is not involved.
"""

from __future__ import annotations

import logging
import sys
import uuid

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from art_proxy_trainer.errors import TrainerError

# How often the launcher looks at its ranks, in seconds: a dead one stops the rest this soon.
_MONITOR_INTERVAL_S = 0.5


def launch_ranks(nproc: int, argv: list[str]) -> None:
    """Run `art-proxy ARGV` as `nproc` ranks and wait; raises TrainerError naming a failed rank."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,  # a restart is the user's: it resumes from the last checkpoint
        monitor_interval=_MONITOR_INTERVAL_S,
    )
    # The launcher's own log lines (rendezvous, closing signals, the failure this function
    # reports in one line) are not for a user to read.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, sys.executable)("-m", "art_proxy.cli", *argv)
    except SignalException as exc:  # Ctrl-C or a kill: the launcher passed it to every rank
        raise TrainerError(
            f"interrupted ({exc.sigval.name}); the next start resumes from the last checkpoint"
        ) from exc
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        why = (
            f"killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exit code {failure.exitcode}"
        )
        raise TrainerError(
            f"rank {rank} of {nproc} failed ({why}); the run stopped, and the next start "
            "resumes from the last checkpoint"
        ) from exc
