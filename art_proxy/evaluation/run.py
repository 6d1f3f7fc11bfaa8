"""`art-proxy eval`: the agent run on the same held-out scenarios against every arm at once.

Every arm's rollouts of one scenario share one group in the store (split `eval`), so that a judge
ranks the arms' answers side by side: shuffled, under labels that name no arm, each in
`--judge-orders` orders. Where the agent returns its own reward, that is the reward and no judge
is asked. An evaluation's groups are never trained on and never judged by `art-proxy judge`
(store/base.py `not_an_evaluation`).

An arm that cannot run (its model is not served, its server does not answer) is reported with
why; the others go on. An interruption (Ctrl-C) stops the rollouts under way and reports what
ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from aiohttp import web

from art_proxy.command_agent import PREFIX as COMMAND_PREFIX
from art_proxy.config import EvalSettings, ProxySettings
from art_proxy.config.judge import judging_as_it_goes
from art_proxy.errors import ConfigError, StoreError, error_message
from art_proxy.evaluation.arms import BASE, TRAINED, ArmSpec, base_model, parse_arms
from art_proxy.evaluation.report import ArmRun, Prices, build_report, litellm_prices
from art_proxy.ids import new_id
from art_proxy.journal.left_behind import opened_for_reading
from art_proxy.proxy.aliases import BASE_STEP
from art_proxy.records import CallRecord, EvaluationReport, ScoredBy
from art_proxy.rewards import rewards_by_trajectory
from art_proxy.rollout import Agent, run_rollouts
from art_proxy.ruler.command import build_ruler
from art_proxy.ruler.rubric import load_rubric
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.scenarios import Scenario
from art_proxy.serving import until_stopped
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.teacher import teacher_context

log = logging.getLogger(__name__)

# Seconds to wait for a server's model list while the arms are prepared.
_MODELS_TIMEOUT_S = 30.0

Progress = Callable[[str, int, int], None]  # arm label, rollouts ended, rollouts in all


async def run_evaluation(
    settings: EvalSettings,
    agent: Agent,
    scenarios: Sequence[Scenario],
    progress: Progress | None = None,
    stop: asyncio.Event | None = None,
) -> EvaluationReport:
    """Run every arm, score the rollouts and report; `stop` set (Ctrl-C) stops the rollouts and
    reports what ended. `ConfigError` before anything runs for a setting that cannot work (no
    arm, an unknown reference, a judge that does not answer)."""
    specs = parse_arms(settings.model)
    reference = settings.reference or specs[0].label
    labels = {spec.label for spec in specs}
    if reference not in labels:
        raise ConfigError(f"--reference {reference!r} is none of the arms' labels")
    for flag, given in (
        ("--price", settings.prices_per_hour),
        ("--arm-api-key", settings.arm_keys),
        ("--arm-context", settings.arm_contexts),
    ):
        unknown = sorted(set(given) - labels)
        if unknown:
            raise ConfigError(f"{flag} {unknown[0]}=...: no arm is labelled {unknown[0]!r}")
    if settings.arm_contexts and settings.agent.startswith(COMMAND_PREFIX):
        raise ConfigError(
            "--arm-context travels in rollout.headers, which an exec: agent does not send: use "
            "an agent function that calls rollout.openai_client()"
        )
    contexts = {
        label: teacher_context(path, "--arm-context")
        for label, path in settings.arm_contexts.items()
    }
    group_ids = {scenario.id: new_id() for scenario in scenarios}
    evaluation_id = new_id()
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(opened_for_reading(settings.store))
        ruler: Ruler | None = None
        if settings.judge:
            ruler, judges = build_ruler(
                judging_as_it_goes(settings, settings.store), load_rubric(settings.rubric), store
            )
            for judge in judges:
                stack.push_async_callback(judge.aclose)
                await judge.check()
        runs = [await _prepare(spec, settings, stack, store) for spec in specs]
        interrupted = await _roll(
            runs, settings, agent, scenarios, group_ids, progress, stop, contexts
        )
        await _count_tokens(runs, store)
        rewards, scored_by = await _rewards(runs, settings, store, ruler, group_ids)
        report = build_report(
            runs,
            rewards,
            evaluation_id=evaluation_id,
            agent=settings.agent,
            repeats=settings.repeats,
            reference=reference,
            reward_source=scored_by,
            judge=", ".join(settings.judge) if scored_by == "judge" else None,
            prices=Prices(litellm_prices(specs), settings.prices_per_hour),
            interrupted=interrupted,
        )
        try:
            await store.add_evaluation(report)  # the dashboard's list of evaluations
        except StoreError as exc:  # the report is still printed and written
            log.warning("the evaluation is not in the store's list: %s", exc)
    return report


async def _prepare(
    spec: ArmSpec,
    settings: EvalSettings,
    stack: contextlib.AsyncExitStack,
    store: TrajectoryStore,
) -> ArmRun:
    """The arm, its model named as its server serves it, behind a recording proxy; `error` set
    when it cannot run. `trained` is pinned to the adapter its alias serves now (the alias may
    move while the evaluation runs, and the report names what was measured)."""
    proxy = settings.proxy
    served_by = "proxy"
    key: str | None = None  # its own server's
    if spec.upstream is not None:
        key = settings.arm_keys.get(spec.label)
        if key is None and spec.key_variable:
            key = os.environ.get(spec.key_variable)
        proxy = await _recording_proxy(spec.upstream, key, settings, stack)
        served_by = spec.upstream
    secrets = tuple(secret for secret in (key, settings.api_key, settings.admin_key) if secret)
    run = ArmRun(spec, spec.model, served_by, proxy_url=proxy, secrets=secrets)
    try:
        models = await _served(proxy, _client_key(run, settings))
    except ConfigError as exc:
        run.error = str(exc)
        return run
    ids = [str(entry.get("id")) for entry in models]
    if spec.model in (BASE, TRAINED) and spec.upstream is None:
        try:
            run.model = base_model(models)
        except ConfigError as exc:
            run.error = str(exc)
        else:
            if spec.model == BASE and run.model in await _aliases(proxy, settings.admin_key):
                # An alias named after the base model hides it: ALIAS@0 is the base under it.
                run.model = f"{run.model}@{BASE_STEP}"
            if spec.model == TRAINED:
                served = {a.alias: a.model for a in await store.aliases()}.get(run.model)
                if served is not None and served in ids:
                    run.model = served
    elif spec.model not in ids:
        # ALIAS@STEP names an adapter the trainer saved as ALIAS@STEP-TAG.
        tagged = sorted(i for i in ids if i.startswith(spec.model + "-"))
        if len(tagged) == 1:
            run.model = tagged[0]
        elif tagged:  # the same step of several runs
            runs = {s.adapter: s.run for s in await store.training_steps(limit=100_000)}
            named = " or ".join(f"{name} (run {runs.get(name, '?')})" for name in tagged)
            run.error = f"{spec.model!r} is ambiguous: {named}; name one"
        elif ids:  # a server that lists no models is taken at its word
            run.error = (
                f"{spec.model!r} is not served there (it serves {', '.join(sorted(ids)[:8])})"
            )
    return run


async def _recording_proxy(
    upstream: str, key: str | None, settings: EvalSettings, stack: contextlib.AsyncExitStack
) -> str:
    """A recording proxy on loopback in front of an arm's own server, on the evaluation's store;
    its root URL."""
    from art_proxy.proxy.app import create_app

    # The store's aliases name adapters of the proxy's upstream, which this server does not serve
    # and this arm's calls never name: its recording proxy would warn of each one falling back.
    aliases_log = logging.getLogger("art_proxy.proxy.aliases")
    silenced = _Silenced()
    aliases_log.addFilter(silenced)
    stack.callback(aliases_log.removeFilter, silenced)
    proxy_settings = ProxySettings(
        upstream=[upstream],
        upstream_api_key=key,
        store=settings.store,
        journal="off",
        host="127.0.0.1",
        port=0,
    )
    runner = web.AppRunner(create_app(proxy_settings), access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return f"http://127.0.0.1:{port}"


def _client_key(run: ArmRun, settings: EvalSettings) -> str | None:
    """The key an arm's calls carry: the proxy's client key (`--api-key`) for the proxy's arms
    only. An arm on its own server is called through a recording proxy of its own on loopback,
    which wants none and would pass it on to that server where the arm has no key of its own."""
    return settings.api_key if run.served_by == "proxy" else None


class _Silenced(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


async def _get(url: str, key: str | None) -> tuple[int, str]:
    """GET `url` with `key` as its Bearer: the status and the body."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = aiohttp.ClientTimeout(total=_MODELS_TIMEOUT_S)
    async with (
        aiohttp.ClientSession(headers=headers, timeout=timeout) as http,
        http.get(url) as response,
    ):
        return response.status, await response.text()


