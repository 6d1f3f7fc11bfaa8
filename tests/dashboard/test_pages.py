"""The dashboard's pages over recorded data, read as HTML (no browser): what each shows, and that
trajectory content arrives escaped under a Content-Security-Policy that runs only our script."""

from __future__ import annotations

import re

import aiohttp

from art_proxy.proxy.server import RunningProxy
from art_proxy.records import AliasRequest, CanaryLook, LiveReward
from art_proxy.store.base import utcnow
from tests.dashboard.recorded import (
    HOSTILE_EXPLANATION,
    HOSTILE_TASK,
    HOSTILE_TOOL_RESULT,
    IMG,
    MODEL,
    SCRIPT,
    Recorded,
    judgment,
    rollout,
)


async def page(http: aiohttp.ClientSession, proxy: RunningProxy, path: str) -> tuple[int, str]:
    async with http.get(proxy.root_url + path) as response:
        return response.status, await response.text()


def escaped(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
    )


async def test_overview_lists_groups_newest_first_with_status_split_and_rewards(
    proxy: RunningProxy, http: aiohttp.ClientSession, recorded_on_any_store: Recorded
) -> None:
    recorded = recorded_on_any_store
    status, html = await page(http, proxy, "/dashboard")
    assert status == 200
    rows = re.findall(r"<tr>\s*<td class=\"nowrap\">.*?</tr>", html, re.S)
    assert len(rows) == 2
    assert "held-out" in rows[0] and "summarise" in rows[1]  # newest first
    assert "badge-finished" in rows[0] and ">val<" in rows[0]
    assert "badge-scored" in rows[1] and ">train<" in rows[1]
    assert "0.562" in rows[1]  # judge reward mean of 0.875 and 0.25
    assert "0.5" in rows[1]  # programmatic mean of 1.0 and 0.0
    assert f"/dashboard/groups/{recorded.group_id}" in rows[1]


async def test_overview_filters_by_split_status_and_scenario(
    proxy: RunningProxy, http: aiohttp.ClientSession, recorded_on_any_store: Recorded
) -> None:
    for query, shown, hidden in (
        ("?split=val", "held-out", "summarise"),
        ("?split=train", "summarise", "held-out"),
        ("?status=scored", "summarise", "held-out"),
        ("?status=finished", "held-out", "summarise"),
        ("?scenario=summarise", "summarise", "held-out"),
    ):
        _, html = await page(http, proxy, "/dashboard" + query)
        groups = html.split('id="groups"')[1]
        assert shown in groups and hidden not in groups, query
    _, html = await page(http, proxy, "/dashboard?status=open")
    assert "No groups match these filters" in html
    _, html = await page(http, proxy, "/dashboard?split=nonsense&status=<b>")
    assert "held-out" in html and "summarise" in html  # a value never offered filters nothing


async def test_overview_shows_an_open_group_as_open(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        f"{sqlite_proxy.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "still running"}]},
        headers={"X-Art-Scenario": "running"},
    ) as response:
        assert response.status == 200
    _, html = await page(http, sqlite_proxy, "/dashboard?status=open")
    assert "running" in html and "badge-open" in html and "(1 running)" in html


