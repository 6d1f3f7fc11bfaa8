"""vLLM's OpenAI server, written once over an engine seam.

The routes, request parsing, prompt handling, usage, logprobs and stream framing of `VLLM_WIRE.md`
live here; an engine (`engine.InferenceEngine`) supplies only what it alone knows: how it renders
and tokenizes a prompt, what it generates, and which LoRA adapters it holds. Two engines plug in:
the real model of `art-proxy local-llm` (`art_proxy.local.served`) and the scripted fake the tests
run against (`art_proxy.testing.fake_engine`), so both answer alike by construction.
"""
