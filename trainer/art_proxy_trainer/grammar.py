"""Replaying what vLLM allowed at every token of a call: its grammar, `allowed_token_ids`,
`bad_words` and `min_tokens`.

vLLM masks the logits with its grammar's bitmask before its sampler sees them (so before the logit
bias, penalties, temperature and filters), and its processed logprobs are of that masked
distribution. The trainer compiles the same grammar (`art_proxy.guided_decoding` says which) with
the same engine as vLLM (xgrammar, the backend a vLLM engine nearly always runs, else
llguidance: the one it runs when its first constrained request needed it), for the same tokenizer
and vocabulary size, and walks the recorded tokens through a matcher, keeping before each token
the bitmask of the tokens allowed there. A recorded token both refuse, or a grammar neither reads
(an engine on outlines), means the replay is not what vLLM ran: the call is not scored.

vLLM's sampler then leaves out, before its logit bias and penalties, what `allowed_token_ids` does
not list; the last id of a `bad_words` word whose other ids the output has just written; and,
while a call has output fewer than `min_tokens` ids, its stop ids (EOS, the model's
generation_config EOS ids and the call's `stop_token_ids`; kept where the grammar allows nothing
else). Each is ANDed into the same per-token bitmask.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from art_proxy.guided_decoding import Grammar, Unreplayable, constraint
from art_proxy.records import JsonObject
from art_proxy_trainer.bitmask import packed

if TYPE_CHECKING:
    import xgrammar


def leaves_ids_out(request: JsonObject) -> bool:
    """Whether vLLM left ids out of the call's distribution: a grammar, `allowed_token_ids`,
    `bad_words` or `min_tokens` (what `GrammarReplay.allowed_tokens` replays)."""
    return constraint(request) is not None or any(
        request.get(name) for name in ("allowed_token_ids", "bad_words", "min_tokens")
    )


# The tokens reasoning models end their reasoning with (vLLM's qwen3, deepseek_r1 parsers).
REASONING_END_TOKENS = ("</think>",)


class GrammarReplay:
    """Compiles grammars for one tokenizer (cached) and replays recorded tokens through them."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_ids = stop_ids
        self._compiler: xgrammar.GrammarCompiler | None = None  # made at the first grammar
        self._ll_tokenizer: Any = None  # llguidance's, made at the first grammar it replays
        self._reasoning_ends: set[int] | None = None  # read at the first reasoning reply

    def allowed_tokens(
        self, request: JsonObject, completion_ids: Sequence[int], grammar_from: int | None = 0
    ) -> tuple[bool, torch.Tensor | None]:
        """(whether the call can be scored, the bitmask of what vLLM allowed before each of its
        tokens: None where it allowed every id). `grammar_from`: the first token the grammar
        constrained (`reasoning_end`; None: it cannot be told, and the call is not scored)."""
        guided = constraint(request)
        if isinstance(guided, Unreplayable):
            return False, None
        bitmask = None
        if guided is not None:
            if grammar_from is None:
                return False, None
            bitmask = self._from(guided, completion_ids, grammar_from)
            if bitmask is None:
                return False, None
        listed = request.get("allowed_token_ids")
        if isinstance(listed, list) and listed:
            only = packed(torch.tensor([int(i) for i in listed]), self.vocab_size)
            bitmask = self._every_id(len(completion_ids)) if bitmask is None else bitmask
            bitmask &= only
        words = request.get("bad_words")
        if isinstance(words, list) and words:
            bitmask = self._every_id(len(completion_ids)) if bitmask is None else bitmask
            for position, token_id in self._bad_word_ends(words, completion_ids):
                bitmask[position] &= ~packed(torch.tensor([token_id]), self.vocab_size)
        min_tokens = request.get("min_tokens")
        if isinstance(min_tokens, int) and min_tokens > 0 and completion_ids:
            extra = request.get("stop_token_ids")
            stops = [*self._stop_ids, *(extra if isinstance(extra, list) else [])]
            eos = getattr(self.tokenizer, "eos_token_id", None)
            stop_bits = packed(
                torch.tensor([int(i) for i in stops] + ([eos] if eos is not None else [])),
                self.vocab_size,
            )
            bitmask = self._every_id(len(completion_ids)) if bitmask is None else bitmask
            early = bitmask[:min_tokens]
            without_stops = early & ~stop_bits
            # vLLM keeps the stop ids of a row its grammar leaves nothing else in.
            empty = ~(without_stops != 0).any(dim=-1, keepdim=True)
            bitmask[:min_tokens] = torch.where(empty & (guided is not None), early, without_stops)
        return True, bitmask

    def reasoning_end(self, reply: JsonObject | None, completion_ids: Sequence[int]) -> int | None:
        """Where a reply's grammar began: vLLM with a reasoning parser constrains only what the
        model writes after its reasoning ends (the end token itself is free). 0 for a reply
        without reasoning (the grammar held from its first token); the position after the end
        token; the reply's length when the reasoning never ended (nothing was constrained);
        None when the tokenizer has no single end token to find it by."""
        reasoning = (reply or {}).get("reasoning") or (reply or {}).get("reasoning_content")
        if not reasoning:
            return 0
        if self._reasoning_ends is None:
            self._reasoning_ends = self._reasoning_end_ids()
        ends = self._reasoning_ends
        if not ends:
            return None
        for position, token in enumerate(completion_ids):
            if token in ends:
                return position + 1
        return len(completion_ids)

    def _reasoning_end_ids(self) -> set[int]:
        """The ids that end a reasoning model's reasoning (`</think>`, as vLLM's qwen3 and
        deepseek_r1 parsers read it), where the tokenizer has them as one token."""
        found = set()
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        for text in REASONING_END_TOKENS:
            token = self.tokenizer.convert_tokens_to_ids(text)
            if isinstance(token, int) and token >= 0 and token != unknown:
                found.add(token)
        return found

    def _from(
        self, grammar: Grammar, completion_ids: Sequence[int], start: int
    ) -> torch.Tensor | None:
        """`allowed` for the tokens from `start` on, every id allowed before it."""
        if start == 0:
            return self.allowed(grammar, completion_ids)
        tail = self.allowed(grammar, completion_ids[start:])
        if tail is None:
            return None
        bitmask = self._every_id(len(completion_ids))
        bitmask[start:] = tail
        return bitmask

    def _bad_word_ends(
        self, words: list[Any], completion_ids: Sequence[int]
    ) -> list[tuple[int, int]]:
        """(position, id) pairs vLLM left out for `bad_words`: each word's ids (as written, and
        after a space when that makes other ids of the same count), their last id wherever the
        call's output so far ends with the others."""
        sequences: list[list[int]] = []
        for word in dict.fromkeys(w for w in words if isinstance(w, str) and w):
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if plain:
                sequences.append(plain)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
                sequences.append(spaced)
        ends = []
        for position in range(len(completion_ids)):
            past = list(completion_ids[:position])
            for ids in sequences:
                prefix = ids[:-1]
                if len(prefix) <= len(past) and past[len(past) - len(prefix) :] == prefix:
                    ends.append((position, ids[-1]))
        return ends

    def _every_id(self, rows: int) -> torch.Tensor:
        return packed(torch.arange(self.vocab_size), self.vocab_size).expand(rows, -1).clone()

    def allowed(self, grammar: Grammar, completion_ids: Sequence[int]) -> torch.Tensor | None:
        """[n, ceil(V/32)] int32: before each of the n tokens, the bitmask of the ids the grammar
        allowed there (bit i % 32 of word i // 32 for id i); None when it refuses a token."""
        import xgrammar  # only a trainer that meets a constrained call pays for it

        try:
            compiled = self._compiled(grammar)
        except (RuntimeError, ValueError):  # xgrammar cannot read it: vLLM ran llguidance
            return self._guidance_allowed(grammar, completion_ids)
        # vLLM ends a constrained call on its sampling's stop ids: EOS and the model's
        # generation_config EOS ids besides (`SamplingParams.all_stop_token_ids`).
        stop_ids = sorted({*compiled.tokenizer_info.stop_token_ids, *self._stop_ids})
        matcher = xgrammar.GrammarMatcher(compiled, override_stop_tokens=stop_ids)
        bitmask = xgrammar.allocate_token_bitmask(len(completion_ids), self.vocab_size)
        for position, token in enumerate(completion_ids):
            if matcher.is_terminated():
                return None  # vLLM stops at the grammar's end: there is nothing after it
            matcher.fill_next_token_bitmask(bitmask, position)
            if not matcher.accept_token(token):
                # Not what xgrammar allowed: the engine's backend is llguidance.
                return self._guidance_allowed(grammar, completion_ids)
        return bitmask

    def _guidance_allowed(
        self, grammar: Grammar, completion_ids: Sequence[int]
    ) -> torch.Tensor | None:
        """`allowed` as vLLM's llguidance backend masks: its tokenizer over the larger of the
        model's vocabulary and the tokenizer's, whitespace free between JSON tokens; None where
        llguidance cannot read the grammar either (vLLM then used outlines) or refuses a token."""
        import llguidance

        serialized = _guidance_grammar(grammar)
        if serialized is None:
            return None
        if self._ll_tokenizer is None:
            import llguidance.hf

            size = max(self.vocab_size, len(self.tokenizer))
            self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, size)
        matcher = llguidance.LLMatcher(self._ll_tokenizer, serialized, log_level=0)
        if matcher.is_error():
            return None
        # llguidance.torch's layout, filled as it fills it (importing it imports inductor).
        words = (self._ll_tokenizer.vocab_size + 31) // 32
        bitmask = torch.full((len(completion_ids), words), -1, dtype=torch.int32)
        for position, token in enumerate(completion_ids):
            if matcher.is_stopped():
                return None  # vLLM stops at the grammar's end: there is nothing after it
            matcher.unsafe_compute_mask_ptr(bitmask[position].data_ptr(), words * 4)
            if not matcher.consume_token(token):
                return None
        words = (self.vocab_size + 31) // 32
        if bitmask.shape[1] < words:
            bitmask = torch.nn.functional.pad(bitmask, (0, words - bitmask.shape[1]))
        return bitmask[:, :words].contiguous()

    def _compiled(self, grammar: Grammar) -> xgrammar.CompiledGrammar:
        import xgrammar

        if self._compiler is None:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size
            )
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        if grammar.kind == "json_schema":
            return self._compiler.compile_json_schema(grammar.spec, any_whitespace=True)
        if grammar.kind == "hermes_tools":
            return self._compiler.compile_structural_tag(hermes_tool_calls(grammar.spec))
        if grammar.kind == "regex":
            return self._compiler.compile_regex(grammar.spec)
        if grammar.kind == "lark":
            return self._compiler.compile_lark(grammar.spec)
        if grammar.kind == "structural_tag":
            return self._structural_tag(grammar.spec)
        return self._compiler.compile_grammar(grammar.spec)

    def _structural_tag(self, spec: str) -> xgrammar.CompiledGrammar:
        """As vLLM compiles a structural tag: its legacy `structures` (each schema re-dumped as
        JSON) with their `triggers`, else the tag as it came."""
        import xgrammar

        assert self._compiler is not None
        try:
            tag = json.loads(spec)
            if isinstance(tag, dict) and "structures" in tag:
                items = [
                    xgrammar.StructuralTagItem(
                        begin=item["begin"], schema=json.dumps(item["schema"]), end=item["end"]
                    )
                    for item in tag["structures"]
                ]
                return self._compiler.compile_structural_tag(items, tag["triggers"])
        except (ValueError, KeyError, TypeError) as exc:  # vLLM would have refused it
            raise RuntimeError(f"not a structural tag: {exc}") from exc
        return self._compiler.compile_structural_tag(spec)


