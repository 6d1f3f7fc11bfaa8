"""The task's hidden facts: a code word for each city, which no model can know without the tool.

A code word is a word and a number drawn from the city's name by a hash (`lima` -> `quetzal-41`),
so the tool, the demonstrator and the reward agree on it without sharing a table, and it is not
anything a model has read.
"""

from __future__ import annotations

import hashlib
import re

_WORDS = (
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo",
    "juniper", "kelp", "lagoon", "marble", "nectar", "onyx", "pepper", "quetzal", "raven",
    "saffron", "tundra", "umber", "velvet", "walnut", "yarrow", "zephyr",
)  # fmt: skip
_QUESTION = re.compile(r"code word of (?P<city>[^?]+)\?", re.IGNORECASE)


def code_word(city: str) -> str:
    """The code word of `city` (case and surrounding spaces do not matter)."""
    digest = hashlib.sha256(city.strip().lower().encode()).digest()
    return f"{_WORDS[digest[0] % len(_WORDS)]}-{10 + digest[1] % 90}"


def question(city: str) -> str:
    return f"What is the code word of {city}?"


def city_asked(text: str) -> str | None:
    """The city a question asks about (None: not one of the task's questions)."""
    found = _QUESTION.search(text)
    return found.group("city").strip() if found else None
