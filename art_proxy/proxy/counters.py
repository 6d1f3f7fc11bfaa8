"""What a proxy counts of its calls, for `/health` and `/metrics`: what went wrong is counted, not
hidden."""

from __future__ import annotations

from dataclasses import dataclass, field

from .call_metrics import CallMetrics


@dataclass
class Counters:
    """Exposed on /health: what went wrong is counted, not hidden."""

    calls: int = 0
    failed_calls: int = 0
    lost_records: int = 0
    stitch_misses: int = 0
    untrainable_calls: int = 0  # answered, but not to be trained on (see the record's reason)
    by_attribution: dict[str, int] = field(default_factory=dict)  # records.Attribution -> calls
    by_dialect: dict[str, int] = field(default_factory=dict)  # records.Dialect -> calls
    shadow_calls: int = 0  # served calls sampled again (shadow.py)
    shadow_samples: int = 0  # their extra samples recorded, failed ones included
    shadow_skipped: int = 0  # drawn for shadowing but over --shadow-max-in-flight
    unrecorded_calls: int = 0  # answered without a record, as --record or X-Art-Record said
    best_of_calls: int = 0  # answered best-of-N (best_of.py)
    best_of_candidates: int = 0  # their candidates, each recorded as its own trajectory
    best_of_unjudged: int = 0  # whose chooser failed or ran out of time: the first answered
    best_of_choose_seconds: float = 0.0  # spent choosing, summed over the calls
    best_of_judge_cost_usd: float = 0.0  # what the judge charged for choosing, summed
    by_model: CallMetrics = field(default_factory=CallMetrics)  # tokens and times (/metrics)
