"""The test run on pytest-xdist workers (`make test`: `-n 2`): what the workers share and which
tests must share a worker.

The controller makes one folder for the run and hands it to every worker (`workerinput`); the real
vLLM server's files live there (tests/real_vllm.py). A worker's ports, tmp_path and PostgreSQL
databases are its own already.

Tests marked `xdist_group(NAME)` run on one worker, one after another: real vLLM's (they load
adapters, read the server's model list and compare its logprobs with the trainer's to 1e-3; spread
over two workers, three of those comparisons failed by up to 3.4 nats, each passing alone), a
module whose fixture runs an example once, and tests that share one torchrun launch. xdist's
own `--dist loadgroup` renames a grouped test's node id through an attribute pytest 9 no longer
reads, so its groups fall apart; here each worker writes the groups it collected to the shared
folder before it reports its collection, and the controller's scheduler reads them from there.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

_SHARED_DIR = pytest.StashKey[Path]()
_WORKER_SHARED_DIR = "art_proxy_shared_dir"  # the key in xdist's workerinput
GROUPS_FILE = "xdist-groups.json"  # node id -> group, for the grouped tests


def run_shared_dir(config: pytest.Config) -> Path:
    """The controller's folder for the run (made when the first worker is configured)."""
    if _SHARED_DIR not in config.stash:
        config.stash[_SHARED_DIR] = Path(tempfile.mkdtemp(prefix="art-proxy-tests-"))
    return config.stash[_SHARED_DIR]


def hand_to_worker(workerinput: dict[str, object], config: pytest.Config) -> None:
    workerinput[_WORKER_SHARED_DIR] = str(run_shared_dir(config))


def worker_shared_dir(config: pytest.Config) -> Path | None:
    """On a worker, the run's folder; None when the tests run in one process."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else Path(workerinput[_WORKER_SHARED_DIR])


def publish_groups(shared: Path, items: list[pytest.Item]) -> None:
    """Write each grouped test's group (every worker collects the same tests, so writes the
    same file: each replaces it whole)."""
    groups = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is not None:
            groups[item.nodeid] = str(marker.args[0])
    staging = Path(tempfile.mkstemp(dir=shared, prefix=f".{GROUPS_FILE}-")[1])
    staging.write_text(json.dumps(groups))
    staging.replace(shared / GROUPS_FILE)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's load scheduling, each test a unit of its own except the grouped ones, whose
    group is one unit. xdist sends the largest unit first (`--loadscope-reorder`), so the real
    vLLM tests start on one worker while the other takes the rest; a group in `held_until` waits
    in the queue, the other units going first, until its predicate says its server answers (so
    no worker sits out the server's start in its first test), or until nothing else is left."""

    def __init__(
        self,
        config: pytest.Config,
        log: object = None,
        held_until: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        super().__init__(config, log)
        self._groups_file = run_shared_dir(config) / GROUPS_FILE
        self._groups: dict[str, str] | None = None
        self._held_until = dict(held_until or {})

    def _assign_work_unit(self, node: object) -> None:
        first = next(iter(self.workqueue))
        ready = self._held_until.get(first)
        if ready is not None and len(self.workqueue) > 1 and not ready():
            # The next unit goes now; the held group stays first in the queue.
            held = self.workqueue.pop(first)
            super()._assign_work_unit(node)
            self.workqueue[first] = held
            self.workqueue.move_to_end(first, last=False)
            return
        self._held_until.pop(first, None)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        # Asked first once every worker has reported its collection, after each wrote the file.
        if self._groups is None:
            path = self._groups_file
            self._groups = json.loads(path.read_text()) if path.exists() else {}
        return self._groups.get(nodeid, nodeid)