def hermes_tool_calls(spec: str) -> str:
    """The structural tag vLLM 0.32 constrains a call's tool calls with for its `hermes` parser
    (art_proxy.guided_decoding describes it), as the JSON its backend compiles; `spec` holds the
    call's tools, tool_choice and parallel_tool_calls."""
    from xgrammar import StructuralTag, normalize_tool_choice
    from xgrammar.structural_tag import (
        AnyTextFormat,
        JSONSchemaFormat,
        OrFormat,
        TagFormat,
        TagsWithSeparatorFormat,
        TriggeredTagsFormat,
    )

    call = json.loads(spec)
    # Each tool's `strict` pinned: its arguments follow its schema only when it asked for that.
    tools: list[Any] = [
        {**tool, "function": {**tool["function"], "strict": tool["function"].get("strict") is True}}
        for tool in call["tools"]
        if tool.get("type", "function") == "function" and isinstance(tool.get("function"), dict)
    ]
    functions, _, choice = normalize_tool_choice(tools, call["tool_choice"])
    tags: list[Any] = []
    for tool in functions:
        strict = tool.function.strict is not False
        parameters = tool.function.parameters if strict else None
        arguments = JSONSchemaFormat(json_schema=parameters if parameters is not None else True)
        for begin, end in (("<tool_call>\n", "}\n</tool_call>"), ("<tool_call>", "}</tool_call>")):
            name = f'{begin}{{"name": "{tool.function.name}", "arguments": '
            tags.append(TagFormat(begin=name, content=arguments, end=end))
    single = call["parallel_tool_calls"] is False or choice == "forced"
    output = call.get("output")
    tag_format: Any
    if output is not None:
        # Either a tool call (as under "required") or the structured output.
        calls = TagsWithSeparatorFormat(
            tags=tags, separator="", at_least_one=True, stop_after_first=single
        )
        tag_format = OrFormat(elements=[calls, _output_format(output["kind"], output["spec"])])
    elif choice == "auto":
        tag_format = (
            TriggeredTagsFormat(triggers=["<tool_call>"], tags=tags, stop_after_first=single)
            if tags
            else AnyTextFormat()
        )
    else:
        tag_format = TagsWithSeparatorFormat(
            tags=tags, separator="", at_least_one=True, stop_after_first=single
        )
    return json.dumps(StructuralTag(format=tag_format).model_dump())


