"""A toy, invertible tokenizer and a Qwen-like chat template for the fake vLLM.

Text splits into pieces: a special token (`<|im_start|>`, `<tool_call>`, ...), a run of word
characters, a run of whitespace, or one other character; each piece is one id. An id is a stable hash
of the piece into [1000, 150000), the same in every process; a collision probes to the next free id,
and the table maps every id back to its piece, so decoding is exact. Once `_MAX_WORD_PIECES` pieces
hold ids, a new piece is spelled out one character a piece, as a real tokenizer spells out a word it
has no token for: a long run of distinct words (a benchmark's numbered calls) never fills the id
space, where the probe for a free id would spin for ever.

The chat template tokenizes each message on its own and concatenates the results:

    <|im_start|> role "\\n" body <|im_end|> "\\n"   (the tools, when given, lead as a system block)

then appends the generation prompt `<|im_start|>assistant\\n`. A generated turn is `body + EOS`, and an
assistant message in a later prompt renders its body with the same function, `assistant_body`.

INVARIANT (what the proxy relies on to join turns): the prompt ids of `messages + [the reply as an
assistant message] + more` start with `prompt(messages) + completion ids (EOS included) + "\\n"`.
It holds for text replies and for tool calls (rendered as `<tool_call>` markup from name and argument
string), whether the assistant message comes back with `content: null` or `""`. Pieces of different
classes alternate at boundaries, so a reply cut by `max_tokens` re-tokenizes to the same ids too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import orjson

from art_proxy.vllm_api.engine import PromptError

ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
TOOL_CALL_START_ID = 151657
TOOL_CALL_END_ID = 151658
# Qwen2.5's embedding rows: like vLLM, a prompt id at or above it is rejected.
VOCAB_SIZE = 151936
END_OF_TURN = "<|im_end|>"

# Hashed ids stay in [1000, 150000), clear of Qwen's special ids and of the fixed ids below.
_HASHED_ID_MIN = 1000
_HASHED_ID_SPAN = 149_000
# Qwen's own ids for the commonest pieces, so a rendered prompt looks familiar in a debugger.
_FIXED_IDS = {"\n": 198, " ": 220}
# Pieces that get ids of their own; the rest of the span is left to single characters.
_MAX_WORD_PIECES = 100_000
# Agent prompts repeat the same long strings every turn; past this many entries the cache restarts.
_ENCODE_CACHE_LIMIT = 65_536


class FakeTokenizer:
    """Word-level tokenizer with a Qwen-like chat template; ids are deterministic across processes."""

    def __init__(self, eos_token_id: int = IM_END_ID) -> None:
        self.eos_token_id = eos_token_id
        # The end-of-turn marker *is* the EOS, so a generated turn and a rendered one end alike.
        specials = {
            "<|endoftext|>": ENDOFTEXT_ID,
            "<|im_start|>": IM_START_ID,
            "<tool_call>": TOOL_CALL_START_ID,
            "</tool_call>": TOOL_CALL_END_ID,
            END_OF_TURN: eos_token_id,
        }
        self._piece_to_id: dict[str, int] = _FIXED_IDS | specials
        self._id_to_piece: dict[int, str] = {i: p for p, i in self._piece_to_id.items()}
        # Decoded text skips these, as vLLM's `skip_special_tokens` does; `<tool_call>` is an added
        # token that is not special, so it stays in text, as in Qwen.
        self._skipped_ids = frozenset({ENDOFTEXT_ID, IM_START_ID, eos_token_id})
        alternatives = "|".join(re.escape(piece) for piece in specials)
        self._pattern = re.compile(alternatives + r"|\w+|\s+|[^\w\s]")
        self._encode_cache: dict[str, tuple[int, ...]] = {}
        self._bytes_cache: dict[int, list[int]] = {}
        self._newline = self.encode("\n")
        self.generation_prompt: tuple[int, ...] = (IM_START_ID, *self.encode("assistant\n"))

    # -- pieces and ids ----------------------------------------------------------------------

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._encode_cache.get(text)
        if ids is None:
            ids = tuple(
                token_id
                for piece in self._pattern.findall(text)
                for token_id in self._piece_ids(piece)
            )
            if len(self._encode_cache) >= _ENCODE_CACHE_LIMIT:
                self._encode_cache.clear()
            self._encode_cache[text] = ids
        return ids

    def piece(self, token_id: int) -> str:
        """The id decoded alone, special tokens kept; an id never seen decodes to ""."""
        return self._id_to_piece.get(token_id, "")

    def piece_bytes(self, token_id: int) -> list[int]:
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = list(self.piece(token_id).encode("utf-8", "surrogatepass"))
            self._bytes_cache[token_id] = cached
        return cached

    def decode(self, ids: Sequence[int]) -> str:
        pieces = self._id_to_piece
        return "".join(pieces.get(i, "") for i in ids if i not in self._skipped_ids)

    def _piece_ids(self, piece: str) -> tuple[int, ...]:
        """The piece's id; its characters' when it has none and the word pieces are used up."""
        token_id = self._piece_to_id.get(piece)
        if token_id is not None:
            return (token_id,)
        if len(piece) > 1 and len(self._piece_to_id) >= _MAX_WORD_PIECES:
            return tuple(self._piece_id(character) for character in piece)
        return (self._piece_id(piece),)

    def _piece_id(self, piece: str) -> int:
        token_id = self._piece_to_id.get(piece)
        if token_id is not None:
            return token_id
        if len(self._piece_to_id) >= _HASHED_ID_SPAN:
            raise PromptError("The fake tokenizer has no id left for a new character.")
        digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        token_id = _HASHED_ID_MIN + int.from_bytes(digest, "big") % _HASHED_ID_SPAN
        while token_id in self._id_to_piece:
            token_id = _HASHED_ID_MIN + (token_id - _HASHED_ID_MIN + 1) % _HASHED_ID_SPAN
        self._piece_to_id[piece] = token_id
        self._id_to_piece[token_id] = piece
        return token_id

    # -- chat template ---------------------------------------------------------------------

    def render_prompt(
        self,
        messages: Sequence[Any],
        tools: Sequence[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        """The prompt ids of a chat request, generation prompt included (with `continue_final`:
        the last message left open, without its end of turn)."""
        ids: list[int] = []
        if tools:
            block = "\n".join(
                orjson.dumps(tool, option=orjson.OPT_SORT_KEYS).decode() for tool in tools
            )
            self._append_turn(ids, "system", self.encode(f"<tools>\n{block}\n</tools>"))
        for message in messages:
            if not isinstance(message, dict):
                raise PromptError("Each message must be an object.")
            role = message.get("role")
            if not isinstance(role, str):
                raise PromptError("Each message needs a string 'role'.")
            content = _content_text(message.get("content"))
            if role == "assistant":
                body = self.assistant_body(content, message.get("tool_calls"))
            else:
                body = list(self.encode(content))
            self._append_turn(ids, role, body)
        if continue_final:
            del ids[len(ids) - 1 - len(self._newline) :]  # the last turn's end and newline
        else:
            ids.extend(self.generation_prompt)
        return ids

    def assistant_body(self, content: str, tool_calls: Any) -> list[int]:
        """The ids between `<|im_start|>assistant\\n` and EOS, as generated and as re-rendered."""
        ids = list(self.encode(content))
        if not tool_calls:
            return ids
        if not isinstance(tool_calls, list):
            raise PromptError("'tool_calls' must be a list.")
        for call in tool_calls:
            name, arguments = _call_name_and_arguments(call)
            if ids:
                ids.extend(self._newline)
            for segment in self.tool_call_segments(name, arguments):
                ids.extend(segment)
        return ids

    def tool_call_segments(
        self, name: str, arguments: str
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Markup ids before the arguments, the arguments' ids, and markup ids after them.

        Kept apart so a stream can hold the markup back and send the arguments as fragments.
        """
        header = f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
        return self.encode(header), self.encode(arguments), self.encode("}\n</tool_call>")

    def _append_turn(self, ids: list[int], role: str, body: Sequence[int]) -> None:
        ids.append(IM_START_ID)
        ids.extend(self.encode(role + "\n"))
        ids.extend(body)
        ids.append(self.eos_token_id)
        ids.extend(self._newline)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise PromptError("Only text content parts are supported by this model.")
            text = part.get("text")
            if not isinstance(text, str):
                raise PromptError("A text content part needs a string 'text'.")
            texts.append(text)
        return "".join(texts)
    raise PromptError("Message 'content' must be a string, a list of parts or null.")


def _call_name_and_arguments(call: Any) -> tuple[str, str]:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(function, dict) or not isinstance(name, str):
        raise PromptError("Each tool call needs a 'function' with a string 'name'.")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):
        # Some clients echo parsed arguments; render them as vLLM's template would serialize them.
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise PromptError("A tool call's 'arguments' must be a JSON string.")
    return name, arguments
