"""`--report-to`: each step's metrics reach W&B (offline) and MLflow (a local SQLite store) under
their own names and step numbers, with the run's settings and none of its secrets; nothing leaves
the machine."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from prometheus_client.parser import text_string_to_metric_families
from wandb.proto import wandb_internal_pb2

from art_proxy.config import TrainSettings
from art_proxy.records import TrainingStep
from art_proxy.store.trajectory_store import utcnow
from art_proxy_trainer.metrics import MetricsSink

SECRETS = ("sk-upstream-secret", "admin-secret", "db-password")


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline W&B run file (a LevelDB-style log of protobuf records)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        room = block - position % block
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if room < 7 or (length == 0 and kind == 0):
            position += room  # a block's padding
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last piece
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated per protobuf version
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_steps_reach_wandb_offline_and_mlflow_without_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "tool-agent")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    settings = TrainSettings.model_validate(
        {
            "store": "postgresql+asyncpg://art:db-password@127.0.0.1:5432/test",
            "upstream": ["http://127.0.0.1:8000/v1"],
            "upstream_api_key": "sk-upstream-secret",
            "admin_key": "admin-secret",
            "out": str(tmp_path / "run"),
            "report_to": ["wandb,mlflow", "wandb"],
            "learning_rate": 3e-4,
        }
    )
    assert settings.report_to == ["wandb", "mlflow"]
    out = tmp_path / "run"
    with MetricsSink(out, settings) as sink:
        for step, loss in ((1, 0.9), (2, 0.4)):
            metrics = {"loss": loss, "agent/used_tools": step / 4}
            sink.write(
                TrainingStep(
                    run="run", step=step, status="applied", metrics=metrics, created_at=utcnow()
                )
            )

    [run_file] = (out / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(run_file))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "run" and run.project == "tool-agent"
    history = [
        {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["_step"], float(h["loss"]), float(h["agent/used_tools"])) for h in history] == [
        ("1", 0.9, 0.25),
        ("2", 0.4, 0.5),
    ]
    config = {item.key: item.value_json for item in run.config.update}
    assert "0.0003" in config["learning_rate"]
    assert not any(secret in run_file.read_bytes().decode("latin-1") for secret in SECRETS)

    client = MlflowClient()
    experiment = client.get_experiment_by_name("art-proxy")
    assert experiment is not None
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    losses = client.get_metric_history(found.info.run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(1, 0.9), (2, 0.4)]
    assert client.get_metric_history(found.info.run_id, "agent/used_tools")[-1].value == 0.5
    params = found.data.params
    assert params["learning_rate"] == "0.0003" and "admin_key" not in params
    assert not any(secret in value for value in params.values() for secret in SECRETS)


def test_the_latest_step_is_a_prometheus_textfile(tmp_path: Path) -> None:
    with MetricsSink(tmp_path) as sink:
        for step, swap in ((1, "swapped"), (2, "rejected")):
            sink.write(
                TrainingStep(
                    run="run",
                    step=step,
                    status="applied",
                    swap=swap,
                    metrics={
                        "reward_mean": step / 4,
                        "seconds_train": 1.5,
                        "agent/tool_calls": 2.0,
                    },
                    created_at=utcnow(),
                )
            )
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(sink.prometheus_path.read_text())
        for sample in family.samples
    }
    run = (("run", "run"),)
    assert samples[("art_proxy_trainer_step", run)] == 2
    # One name per quantity, its unit last, each labelled with the run.
    assert samples[("art_proxy_trainer_step_reward_mean", run)] == 0.5
    assert samples[("art_proxy_trainer_step_train_seconds", run)] == 1.5
    assert samples[("art_proxy_trainer_step_agent_tool_calls", run)] == 2.0
    assert samples[("art_proxy_trainer_steps_total", (*run, ("status", "applied")))] == 2
    assert samples[("art_proxy_trainer_swaps_total", (*run, ("swap", "swapped")))] == 1
    assert samples[("art_proxy_trainer_swaps_total", (*run, ("swap", "rejected")))] == 1
    last_swap = samples[("art_proxy_trainer_last_swap_timestamp_seconds", run)]
    assert 0 < last_swap <= samples[("art_proxy_trainer_last_step_timestamp_seconds", run)]


def test_an_unknown_tracker_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="'neptune' is not one of tensorboard, wandb, mlflow"):
        TrainSettings.model_validate({"store": "sqlite:///x.db", "report_to": ["neptune"]})


def test_steps_reach_tensorboard_event_files(tmp_path: Path) -> None:
    """`--report-to tensorboard` (its package comes with the trackers extra): TensorBoard reads
    each step's metrics back under their names and step numbers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = TrainSettings.model_validate(
        {"out": str(tmp_path / "run"), "report_to": ["tensorboard"]}
    )
    out = tmp_path / "run"
    with MetricsSink(out, settings) as sink:
        for step, loss in ((1, 0.9), (2, 0.4)):
            sink.write(
                TrainingStep(
                    run="run",
                    step=step,
                    status="applied",
                    metrics={"loss": loss},
                    created_at=utcnow(),
                )
            )
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("loss")] == [(1, 0.9), (2, 0.4)]