async def _aliases(proxy: str, admin_key: str | None) -> set[str]:
    """The proxy's aliases (none where it will not say: no admin key)."""
    try:
        status, text = await _get(f"{proxy}/art/v1/aliases", admin_key)
        body = json.loads(text) if status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return set()
    return {str(entry.get("alias")) for entry in body.get("data", []) if isinstance(entry, dict)}


async def _served(proxy: str, api_key: str | None) -> list[dict[str, object]]:
    """`/v1/models` through `proxy`; `ConfigError` with why when it does not answer."""
    try:
        status, text = await _get(f"{proxy}/v1/models", api_key)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConfigError(f"its server does not answer: {type(exc).__name__}: {exc}") from exc
    if status != 200:
        raise ConfigError(
            f"its models could not be listed: HTTP {status}: {error_message(text, 300)}"
        )
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"its model list is not JSON: {text[:200]}") from exc
    data = body.get("data") if isinstance(body, dict) else None
    return [entry for entry in data or [] if isinstance(entry, dict)]


async def _roll(
    runs: Sequence[ArmRun],
    settings: EvalSettings,
    agent: Agent,
    scenarios: Sequence[Scenario],
    group_ids: dict[str, str],
    progress: Progress | None,
    stop: asyncio.Event | None,
    contexts: Mapping[str, str | None],
) -> bool:
    """Every arm's rollouts, the arms side by side; whether `stop` cut them short. An arm with
    a context (`--arm-context`) has it added to every prompt, as guidance is."""

    async def arm(run: ArmRun) -> None:
        started = time.perf_counter()
        try:
            await run_rollouts(
                agent,
                scenarios,
                proxy_url=run.proxy_url,
                group_size=settings.repeats,
                concurrency=settings.concurrency,
                timeout_s=settings.timeout,
                model=run.model,
                api_key=_client_key(run, settings),
                admin_key=settings.admin_key if run.served_by == "proxy" else None,
                progress=None if progress is None else _for(progress, run.spec.label),
                group_ids=group_ids,
                groups_out=run.groups,
                split="eval",
                guidance=_everywhere(scenarios, contexts.get(run.spec.label)),
            )
        except ConfigError as exc:
            run.error = str(exc)
        finally:
            run.seconds = time.perf_counter() - started

    # the rollouts under way stop at `stop`; what ended is reported
    rolling = asyncio.gather(*(arm(run) for run in runs if run.error is None))
    return await until_stopped(rolling, stop)


