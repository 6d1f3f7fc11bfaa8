"""The trainer on several ranks: torch.distributed, rank 0 deciding, the others following.

Rank 0 is the trainer as it is in one process: it reads groups, writes step records, checkpoints
and swaps. Every rank holds the policy, whole (DDP: the adapter's gradients are averaged across
ranks) or a shard of it (FSDP2's `fully_shard`, for a base that does not fit one device: each
rank keeps 1/N of every weight and gathers a layer's just for its forward and backward). Each step
rank 0 hands the whole batch to the others (`Leader.train`); every rank trains its token-balanced
share of the sequences, the gradients are averaged in the last backward, and the loss is the token
mean over the whole batch, as one process computes it. So exactly-once consumption and
kill-and-resume are the one-process trainer's: nothing but rank 0 touches the store or the
checkpoints; a checkpoint is gathered whole from the shards, in one process's form, and a resumed
rank 0 hands its state to the others.

Every collective has a timeout (`--collective-timeout`): rank 0 sends a heartbeat while it waits
for groups, so a follower that hears nothing for that long knows rank 0 is gone, and rank 0 learns
of a dead follower at its next heartbeat. The launcher (launch.py) then stops every rank.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from art_proxy.config import TrainerConfig
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.lora import decoder_layers, make_optimizer
from art_proxy_trainer.memory import micro_batches
from art_proxy_trainer.policy import Policy, PolicyState, load_into, trained_parameters
from art_proxy_trainer.step import Lockstep, train_step
from art_proxy_trainer.step_result import StepResult

Sharding = Literal["ddp", "fsdp"]

log = logging.getLogger(__name__)

# A heartbeat this often, in parts of the collective timeout, keeps idle followers listening.
_HEARTBEATS_PER_TIMEOUT = 4


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks the launcher started (torchrun's variables)."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def of_environment(cls) -> Ranks | None:
        """None in a process no launcher started, or the only one it started."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        return cls(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def leads(self) -> bool:
        return self.rank == 0


def join(ranks: Ranks, timeout_s: float, device: torch.device) -> None:
    """Join the process group: NCCL between GPUs, gloo between CPU processes."""
    backend = "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def leave() -> None:
    """Leave the process group. On a clean exit (no exception on its way out of the caller's
    `finally`) every rank first waits for the others: a rank that tore down its connections
    while a peer was still finishing made that peer's gloo abort the process ("terminate called
    without an active exception", seen once in CI on 3 CPU ranks)."""
    if not dist.is_initialized():
        return
    if sys.exc_info()[0] is None:
        with contextlib.suppress(Exception):  # a peer already gone: leave all the same
            dist.barrier()
    dist.destroy_process_group()


def exit_rank() -> NoReturn:
    """End a rank that finished cleanly without the interpreter's finalization: the streams and
    the log flushed, then `os._exit(0)`. A rank that had finished was seen aborting at exit
    ("terminate called without an active exception", SIGABRT; in CI, on a restarted FSDP rank
    and on 3 CPU ranks): most likely gloo's worker threads destroyed by finalization, with what
    torch still holds of the process group past `destroy_process_group` (FSDP's device meshes,
    for one). A rank has written everything it keeps before this point."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def shares(batch: TrainingBatch, world_size: int) -> list[list[int]]:
    """Each rank's rows, balanced by tokens: the longest row first to the least loaded rank.

    Deterministic, so every rank computes every rank's share from the same batch."""
    lengths = batch.attention_mask_B_T.sum(dim=1).tolist()
    loads = [(0, rank) for rank in range(world_size)]
    rows: list[list[int]] = [[] for _ in range(world_size)]
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        load, rank = heapq.heappop(loads)
        rows[rank].append(row)
        heapq.heappush(loads, (load + int(lengths[row]), rank))
    return [sorted(share) for share in rows]


