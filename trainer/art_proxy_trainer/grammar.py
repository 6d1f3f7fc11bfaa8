"""Replaying the grammar vLLM constrained a call with, to know what it allowed at every token.

vLLM masks the logits with its grammar's bitmask before its sampler sees them (so before the logit
bias, penalties, temperature and filters), and its processed logprobs are of that masked
distribution. The trainer compiles the same grammar (`art_proxy.guided_decoding` says which) with
the same engine, xgrammar, for the same tokenizer and vocabulary size, and walks the recorded
tokens through a matcher, keeping before each token the bitmask of the tokens allowed there. A
recorded token the grammar refuses, or a grammar xgrammar cannot compile (vLLM then used another
backend), means the replay is not what vLLM ran: the call is not scored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from art_proxy.guided_decoding import Grammar

if TYPE_CHECKING:
    import xgrammar


class GrammarReplay:
    """Compiles grammars for one tokenizer (cached) and replays recorded tokens through them."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_ids = stop_ids
        self._compiler: xgrammar.GrammarCompiler | None = None  # made at the first grammar

    def allowed(self, grammar: Grammar, completion_ids: Sequence[int]) -> torch.Tensor | None:
        """[n, ceil(V/32)] int32: before each of the n tokens, the bitmask of the ids the grammar
        allowed there (bit i % 32 of word i // 32 for id i); None when it refuses a token."""
        import xgrammar  # only a trainer that meets a constrained call pays for it

        try:
            compiled = self._compiled(grammar)
        except RuntimeError:  # xgrammar cannot read it, so vLLM compiled it with llguidance
            return None
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
                return None
        return bitmask

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
        return self._compiler.compile_grammar(grammar.spec)


def hermes_tool_calls(spec: str) -> str:
    """The structural tag vLLM 0.32 constrains a call's tool calls with for its `hermes` parser
    (art_proxy.guided_decoding describes it), as the JSON its backend compiles; `spec` holds the
    call's tools, tool_choice and parallel_tool_calls."""
    from xgrammar import StructuralTag, normalize_tool_choice
    from xgrammar.structural_tag import (
        AnyTextFormat,
        JSONSchemaFormat,
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
    tag_format: Any
    if choice == "auto":
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


def allowed_mask(bitmask_N_W: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """[N, vocabulary] bool from packed bitmasks (ids past the bitmask's width: not allowed)."""
    bits_W_32 = torch.arange(32, device=bitmask_N_W.device, dtype=torch.int32)
    unpacked_N_B = ((bitmask_N_W[:, :, None] >> bits_W_32) & 1).flatten(1).bool()
    width = unpacked_N_B.shape[1]
    if width >= vocabulary:
        return unpacked_N_B[:, :vocabulary]
    return torch.nn.functional.pad(unpacked_N_B, (0, vocabulary - width))
