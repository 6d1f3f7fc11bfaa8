"""The rubric the judge scores by: RULER's default, or the user's own text file."""

from __future__ import annotations

import hashlib
from pathlib import Path

from art_proxy.ruler.errors import RubricError

DEFAULT_RUBRIC = """\
- A trajectory that achieves its goal scores much higher than one that does not.
- Among trajectories that achieve the goal, the more efficient one scores higher: fewer steps, \
fewer wasted or failed tool calls, a more direct answer.
- A trajectory that makes partial progress towards the goal scores higher than one that makes \
none, in proportion to the progress made.
- Scores only need to be consistent within this group: use the range to separate better from \
worse, and give equal scores only to trajectories that are equally good."""


def load_rubric(path: str | Path | None) -> str:
    """The text of the rubric file at `path` (None: the default rubric), surrounding blanks removed."""
    if path is None:
        return DEFAULT_RUBRIC
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RubricError(f"rubric file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RubricError(f"rubric file {path} cannot be read: {exc}") from exc
    if not text.strip():
        raise RubricError(f"rubric file {path} is empty")
    return text.strip()


def rubric_hash(rubric: str) -> str:
    """Judgments are looked up by it: a changed rubric means a new judgment."""
    return hashlib.sha256(rubric.encode()).hexdigest()
