"""An agent that is a command: `--agent 'exec:python my_agent.py'` runs it once a rollout, the way
a user runs their own script, unmodified but for the environment.

The scenario's input is the command's last argument (text as it is, anything else as JSON), and
the environment points every OpenAI-compatible SDK at the rollout's trajectory: `OPENAI_BASE_URL`
(its scenario, group, id and split in the path), `OPENAI_API_KEY`, `OPENAI_MODEL` and
`ART_MODEL` (the model to call: the alias the trainer moves), `ART_SCENARIO_ID`,
`ART_TRAJECTORY_ID`. The reward is what the command says on its own last line of output,
`reward: 0.8` (or `reward=0.8`); without one, the rollout has none (a judge scores it). A command
that exits non-zero failed: its error is its last line on standard error.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex

from art_proxy.errors import ConfigError
from art_proxy.rollout import Agent, Rollout, RolloutOutcome

PREFIX = "exec:"
_REWARD = re.compile(r"^\s*reward\s*[:=]\s*(\S+)\s*$", re.IGNORECASE)
_TAIL = 2000  # characters of output kept: the last line is what is read


def command_agent(spec: str) -> Agent:
    """The agent `exec:COMMAND` names; `ConfigError` for an empty command."""
    command = spec.removeprefix(PREFIX).strip()
    if not command:
        raise ConfigError(f"--agent {spec!r}: name the command after {PREFIX!r}")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"--agent {spec!r}: {exc}") from exc

    async def run(rollout: Rollout) -> RolloutOutcome:
        task = rollout.scenario.input
        argument = task if isinstance(task, str) else json.dumps(task)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": rollout.base_url,
            "OPENAI_API_KEY": rollout.api_key,
            "OPENAI_MODEL": rollout.model,
            "ART_MODEL": rollout.model,
            "ART_SCENARIO_ID": rollout.scenario.id,
            "ART_TRAJECTORY_ID": rollout.trajectory_id,
        }
        process = await asyncio.create_subprocess_exec(
            *argv,
            argument,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await process.communicate()
        except asyncio.CancelledError:  # the rollout's timeout, or the run stopping
            if process.returncode is None:
                process.kill()
                await process.wait()
            raise
        if process.returncode != 0:
            said = _last_line(err) or _last_line(out) or "no output"
            raise RuntimeError(f"{argv[0]} exited {process.returncode}: {said}")
        return RolloutOutcome(reward=_reward(_last_line(out)))

    return run


def _last_line(output: bytes) -> str:
    lines = output[-_TAIL:].decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""


def _reward(line: str) -> float | None:
    found = _REWARD.match(line)
    if found is None:
        return None
    try:
        return float(found[1])
    except ValueError:
        return None
