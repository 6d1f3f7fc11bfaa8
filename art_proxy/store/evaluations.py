"""`art-proxy eval`'s reports, stored whole: the dashboard lists them beside training."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from art_proxy.records import EvaluationReport
from art_proxy.store import schema
from art_proxy.store.base import StoreBase

E = schema.evaluations


class EvaluationRecords(StoreBase):
    async def add_evaluation(self, report: EvaluationReport) -> None:
        async with self._transaction() as connection:
            await connection.execute(
                sa.insert(E).values(
                    id=report.id,
                    created_at=report.created_at,
                    report=report.model_dump(mode="json"),
                )
            )

    async def evaluations(self, limit: int = 20) -> list[EvaluationReport]:
        """Newest first."""
        rows = await self._all(
            sa.select(E.c.id, E.c.report).order_by(E.c.created_at.desc()).limit(limit)
        )
        # A report another version wrote (or a hand) is skipped and counted, as every reader's
        # unreadable row is: one made the dashboard's page a 500.
        reports = [self._readable(_report, row) for row in rows]
        return [report for report in reports if report is not None]


def _report(row: dict[str, Any]) -> EvaluationReport:
    return EvaluationReport.model_validate(row["report"])
