"""Does the canary decide right, and how soon? Candidates of known truth against today's rules.

Production traffic is simulated with known truth: seeded users, each with a base rate of success
(spread across users, Beta(4, 4)), and traffic whose mean drifts with the hour (+/- 0.05 over a
day of `--day` trajectories), as a live app's does. A candidate is truly better than the current
target by 0.1, equal, or worse by 0.1: a trajectory it serves succeeds with the user's rate plus
that. `--runs` runs of each, seeded.

- **canary**: each trajectory goes to the candidate with probability `--fraction` (sticky: drawn
  once per trajectory) and the rest to the current target, at the same time; after every scored
  trajectory the anytime-valid interval of `art_proxy_trainer.canary` decides: promote (above 0),
  roll back (below 0), keep the current target (within +/- `--min-effect`), else look again, up to
  `--budget` trajectories (still undecided: the current target stays).
- **staged canary** (`--stages 0.05 0.25 0.5`): the same, starting at 5% of the traffic and
  widening to the next share once a stage has served `--stage-trajectories` scored trajectories
  on the candidate without a decision; the evidence is kept, stratified by stage (`canary.py`,
  what the trainer runs).
- **today's rules** (`promoter.decide_promotion`, `decide_rollback`, the functions the trainer runs
  now): the candidate is promoted when its mean on `--val` validation rollouts is at least the
  current target's on as many; once promoted it serves all traffic, and after each scored
  trajectory from the 8th on it is rolled back when its live mean is below the previous target's
  over its own last 50 trajectories by more than 0.05.

Per truth and rule: the share of runs promoted (and kept), rolled back, kept as it was, the
median production trajectories to the decision, and how many of them the candidate served (the
users a worse candidate reached). Last, the canary's figures beside the targets: the
better promoted and the worse rolled back in at least 90% of runs, the equal one moved in at most
alpha's share.

    .venv/bin/python benchmarks/canary.py                 # 20 runs of each truth
    .venv/bin/python benchmarks/canary.py --runs 200      # tighter shares
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy.records import LiveReward
from art_proxy_trainer.canary import VERDICTS, ArmRewards, CanaryPolicy, Stage, verdict
from art_proxy_trainer.promoter import decide_promotion, decide_rollback

console = Console(width=max(Console().width, 120))
TRUTHS = {"better by 0.1": 0.1, "equal": 0.0, "worse by 0.1": -0.1}
ROLLBACK_MIN, ROLLBACK_MARGIN, PREVIOUS_PERIOD = 8, 0.05, 50  # today's defaults


@dataclass(frozen=True)
class Outcome:
    decision: str  # promote, rollback, keep (as it was), undecided
    trajectories: int | None  # production trajectories to the decision (None: none taken)
    exposed: int  # of them, those the candidate served (all, once promoted)


@dataclass
class Traffic:
    """Seeded users and the hour's drift; `success(effect)` draws one trajectory's reward."""

    generator: torch.Generator
    users: torch.Tensor  # each user's base rate
    day: int
    served: int = 0

    @classmethod
    def seeded(cls, seed: int, users: int, day: int) -> Traffic:
        generator = torch.Generator().manual_seed(seed)
        rates = torch.tensor([_beta(generator) for _ in range(users)], dtype=torch.float64)
        return cls(generator, rates, day)

    def success(self, effect: float) -> float:
        user = int(torch.randint(len(self.users), (1,), generator=self.generator))
        drift = 0.05 * math.sin(2 * math.pi * self.served / self.day)
        self.served += 1
        rate = min(max(float(self.users[user]) + drift + effect, 0.0), 1.0)
        return float(torch.rand(1, generator=self.generator, dtype=torch.float64) < rate)


def _beta(generator: torch.Generator) -> float:
    """A Beta(4, 4) draw from `generator` (the order statistic of 7 uniforms)."""
    return float(torch.rand(7, generator=generator, dtype=torch.float64).sort().values[3])


def canary_run(effect: float, seed: int, args: argparse.Namespace, policy: CanaryPolicy) -> Outcome:
    traffic = Traffic.seeded(seed, args.users, args.day)
    # Per stage, per arm (candidate True): count, sum, sum of squares of the scored rewards.
    stages: list[tuple[float, dict[bool, list[float]]]] = []
    share = policy.fractions[0]
    exposed = 0
    for served in range(1, args.budget + 1):
        if not stages or stages[-1][0] != share:
            stages.append((share, {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}))
        on_candidate = bool(torch.rand(1, generator=traffic.generator) < share)
        exposed += on_candidate
        reward = traffic.success(effect if on_candidate else 0.0)
        sums = stages[-1][1][on_candidate]
        sums[0], sums[1], sums[2] = sums[0] + 1, sums[1] + reward, sums[2] + reward * reward
        decided, _ = verdict(
            [Stage(f, _rewards(arms[True]), _rewards(arms[False])) for f, arms in stages],
            alpha=policy.alpha,
            min_effect=policy.min_effect,
        )
        name = VERDICTS[int(decided)]
        if name != "hold":
            return Outcome(name, served, exposed)
        share = policy.widens(share, int(stages[-1][1][True][0])) or share
    return Outcome("undecided", None, exposed)


def _rewards(sums: list[float]) -> ArmRewards:
    count, total, squares = (torch.tensor(value, dtype=torch.float64) for value in sums)
    return ArmRewards(count, total, squares)


def todays_run(effect: float, seed: int, args: argparse.Namespace) -> Outcome:
    traffic = Traffic.seeded(seed, args.users, args.day)
    # The previous target's own serving period, the traffic before the promotion.
    previous = [traffic.success(0.0) for _ in range(PREVIOUS_PERIOD)]
    candidate_val = statistics.fmean(traffic.success(effect) for _ in range(args.val))
    current_val = statistics.fmean(traffic.success(0.0) for _ in range(args.val))
    if not decide_promotion(candidate_val, "current", current_val).act:
        return Outcome("keep", None, 0)
    before = LiveReward(model="current", count=len(previous), mean=statistics.fmean(previous))
    live: list[float] = []
    for served in range(1, args.budget + 1):
        live.append(traffic.success(effect))
        now = LiveReward(model="candidate", count=len(live), mean=statistics.fmean(live))
        if decide_rollback(now, before, ROLLBACK_MIN, ROLLBACK_MARGIN).act:
            return Outcome("rollback", served, served)
    return Outcome("promote", None, args.budget)


def table(results: dict[tuple[str, str], list[Outcome]], args: argparse.Namespace) -> Table:
    shown = Table(
        title=f"{args.runs} runs of each truth, seeded users, traffic drifting by the hour"
    )
    for column in ("rule", "candidate", "promoted", "rolled back", "kept as it was", "undecided"):
        shown.add_column(column, justify="right" if column != "rule" else "left")
    shown.add_column("median trajectories to decide", justify="right")
    shown.add_column("of them on the candidate", justify="right")
    for (rule, truth), outcomes in results.items():
        shares = [_share(outcomes, name) for name in ("promote", "rollback", "keep", "undecided")]
        taken = [o.trajectories for o in outcomes if o.trajectories is not None]
        median = f"{statistics.median(taken):,.0f}" if taken else "-"
        exposed = [o.exposed for o in outcomes if o.trajectories is not None]
        on_candidate = f"{statistics.median(exposed):,.0f}" if exposed else "-"
        shown.add_row(rule, truth, *(f"{share:.0%}" for share in shares), median, on_candidate)
    return shown


def _share(outcomes: Sequence[Outcome], name: str) -> float:
    return sum(o.decision == name for o in outcomes) / len(outcomes)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results: dict[tuple[str, str], list[Outcome]] = {}
    single = CanaryPolicy((args.fraction,), args.alpha, args.min_effect)
    staged = CanaryPolicy(
        tuple(args.stages), args.alpha, args.min_effect, stage_trajectories=args.stage_trajectories
    )
    canaries = {
        f"canary {args.fraction:.0%}": single,
        "staged " + " -> ".join(f"{f:.0%}" for f in args.stages): staged,
    }
    for truth, effect in TRUTHS.items():
        seeds = range(args.seed, args.seed + args.runs)
        for rule, policy in canaries.items():
            results[(rule, truth)] = [canary_run(effect, seed, args, policy) for seed in seeds]
        results[("today's rules", truth)] = [todays_run(effect, seed, args) for seed in seeds]
        console.print(f"{truth}: {args.runs} runs of each rule done")
    console.print(table(results, args))
    today_equal = results[("today's rules", "equal")]
    lines, passed = [], True
    for rule in canaries:
        better = _share(results[(rule, "better by 0.1")], "promote")
        worse = _share(results[(rule, "worse by 0.1")], "rollback")
        equal = results[(rule, "equal")]
        moved = _share(equal, "promote") + _share(equal, "rollback")
        decided = [
            o.trajectories
            for truth in ("better by 0.1", "worse by 0.1")
            for o in results[(rule, truth)]
            if o.trajectories is not None
        ]
        median = statistics.median(decided) if decided else math.nan
        passed = passed and better >= 0.9 and worse >= 0.9 and moved <= args.alpha
        lines.append(
            f"{rule}: better promoted {better:.0%}, worse rolled back {worse:.0%} (target >= "
            f"90%), equal moved {moved:.0%} (alpha {args.alpha:.0%}), median {median:,.0f} "
            "trajectories to decide"
        )
    console.print(
        "; ".join(lines) + f"; today's rules moved the equal one in "
        f"{_share(today_equal, 'rollback') + _share(today_equal, 'promote'):.0%}: "
        f"{'PASS' if passed else 'FAIL'}",
        soft_wrap=True,
    )
    return 0 if passed else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.5, help="the canary's share")
    parser.add_argument(
        "--stages", type=float, nargs="+", default=[0.05, 0.25, 0.5], help="a staged canary's"
    )
    parser.add_argument("--stage-trajectories", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--min-effect", type=float, default=0.05)
    parser.add_argument("--budget", type=int, default=6000, help="trajectories before giving up")
    parser.add_argument("--val", type=int, default=32, help="today's validation rollouts a side")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--day", type=int, default=1000, help="trajectories in a day's drift")
    parser.add_argument("--seed", type=int, default=0)
    return parser


if __name__ == "__main__":
    sys.exit(main())