def _everywhere(scenarios: Sequence[Scenario], text: str | None) -> dict[str, str] | None:
    return None if text is None else {scenario.id: text for scenario in scenarios}


def _for(progress: Progress, label: str) -> Callable[[int, int], None]:
    return lambda done, total: progress(label, done, total)


async def _count_tokens(runs: Sequence[ArmRun], store: TrajectoryStore) -> None:
    for run in runs:
        ended = [t for g in run.groups for t in g.trajectory_ids if t in g.seconds]
        calls = await store.calls(ended)
        counted = {t: _tokens(calls[t]) for t in ended if t in calls}
        run.tokens = {t: tokens for t, tokens in counted.items() if tokens is not None}


def _tokens(calls: Sequence[CallRecord]) -> tuple[int, int] | None:
    """Prompt and completion tokens of a trajectory's calls: the upstream's usage, else the
    token ids recorded; None where a call has neither (a server that reports no usage is not
    counted as spending nothing)."""
    prompt = completion = 0
    for call in calls:
        usage = (call.response or {}).get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            prompt += usage["prompt_tokens"]
            completion += int(usage.get("completion_tokens") or 0)
        elif call.prompt_token_ids:
            prompt += len(call.prompt_token_ids)
            completion += sum(len(ids) for ids in call.completion_token_ids or [])
        else:
            return None
    return prompt, completion


async def _rewards(
    runs: Sequence[ArmRun],
    settings: EvalSettings,
    store: TrajectoryStore,
    ruler: Ruler | None,
    group_ids: dict[str, str],
) -> tuple[dict[str, float], ScoredBy]:
    """The agent's rewards where it returned one for every rollout that ended; else the
    judge's, each scenario's rollouts of every arm ranked together."""
    returned = {
        t: r for run in runs for g in run.groups for t, r in g.rewards.items() if r is not None
    }
    ended = [t for run in runs for g in run.groups for t in g.rewards]
    if len(returned) == len(ended) or ruler is None:
        return returned, "agent"
    shuffle = random.Random(settings.seed)
    rewards: dict[str, float] = {}
    for group_id in group_ids.values():
        members = await finished_members(store, group_id)
        if len(members) < 2:
            continue
        shuffle.shuffle(members)  # the order the judge sees says nothing of the arms
        judgment = await ruler.score_group(group_id, members)
        if judgment.status == "scored":
            rewards |= rewards_by_trajectory(judgment.scores)
    return rewards, "judge"
