"""pip's output as a few lines of progress: `pip install ... 2>&1 | python3 scripts/pip_progress.py LABEL`.

Quiet, pip says nothing for minutes while it resolves, downloads and installs (`make setup`'s main
install is 3 minutes here); loud, it prints a line per package and per find-links folder of the
machine's pip configuration that does not exist (hundreds). This keeps what matters: a line when
it starts, one every 30 s saying how far it got, one when it ends, and every line of pip's that is
not routine progress (errors and real warnings) as pip wrote it. Runs on any Python 3 (the
system's, before an environment exists); the exit status stays pip's (the Makefile's pipefail).
"""

from __future__ import annotations

import re
import sys
import threading
import time

# pip's routine progress lines, counted rather than shown.
ROUTINE = re.compile(
    r"^(Collecting|Downloading|Using cached|Requirement already satisfied|Installing collected"
    r"|Successfully (installed|uninstalled|built)|Obtaining|Preparing|Building|Created wheel"
    r"|Stored in directory|Checking if build backend|Getting requirements|Installing build"
    r"|Installing backend|Attempting uninstall|Found existing installation|Uninstalling"
    r"|Looking in (indexes|links)|Processing|Requirement already up-to-date)"
    r"|^\s+(Downloading|Using cached|Found existing|Uninstalling|Successfully|Building|Created"
    r"|Stored|Preparing|Getting|Installing|Checking|Running|━)"
    r"|^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$"
)
COLLECTING = re.compile(r"^Collecting (\S+)")
EVERY_S = 30.0


def main() -> int:
    label = " ".join(sys.argv[1:]) or "pip"
    started = time.monotonic()
    packages: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def say(line: str) -> None:
        with lock:
            print(f"setup: {line}", flush=True)

    def tick() -> None:
        while not done.wait(EVERY_S):
            latest = f", the latest {packages[-1]}" if packages else ""
            say(
                f"{label}: still at it, {time.monotonic() - started:.0f} s "
                f"({len(packages)} packages collected{latest})"
            )

    say(f"{label}...")
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        collecting = COLLECTING.match(line)
        if collecting:
            packages.append(collecting.group(1))
        if line.strip() and not ROUTINE.search(line):
            with lock:
                print(line, flush=True)
    done.set()
    what = f"{len(packages)} packages collected, " if packages else ""
    # pip's own status decides whether it worked (a failure printed its error above).
    say(f"{label}: pip finished ({what}{time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
