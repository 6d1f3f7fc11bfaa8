"""The production page's chart of a canary: the candidate's live reward minus the target's at
each look of its decider, with the anytime-valid interval as a band narrowing as trajectories are
scored, and zero (no difference) beside it: the canary promotes once the band is above the line,
rolls back once it is below."""

from __future__ import annotations

from collections.abc import Sequence

from art_proxy.records import CanaryLook

from .plots import Chart, Series, line_chart


def canary_chart(looks: Sequence[CanaryLook]) -> Chart | None:
    """`looks` oldest first; None when none has an interval yet (too few scored an arm)."""
    ready = [look for look in looks if look.low is not None and look.high is not None]
    if not ready:
        return None
    scored = [float(look.candidate.count + look.target.count) for look in ready]
    return line_chart(
        "Candidate minus target: live reward (anytime-valid interval)",
        [
            Series(
                "difference",
                [(x, look.difference) for x, look in zip(scored, ready, strict=True)],
                [((look.high or 0.0) - (look.low or 0.0)) / 2 for look in ready],
            ),
            Series("no difference", [(scored[0], 0.0), (scored[-1], 0.0)]),
        ],
        floor=-1.0 if all(_unit(look) for look in ready) else None,
        ceiling=1.0 if all(_unit(look) for look in ready) else None,
        y_title="difference in reward",
        x_title="scored trajectories",
    )


def _unit(look: CanaryLook) -> bool:
    """Both arms' rewards in [0, 1] (RULER's, most agents'): the difference is in [-1, 1]."""
    means = (look.candidate.mean, look.target.mean)
    return all(mean is None or 0.0 <= mean <= 1.0 for mean in means)
