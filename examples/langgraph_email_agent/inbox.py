"""The inbox the agent searches: 40 emails of Sam Carter, operations manager at a small company
(`emails.jsonl`), in SQLite with an FTS5 index, and the agent's two tools over it.

The inbox is read-only, so one in-memory database serves every rollout of a process: it is built on
first use (about 2 ms) and a lock serializes its queries, since LangChain runs sync tools in worker
threads. Search never raises on what a model writes: the words of the query are quoted one by one
and joined with OR, so FTS5 syntax in it (quotes, parentheses, AND, NEAR, `col:`) is read as plain
words, and the hits come best first by bm25. The tools answer JSON text, and an unknown email id is
an error message the model can read, not an exception that ends the run.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, cast

from langchain_core.tools import tool

EMAILS_FILE = Path(__file__).with_name("emails.jsonl")
# A few hits keep the tool result (and the judge's view of the trajectory) short.
MAX_HITS = 5
# Words of a search query beyond this many are dropped: the query stays cheap whatever is sent.
MAX_TERMS = 16
# Words of body text around the matches in a hit's snippet.
SNIPPET_WORDS = 16

# "from" is a keyword in Python, hence the functional form.
Email = TypedDict(
    "Email", {"id": int, "from": str, "to": str, "date": str, "subject": str, "body": str}
)
SearchHit = TypedDict(
    "SearchHit", {"id": int, "from": str, "date": str, "subject": str, "snippet": str}
)

_SCHEMA = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY, sender TEXT, recipient TEXT, date TEXT, subject TEXT, body TEXT
);
CREATE VIRTUAL TABLE emails_fts USING fts5(
    subject, body, sender, content='emails', content_rowid='id'
);
"""
_WORD = re.compile(r"\w+")


def load_emails(path: Path = EMAILS_FILE) -> list[Email]:
    return [cast(Email, json.loads(line)) for line in path.read_text().splitlines() if line]


def match_expression(keywords: str) -> str | None:
    """An FTS5 MATCH expression for free text: each word quoted, any of them (None: no words)."""
    words = _WORD.findall(keywords)[:MAX_TERMS]
    return " OR ".join(f'"{word}"' for word in words) or None


class Inbox:
    def __init__(self, emails: Sequence[Email]) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)
        self._db.executemany(
            "INSERT INTO emails VALUES (?, ?, ?, ?, ?, ?)",
            [(e["id"], e["from"], e["to"], e["date"], e["subject"], e["body"]) for e in emails],
        )
        self._db.execute("INSERT INTO emails_fts(emails_fts) VALUES ('rebuild')")

    def search(self, keywords: str) -> list[SearchHit]:
        """The emails that match any word of `keywords`, best first, at most `MAX_HITS`."""
        expression = match_expression(keywords)
        if expression is None:
            return []
        query = (
            "SELECT e.id, e.sender, e.date, e.subject, "
            f"snippet(emails_fts, 1, '', '', '...', {SNIPPET_WORDS}) "
            "FROM emails_fts JOIN emails e ON e.id = emails_fts.rowid "
            "WHERE emails_fts MATCH ? ORDER BY rank LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(query, (expression, MAX_HITS)).fetchall()
        return [
            {"id": id_, "from": sender, "date": date, "subject": subject, "snippet": snippet}
            for id_, sender, date, subject, snippet in rows
        ]

    def read(self, email_id: int) -> Email | None:
        query = "SELECT id, sender, recipient, date, subject, body FROM emails WHERE id = ?"
        with self._lock:
            row = self._db.execute(query, (email_id,)).fetchone()
        if row is None:
            return None
        id_, sender, recipient, date, subject, body = row
        return {
            "id": id_,
            "from": sender,
            "to": recipient,
            "date": date,
            "subject": subject,
            "body": body,
        }


@functools.cache
def inbox() -> Inbox:
    """The process's inbox, built on first use."""
    return Inbox(load_emails())


@tool
def search_inbox(keywords: str) -> str:
    """Search the inbox for emails containing any of the keywords. Returns a JSON list of the best
    matches: id, from, date, subject and a snippet of the body."""
    return json.dumps(inbox().search(keywords))


@tool
def read_email(email_id: int) -> str:
    """Read one email in full (from, to, date, subject, body), by the id search_inbox returned."""
    email = inbox().read(email_id)
    if email is None:
        return f"Error: there is no email with id {email_id}; use an id that search_inbox returned."
    return json.dumps(email)


TOOLS = [search_inbox, read_email]
