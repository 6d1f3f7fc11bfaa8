"""The pieces under the engine: incremental text with stop strings, and processed logprobs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from art_proxy.local.detokenizer import Detokenizer
from art_proxy.local.errors import ModelLoadError
from art_proxy.local.model_loading import (
    CACHE_DIR_ENV,
    LoadedModel,
    default_cache_dir,
    load_model,
    model_files,
)
from art_proxy.local.sampling import SamplingParams, processed_logprobs, sample


def _ids(loaded: LoadedModel, text: str) -> list[int]:
    ids: list[int] = loaded.tokenizer(text)["input_ids"]
    return ids


def test_text_released_in_deltas_adds_up_to_the_decoded_text(smollm2: LoadedModel) -> None:
    text = "Héllo wörld, ünïcode ✓ and 日本語 too."
    detokenizer = Detokenizer(smollm2.tokenizer, [], stop=())
    released = ""
    for token_id in _ids(smollm2, text):
        detokenizer.append(token_id)
        delta = detokenizer.release(final=False)
        assert "\ufffd" not in delta  # a partial character is held back, never sent
        released += delta
    detokenizer.finish()
    released += detokenizer.release(final=True)
    assert released == text


def test_a_stop_string_is_never_released(smollm2: LoadedModel) -> None:
    detokenizer = Detokenizer(smollm2.tokenizer, [], stop=("STOP", "never"))
    released = ""
    for token_id in _ids(smollm2, "one two STOP three"):
        detokenizer.append(token_id)
        released += detokenizer.release(final=detokenizer.stop_hit is not None)
        if detokenizer.stop_hit:
            break
    assert detokenizer.stop_hit == "STOP"
    assert released == detokenizer.text == "one two "


def test_greedy_reports_raw_logprobs_and_sampling_the_processed_ones() -> None:
    logits_B_V = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)
    params = [
        SamplingParams(max_tokens=1, temperature=0),
        SamplingParams(max_tokens=1, temperature=0.5),
        SamplingParams(max_tokens=1, top_p=0.6),
    ]
    logprobs_B_V = processed_logprobs(logits_B_V, params)
    assert torch.allclose(logprobs_B_V[0], torch.log_softmax(logits_B_V[0], dim=-1))
    assert torch.allclose(logprobs_B_V[1], torch.log_softmax(logits_B_V[1] / 0.5, dim=-1))
    # softmax([2, 1, 0, -1]) = [.64, .24, .09, .03]: top_p 0.6 keeps the best id alone.
    assert logprobs_B_V[2, 0] == 0 and logprobs_B_V[2, 1:].isinf().all()


def test_a_seeded_generator_replays_its_samples() -> None:
    logits_B_V = torch.randn(4, 50)
    params = [SamplingParams(max_tokens=1, top_logprobs=3)] * 4

    def draw() -> list[int]:
        generator = torch.Generator().manual_seed(11)
        return sample(logits_B_V, params, [generator] * 4).token_ids_B

    assert draw() == draw()
    sampled = sample(logits_B_V, params, [None] * 4)
    for row, logprob in enumerate(sampled.logprobs_B):
        assert len(logprob.top) == 3
        best_id, best = logprob.top[0]
        assert best_id == int(logits_B_V[row].argmax())
        assert math.isclose(best, float(torch.log_softmax(logits_B_V[row], -1).max()), rel_tol=1e-5)


def test_the_cache_dir_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == Path.home() / ".cache" / "art-proxy" / "models"


def test_a_model_that_is_neither_a_directory_nor_a_gguf_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a Hugging Face model directory"):
        load_model(str(tmp_path / "missing.bin"))


def test_the_bundled_model_was_converted_once_into_the_cache(smollm2: LoadedModel) -> None:
    cached = [
        path for path in default_cache_dir().glob("SmolLM2-135M-Instruct.Q4_1-*") if path.is_dir()
    ]
    assert any((path / "model.safetensors").is_file() for path in cached)
    assert smollm2.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert smollm2.tokenizer.chat_template


def test_a_hub_id_loads_from_the_local_hugging_face_cache_and_nothing_is_fetched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--model Qwen/Qwen2.5-7B-Instruct` finds the copy vLLM would serve, offline."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    commit = "0" * 40
    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text(commit)
    files = model_files("acme/tiny")
    assert (files.directory, files.name) == (snapshot, "acme/tiny")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        model_files("acme/absent")
