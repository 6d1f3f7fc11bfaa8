"""The text of a growing completion, released in deltas and cut at stop strings.

Decoding ids one at a time breaks multi-byte characters and, for SentencePiece vocabularies, the
spaces between words; like vLLM, each step decodes a short window (a few ids of context before the
new ones) and keeps the new text only once it no longer ends in a partial character. While stop
strings are set, the last `len(longest stop) - 1` characters are held back from a stream, since they
might turn out to begin a stop string, which never reaches the client.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

# Ids of prompt context decoded with the first new ids (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
_CONTEXT_IDS = 5
_REPLACEMENT_CHAR = "\ufffd"


class Detokenizer:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int], stop: Sequence[str]
    ) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._ids = list(prompt_ids[-_CONTEXT_IDS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._released = 0
        self.text = ""  # decoded so far, cut at a stop string once one appears
        self.stop_hit: str | None = None

    def append(self, token_id: int) -> None:
        self._ids.append(token_id)
        if self.stop_hit is None:
            self._decode_new(final=False)

    def finish(self) -> None:
        """Decode what was held back as a partial character; the completion has ended."""
        if self.stop_hit is None:
            self._decode_new(final=True)

    def release(self, *, final: bool) -> str:
        """Text not yet released that can no longer turn into a stop string."""
        end = len(self.text)
        if not final and self.stop_hit is None:
            end = max(self._released, end - self._holdback)
        delta = self.text[self._released : end]
        self._released = end
        return delta

    def _decode_new(self, *, final: bool) -> None:
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or (after.endswith(_REPLACEMENT_CHAR) and not final):
            return
        searched_from = max(0, len(self.text) - self._holdback)
        self.text += after[len(before) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._cut_at_stop(searched_from)

    def _cut_at_stop(self, start: int) -> None:
        found = [(at, s) for s in self._stop if (at := self.text.find(s, start)) >= 0]
        if found:
            at, stop = min(found)
            self.text = self.text[:at]
            self.stop_hit = stop

    def _decode(self, ids: Sequence[int]) -> str:
        text = self._tokenizer.decode(
            list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text