def _guidance_grammar(grammar: Grammar) -> str | None:
    """The grammar as vLLM's llguidance backend serialises it; None for a kind it does not
    take (vLLM then used outlines)."""
    import llguidance

    try:
        if grammar.kind == "json_schema":
            return str(
                llguidance.LLMatcher.grammar_from_json_schema(
                    grammar.spec, defaults={"whitespace_flexible": True}
                )
            )
        if grammar.kind == "regex":
            return str(llguidance.grammar_from("regex", grammar.spec))
        if grammar.kind in ("ebnf", "lark"):
            return str(llguidance.grammar_from("grammar", grammar.spec))
        if grammar.kind == "structural_tag":
            tag = json.loads(grammar.spec)
            tags = []
            for item in tag["structures"]:
                trigger = next(t for t in tag["triggers"] if item["begin"].startswith(t))
                schema = llguidance.LLMatcher.grammar_from_json_schema(
                    json.dumps(item["schema"]), defaults={"whitespace_flexible": True}
                )
                tags.append(
                    llguidance.StructTag(
                        trigger=trigger, begin=item["begin"], grammar=schema, end=item["end"]
                    )
                )
            return str(llguidance.StructTag.to_grammar(tags)) if tags else None
    except (ValueError, KeyError, TypeError, StopIteration):
        return None
    return None


def _output_format(kind: str, spec: str) -> Any:
    """A structured output's grammar as a structural tag's format, as vLLM maps it."""
    import xgrammar
    from xgrammar import StructuralTag
    from xgrammar.structural_tag import (
        GrammarFormat,
        JSONSchemaFormat,
        RegexFormat,
        TagFormat,
        TriggeredTagsFormat,
    )

    if kind == "json_schema":
        return JSONSchemaFormat(json_schema=json.loads(spec))
    if kind == "regex":
        return RegexFormat(pattern=spec)
    if kind == "lark":  # a format's grammar is EBNF
        return GrammarFormat(grammar=str(xgrammar.Grammar.from_lark(spec)))
    if kind == "ebnf":
        return GrammarFormat(grammar=spec)
    tag = json.loads(spec)
    if "structures" in tag:
        return TriggeredTagsFormat(
            triggers=tag["triggers"],
            tags=[
                TagFormat(
                    begin=item["begin"],
                    content=JSONSchemaFormat(json_schema=item["schema"]),
                    end=item["end"],
                )
                for item in tag["structures"]
            ],
        )
    return StructuralTag.model_validate(tag).format
