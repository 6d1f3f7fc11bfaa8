"""What local-llm says while it loads: a first start converts the bundled GGUF (tens of seconds, a
few minutes on a busy machine) and says so, once; later starts read the converted weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from art_proxy.local.errors import ModelLoadError
from art_proxy.local.model_loading import bundled_gguf, load_model


def test_loading_says_each_slow_stage_and_converts_once(tmp_path: Path) -> None:
    said: list[str] = []
    first = load_model(None, cache_dir=tmp_path, say=said.append)
    assert said[0].startswith(f"converting {bundled_gguf().name} into {tmp_path}")
    assert said[0].endswith("(once per machine: later starts read it)")
    assert said[1] == f"reading the weights in {next(tmp_path.iterdir())}"
    said.clear()
    again = load_model(None, cache_dir=tmp_path, say=said.append)
    assert [line.split(" in ")[0] for line in said] == ["reading the weights"]
    assert again.default_name == first.default_name


def test_the_device_and_dtype_follow_what_torch_has() -> None:
    from art_proxy.local.cli import serving_device
    from art_proxy.local.model_loading import weights_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert weights_dtype("auto", cpu) == torch.float32
    assert weights_dtype("auto", cuda) == torch.bfloat16
    assert weights_dtype("bfloat16", cpu) == torch.bfloat16
    assert serving_device("cpu") == cpu
    if torch.cuda.is_available():
        assert serving_device("auto").type == "cuda"
        return
    assert serving_device("auto") == cpu
    with pytest.raises(ModelLoadError, match=r"--device cuda: torch .* sees no CUDA device"):
        serving_device("cuda")