async def test_group_page_shows_each_trajectory_with_score_explanation_and_rewards(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    status, html = await page(http, sqlite_proxy, f"/dashboard/groups/{recorded.group_id}")
    assert status == 200
    columns = html.split('<article class="trajectory"')[1:]
    assert len(columns) == 2
    good, evil = columns  # in the order the judge saw them
    assert "t1" in good and "good-1" in good and "0.875" in good
    assert "Reached the goal in two calls." in good
    assert "programmatic reward</span> 1" in good
    assert "t2" in evil and "0.250" in evil and "programmatic reward</span> 0" in evil
    assert escaped(HOSTILE_EXPLANATION) in evil
    assert "openai/test-judge" in html and "badge-scored" in html
    assert re.search(r"order agreement</dt><dd>0\.5", html)  # the judge read, not placed
    assert 'run <a href="/dashboard/training?run=run-1">run-1</a>, step 1' in html


async def test_group_page_renders_tool_calls_and_tool_results_once_shared_prefix_apart(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    _, html = await page(http, sqlite_proxy, f"/dashboard/groups/{recorded.group_id}")
    shared, columns = html.split('<div class="columns">')
    assert "You summarise web pages." in shared  # the system prompt both share, shown once
    assert "You summarise web pages." not in columns
    assert columns.count("tool call</span> <code>lookup</code>") == 2
    assert columns.count("role-tool") == 2
    assert escaped(HOSTILE_TOOL_RESULT) in columns
    assert "{\n  &#34;query&#34;: " in columns  # the arguments, pretty-printed JSON


async def test_trajectory_page_shows_raw_calls_with_tokens_latency_upstream_and_model(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    status, html = await page(http, sqlite_proxy, "/dashboard/trajectories/evil-1")
    assert status == 200
    calls = html.split('<table class="calls">')[1].split("</table>")[0]
    rows = re.findall(r"<tr>\s*<td>\d+</td>.*?</tr>", calls, re.S)
    assert len(rows) == 2
    for row in rows:
        cells = re.findall(r'<td class="num">([^<]*)</td>', row)
        latency, prompt_tokens, completion_tokens = cells
        assert float(latency) >= 0 and int(prompt_tokens) > 0 and int(completion_tokens) > 0
        assert "Qwen/Qwen2.5-0.5B-Instruct" in row and "127.0.0.1" in row
    assert html.count('<details class="raw"') == 2
    assert escaped(HOSTILE_TASK) in html


async def test_trajectory_page_shows_what_a_teacher_said_of_each_trained_call(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    _, html = await page(http, sqlite_proxy, "/dashboard/trajectories/evil-1")
    teacher = html.split('<table class="teacher">')[1].split("</table>")[0]
    [row] = re.findall(r"<tr>\s*<td>.*?</tr>", teacher, re.S)
    assert "run-1" in row and "teacher-model" in row and "0.420" in row
    assert "-0.25&rarr;-5.50" in row.replace("→", "&rarr;")  # the most disagreed first
    assert row.index("-5.50") < row.index("-2.00")
    _, other = await page(http, sqlite_proxy, "/dashboard/trajectories/good-1")
    assert "<h2>Teacher</h2>" not in other  # no teacher scored it


async def test_training_page_plots_reward_loss_agent_kl_off_policy_staleness_pipeline_adapters(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    status, html = await page(http, sqlite_proxy, "/dashboard/training")
    assert status == 200
    svgs = re.findall(r"<svg .*?</svg>", html, re.S)
    assert [re.search(r'aria-label="([^"]*)"', svg)[1] for svg in svgs] == [  # type: ignore[index]
        "Reward",
        "Loss",
        "Agent metrics (mean per training rollout)",
        "KL to the base model",
        "Teacher: reverse KL of the sampled tokens from the teacher (per token)",
        "Off-policy: mismatch and correction",
        "Staleness: changes of the weights between the sampling adapter and the trained one "
        "(every group a step consumed)",
        "Pipeline: seconds waited",
        "Pipeline: how far the rollouts ran ahead",
        "Time per step",
    ]
    # Each axis says what it measures: steps below, the unit beside.
    assert all('class="axis-title"' in svg and ">training step</text>" in svg for svg in svgs)
    assert ">reward</text>" in svgs[0] and ">seconds</text>" in svgs[9]
    assert "the whole step, step 3: 6" in svgs[9] and "train, step 2: 3" in svgs[9]
    reward = svgs[0]
    assert reward.count('class="dot s0"') == 4 and reward.count('class="dot s1"') == 4
    assert 'class="band s0"' in reward  # the within-group spread
    assert "reward mean, step 4: 0.7" in reward and "validation reward, step 1: 0.15" in reward
    assert "used_tools, step 3: 0.8" in svgs[2]  # what the agent reported, by its own name
    assert "teacher KL, step 2: 0.25" in svgs[4]
    off_policy, staleness = svgs[5], svgs[6]
    assert "mean |d logprob| sampler vs trainer, step 2: 0.04" in off_policy
    assert "tokens whose weight was capped, step 3: 0.03" in off_policy
    assert "max, step 4: 4" in staleness
    assert "the trainer, for its batch, step 2: 1" in svgs[7]
    assert "batches ready when one was taken, step 3: 1" in svgs[8]
    moves = html.split('<table class="moves">')[1]
    assert moves.count("<tr><td") == 4 and "agent@3</code></td><td><code>agent@4" in moves


async def test_production_page_shows_a_canarys_arms_its_narrowing_interval_and_decision(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    _, before = await page(http, sqlite_proxy, "/dashboard/production")
    assert "No canary yet" in before and "<svg" not in before
    store = sqlite_proxy.parts.store
    await store.set_alias("prod", AliasRequest(model="base", reason="promote", note="the base"))
    gate = "val 0.62; off-policy 0.58 from 40 shadow samples (effective 14.2, 0 weights truncated)"
    await store.set_alias(
        "prod", AliasRequest(model="agent@3", reason="canary", fraction=0.25, note=gate)
    )
    for n, radius in ((5, None), (20, 0.4), (40, 0.25), (80, 0.15)):
        candidate = LiveReward(model="agent@3", count=n // 4, mean=0.7, pending=2)
        target = LiveReward(model="base", count=n - n // 4, mean=0.5)
        await store.add_canary_look(
            CanaryLook(
                alias="prod",
                looked_at=utcnow(),
                fraction=0.25,
                candidate=candidate,
                target=target,
                difference=0.2,
                low=None if radius is None else 0.2 - radius,
                high=None if radius is None else 0.2 + radius,
                verdict="hold" if radius != 0.15 else "promote",
                note=f"live 0.70 (n={n // 4}, agent@3) vs 0.50 (n={n - n // 4}, base)",
            )
        )
    status, html = await page(http, sqlite_proxy, "/dashboard/production")
    assert status == 200 and 'href="/dashboard/production"' in html
    assert "canary <code>agent@3</code>\non 25% of new trajectories" in html
    assert f"Before it began: {gate}" in html  # the off-policy gate's evidence
    arms = html.split('<table class="arms">')[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>(\w+)</td><td><code>([^<]+)</code></td>(.*?)</tr>", arms)
    assert [(arm, model) for arm, model, _ in rows] == [
        ("candidate", "agent@3"),
        ("target", "base"),
    ]
    assert '<td class="num">25%</td><td class="num">20</td><td class="num">2</td>' in rows[0][2]
    assert "promote" in html.split('class="decision"')[1].split("</p>")[0]
    assert "live 0.70 (n=20, agent@3) vs 0.50 (n=60, base)" in html
    svg = re.findall(r"<svg .*?</svg>", html, re.S)[0]
    assert 'aria-label="Candidate minus target: live reward (anytime-valid interval)"' in svg
    assert svg.count('class="dot s0"') == 3  # the looks with an interval
    assert 'class="band s0"' in svg and ">scored trajectories</text>" in svg
    moves = html.split('<table class="moves">')[1]
    assert moves.count("<tr><td") == 2 and ">canary</td>" in moves


async def test_overview_shows_the_newest_runs_reward_curve(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    _, html = await page(http, sqlite_proxy, "/dashboard")
    assert "Training run" in html and html.count('class="dot s0"') == 4


async def test_pages_before_any_data_say_what_will_appear(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    _, overview = await page(http, sqlite_proxy, "/dashboard")
    assert "No groups yet" in overview and "No training steps yet" in overview
    _, training = await page(http, sqlite_proxy, "/dashboard/training")
    assert "No training steps yet" in training and "<svg" not in training


async def test_trajectory_content_is_escaped_on_every_page(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    for path in (
        "/dashboard",
        f"/dashboard/groups/{recorded.group_id}",
        "/dashboard/trajectories/evil-1",
    ):
        _, html = await page(http, sqlite_proxy, path)
        assert SCRIPT not in html and IMG not in html and "<img" not in html, path
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html, path


async def test_every_dashboard_response_carries_a_strict_content_security_policy(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    for path in (
        "/dashboard",
        f"/dashboard/groups/{recorded.group_id}",
        "/dashboard/trajectories/good-1",
        "/dashboard/training",
        "/dashboard/static/dashboard.js",
        "/dashboard/groups/nope",
    ):
        async with http.get(sqlite_proxy.root_url + path) as response:
            policy = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy and "default-src 'self'" in policy, path
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            html = await response.text()
        # No inline script or handler to allow: the one script is a file.
        assert re.findall(r"<script[^>]*>", html) in (
            [],
            ['<script src="/dashboard/static/dashboard.js" defer>'],
        )


async def test_static_files_are_served_with_their_type_and_nothing_else(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with http.get(sqlite_proxy.root_url + "/dashboard/static/dashboard.css") as response:
        assert response.status == 200 and response.content_type == "text/css"
    for name in ("..%2F__init__.py", "missing.js", "%2E%2E%2Fviews.py"):
        status, _ = await page(http, sqlite_proxy, "/dashboard/static/" + name)
        assert status == 404, name


async def test_an_unknown_group_or_trajectory_is_a_404_page(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    status, html = await page(http, sqlite_proxy, "/dashboard/groups/%3Cb%3Enope")
    assert status == 404 and "No group &#39;&lt;b&gt;nope&#39;" in html
    status, _ = await page(http, sqlite_proxy, "/dashboard/trajectories/nope")
    assert status == 404


async def test_an_id_with_a_slash_links_to_its_own_page(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await rollout(http, sqlite_proxy, scenario="a/b", trajectory="team/run 1", task="Slashes.")
    _, html = await page(http, sqlite_proxy, "/dashboard?scenario=a%2Fb")
    group_link = re.search(r'href="(/dashboard/groups/[^"]+)"', html)
    assert group_link is not None
    _, group = await page(http, sqlite_proxy, group_link[1])
    link = re.search(r'href="(/dashboard/trajectories/[^"]+)"', group)
    assert link is not None and link[1] == "/dashboard/trajectories/team%2Frun%201"
    status, trajectory = await page(http, sqlite_proxy, link[1])
    assert status == 200 and "team/run 1" in trajectory


async def test_only_an_open_trajectorys_page_keeps_polling(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    async with http.post(
        f"{sqlite_proxy.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "not done"}]},
        headers={"X-Art-Trajectory": "still-open"},
    ) as response:
        assert response.status == 200
    _, running = await page(http, sqlite_proxy, "/dashboard/trajectories/still-open")
    _, finished = await page(http, sqlite_proxy, "/dashboard/trajectories/evil-1")
    assert 'id="trajectory" data-live' in running
    assert "data-live" not in finished


async def test_a_failed_judgment_shows_with_its_reason_beside_the_scores_the_trainer_reads(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, recorded: Recorded
) -> None:
    failed = judgment(recorded.group_id, recorded.trajectory_ids).model_copy(
        update={"status": "judge_failed", "reason": "judge answered <nonsense>", "scores": []}
    )
    await sqlite_proxy.parts.settled()
    await sqlite_proxy.parts.store.add_judgment(failed)
    _, overview = await page(http, sqlite_proxy, "/dashboard?status=judge_failed")
    assert "summarise" in overview and "judge answered &lt;nonsense&gt;" in overview
    _, group = await page(http, sqlite_proxy, f"/dashboard/groups/{recorded.group_id}")
    assert '<strong class="score-value">0.875</strong>' in group
    other = group.split("Other judgments")[1]
    assert "badge-judge_failed" in other and "judge answered &lt;nonsense&gt;" in other
