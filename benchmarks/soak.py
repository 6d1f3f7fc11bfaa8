"""The journal's soak, long: `tests/test_soak.py` (45 s in `make test`) run for `--seconds`.

8 clients hold three-call conversations through an `art-proxy serve` process (journal on a tmpfs
of its own, store a fresh database on the local PostgreSQL reached through a TCP relay that can cut
it off) in front of the fake vLLM, while, at fixed fractions of the run, PostgreSQL is cut off and
comes back, the journal's disk fills and is freed, and the proxy is SIGKILLed inside a second
outage and started again. Then `art-proxy export` must hold every call a client saw answered,
none twice, each trajectory's seqs 0..n-1. Needs root (the tmpfs) and PostgreSQL on
127.0.0.1:5432 (trust auth, database `test`).

    .venv/bin/python benchmarks/soak.py [--seconds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from art_proxy.testing.fault_tcp import faulty_tcp
from tests.conftest import fresh_postgres_database
from tests.test_soak import Soaked, soak

console = Console()


async def _run(seconds: float) -> Soaked:
    async with (
        fresh_postgres_database() as postgres_url,
        faulty_tcp("127.0.0.1", 5432) as relay,
        running_fake_vllm(FakeVllmConfig()) as vllm,
    ):
        with tempfile.TemporaryDirectory(prefix="art-proxy-soak-") as workdir:
            return await soak(seconds, postgres_url, relay, vllm.base_url, Path(workdir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long the load runs")
    args = parser.parse_args()
    console.print(f"soak: {args.seconds:.0f} s of load with the faults at fixed fractions...")
    try:
        soaked = asyncio.run(_run(args.seconds))
    except pytest.skip.Exception as exc:  # no PostgreSQL, or no tmpfs mount (not root)
        console.print(f"soak: cannot run here: {exc.msg}")
        return 2
    console.print(f"phases (s from the start): {soaked.phases}")
    console.print(
        f"journal backlog during the first outage: {soaked.backlog_during_outage:,} records; "
        f"refused or cut while the proxy restarted: {soaked.refused}"
    )
    held = not (soaked.missing or soaked.twice or soaked.bad_seqs)
    verdict = "[green]nothing lost[/]" if held else "[red]LOST OR DOUBLED RECORDS[/]"
    console.print(
        f"{soaked.seconds:.0f} s: {len(soaked.answered):,} calls answered, "
        f"{len(soaked.missing):,} of them missing from the export, {len(soaked.twice):,} "
        f"exported twice, {len(soaked.bad_seqs):,} trajectories (of {soaked.trajectories:,}) "
        f"with seqs not 0..n-1: {verdict}"
    )
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