class Replica:
    """This rank's copy or shard of the policy, and what the ranks do to it together."""

    def __init__(
        self,
        policy: Policy,
        ranks: Ranks,
        sharding: Sharding,
        config: TrainerConfig,
        device: torch.device,
    ) -> None:
        self.policy = policy
        self.ranks = ranks
        self.sharding = sharding
        self.device = device
        model = policy.model
        self.forward: torch.nn.Module
        if sharding == "fsdp":
            mesh = init_device_mesh(device.type, (ranks.world_size,))
            # A shard per decoder layer (the modules transformers keeps whole), then the rest.
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            # The parameters are shards now: the optimiser must hold those.
            policy.optimizer = make_optimizer(model, config)
            self.forward = model
        else:
            device_ids = [device.index] if device.type == "cuda" else None
            # Buffers are never trained (rotary tables): synchronising them each forward is waste.
            self.forward = DistributedDataParallel(
                model, device_ids=device_ids, forward_sync_buffers=False
            )

    def train(
        self, batch: TrainingBatch, config: TrainerConfig, fresh_optimizer: bool = False
    ) -> StepResult:
        batch = batch.to(self.device)
        rows = shares(batch, self.ranks.world_size)[self.ranks.rank]
        mine = batch.take(rows)
        passes = torch.tensor(
            [len(micro_batches(mine, config.micro_batch_tokens)) if rows else 0],
            device=self.device,  # NCCL reduces CUDA tensors only
        )
        dist.all_reduce(passes, op=dist.ReduceOp.MAX)
        lockstep = Lockstep(
            forward=self.forward,
            total_tokens=batch.trained_tokens,
            passes=max(int(passes), 1),
            filler=batch.take([0]),
            syncing=self._syncing,
            summed=functools.partial(_summed, device=self.device),
            world_size=self.ranks.world_size,
        )
        return train_step(
            self.policy.model,
            self.policy.optimizer,
            mine,
            config,
            lockstep,
            fresh_optimizer=fresh_optimizer,
        )

    def gather(self) -> PolicyState | None:
        """The whole adapter and optimiser state, on rank 0 (None elsewhere)."""
        model, optimizer = self.policy.model, self.policy.optimizer
        if self.sharding == "ddp":  # every rank holds it whole already
            return self.policy.state_here() if self.ranks.leads else None
        adapter = {name: _full(p).detach() for name, p in trained_parameters(model)}
        # Before the first applied step (the same on every rank) there is no state, and torch's
        # getter would make one by an empty Adam step, counting a step never taken.
        stepped = bool(optimizer.state)
        if stepped:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            by_name = get_optimizer_state_dict(model, optimizer, options=options)  # rank 0's
        if not self.ranks.leads:
            return None
        optimizer_state = _by_position(by_name, model) if stepped else optimizer.state_dict()
        return PolicyState(adapter, optimizer_state)

    def load(self, state: PolicyState | None) -> None:
        """Every rank continues from rank 0's `state` (the others pass None)."""
        model, optimizer = self.policy.model, self.policy.optimizer
        if self.sharding == "ddp":
            received = [state]
            dist.broadcast_object_list(received, src=0)
            assert received[0] is not None
            load_into(model, optimizer, received[0])
            return
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        adapter: dict[str, Any] = dict(state.adapter) if state is not None else {}
        set_model_state_dict(model, adapter, options=options)
        # An optimiser that never stepped has no state to load (and torch's setter would make
        # one by an empty Adam step): every rank must hear which it is.
        stepped = [state is not None and bool(state.optimizer["state"])]
        dist.broadcast_object_list(stepped, src=0)
        if stepped[0]:
            by_name = _by_name(state.optimizer, model) if state is not None else {}
            set_optimizer_state_dict(model, optimizer, by_name, options=options)

    def close(self) -> None:
        """Drop the DDP wrapper while the process group lives: its teardown may use the group,
        and a wrapper outliving it can hang the process at exit."""
        self.forward = self.policy.model

    @contextlib.contextmanager
    def _syncing(self, sync: bool) -> Iterator[None]:
        if isinstance(self.forward, FSDPModule):
            self.forward.set_requires_gradient_sync(sync)
            yield
        elif isinstance(self.forward, DistributedDataParallel):
            with contextlib.nullcontext() if sync else self.forward.no_sync():
                yield


def _full(parameter: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(parameter, "full_tensor", None)  # a DTensor shard: every rank joins
    return full_tensor() if full_tensor is not None else parameter


def _by_position(by_name: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """torch.distributed's optimiser state (parameters by name) in torch's own form."""
    position = {name: index for index, (name, _) in enumerate(trained_parameters(model))}
    return {
        "state": {position[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]}
            for group in by_name["param_groups"]
        ],
    }


def _by_name(by_position: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    names = [name for name, _ in trained_parameters(model)]
    return {
        "state": {names[index]: value for index, value in by_position["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in by_position["param_groups"]
        ],
    }


def _summed(values: list[float], device: torch.device) -> list[float]:
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return [float(value) for value in summed.tolist()]


class Leader:
    """Rank 0's side: what it tells the followers, in the one order every rank keeps."""

    def __init__(self, replica: Replica, timeout_s: float) -> None:
        self.replica = replica
        self._lock = threading.Lock()  # one collective sequence at a time
        self._last_sent = time.monotonic()
        self._interval = timeout_s / _HEARTBEATS_PER_TIMEOUT
        self._closed = threading.Event()
        # Set when rank 0 failed inside a collective: the followers are still in it, so a
        # "stop" would meet the wrong collective. Rank 0 exits instead and the launcher stops them.
        self._broken = False
        self._heartbeat = threading.Thread(target=self._beat, name="rank0-heartbeat", daemon=True)
        self._heartbeat.start()

    def train(
        self, batch: TrainingBatch, config: TrainerConfig, fresh_optimizer: bool = False
    ) -> StepResult:
        with self._collective():
            self._tell(("train", batch, config, fresh_optimizer))
            return self.replica.train(batch, config, fresh_optimizer)

    def gather(self) -> PolicyState:
        with self._collective():
            self._tell(("gather",))
            gathered = self.replica.gather()
        assert gathered is not None
        return gathered

    def load(self, state: PolicyState) -> None:
        with self._collective():
            self._tell(("load",))
            self.replica.load(state)

    def close(self) -> None:
        self._closed.set()
        try:
            with self._lock:
                if not self._broken:
                    self._tell(("stop",))
            self._heartbeat.join()
        finally:
            self.replica.close()

    @contextlib.contextmanager
    def _collective(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except BaseException:
                self._broken = True
                raise

    def _tell(self, command: tuple[Any, ...]) -> None:
        dist.broadcast_object_list([command], src=0)
        self._last_sent = time.monotonic()

    def _beat(self) -> None:
        while not self._closed.wait(self._interval / 2):
            with self._lock:
                if self._closed.is_set() or self._broken:
                    return
                if time.monotonic() - self._last_sent >= self._interval:
                    try:
                        self._tell(("wait",))
                    except RuntimeError as exc:  # a follower is gone: the launcher stops us all
                        log.error("rank 0 lost a follower: %s", exc)
                        self._broken = True
                        return


def follow(replica: Replica) -> None:
    """A follower's life: do what rank 0 says until it says stop."""
    while True:
        received: list[Any] = [None]
        dist.broadcast_object_list(received, src=0)
        command = received[0]
        if command[0] == "train":
            replica.train(command[1], command[2], command[3])
        elif command[0] == "gather":
            replica.gather()
        elif command[0] == "load":
            replica.load(None)
        elif command[0] == "stop":
            return
