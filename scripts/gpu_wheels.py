"""The wheels and tokenizer the GPU checks need on a lent device machine, in `.gpu/` (ignored).

The device's image has torch, CUDA and many packages but not all of art-proxy's, and nothing can
be fetched there: this downloads, for its Python (3.12, x86_64 Linux), the wheels of every package
art-proxy and its trainer depend on (as installed here) that the image lacks or holds at another
version than the tests run (transformers, peft), and saves the bundled tokenizer, which `benchmarks/loop_check.py
--tokenizer` reads (its models are built from configs: no weights travel). Then, on the device,
from the repository root (the command benchmarks/README.md gives):

    python3 -m pip install -q --no-index --no-deps .gpu/wheels/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e trainer
    python3 benchmarks/loop_check.py --tokenizer .gpu/tokenizer && python3 benchmarks/gpu_check.py

    .venv/bin/python scripts/gpu_wheels.py      # here, before the run (carry .gpu)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".gpu"
PYTHON = "3.12"  # the image's python3 (device KINDS.md, read 2026-11)
# The image's packages (device KINDS.md, read 2026-11-17); torch and CUDA's among them.
IMAGE = [
    "absl-py",
    "accelerate",
    "aiofiles",
    "aiohappyeyeballs",
    "aiohttp",
    "aiosignal",
    "annotated-doc",
    "anyio",
    "attrs",
    "build",
    "certifi",
    "charset-normalizer",
    "click",
    "cloudpickle",
    "filelock",
    "frozenlist",
    "fsspec",
    "h11",
    "hf-xet",
    "httpcore",
    "httpx",
    "huggingface-hub",
    "idna",
    "jinja2",
    "markdown-it-py",
    "markupsafe",
    "mdurl",
    "ml-dtypes",
    "mpmath",
    "multidict",
    "networkx",
    "numpy",
    "packaging",
    "pillow",
    "pip",
    "pluggy",
    "prometheus-client",
    "propcache",
    "protobuf",
    "psutil",
    "pygments",
    "python-dateutil",
    "pyyaml",
    "regex",
    "requests",
    "rich",
    "safetensors",
    "setuptools",
    "shellingham",
    "six",
    "sympy",
    "tiktoken",
    "tokenizers",
    "torch",
    "tqdm",
    "triton",
    "typer",
    "typing-extensions",
    "urllib3",
    "uvloop",
    "wheel",
    "wrapt",
    "yarl",
    "zipp",
]
# Held by the image at another version than the tests run: carried at the pinned one.
OTHER_VERSION = {"transformers", "peft", "huggingface-hub", "tokenizers", "safetensors"}
# Never carried: the image's own build for its CUDA; and litellm (44 MB, over the 64 MiB that
# travels) and llguidance, imported only by the judge and by llguidance grammars, which the checks
# do not run.
NEVER = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|litellm|llguidance)$")


def wanted() -> list[str]:
    """art-proxy's and the trainer's dependencies (no extras), transitively, at the versions
    installed here, less what the image holds."""
    from importlib import metadata

    from packaging.requirements import Requirement

    environment = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3", "extra": ""}
    seen: dict[str, str] = {}
    todo = ["art-proxy", "art-proxy-trainer"]
    while todo:
        name = todo.pop()
        normal = re.sub(r"[-_.]+", "-", name).lower()
        if normal in seen or NEVER.match(normal):
            continue
        distribution = metadata.distribution(name)
        seen[normal] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(requirement.name)
    ours = {"art-proxy", "art-proxy-trainer"}
    return [
        f"{name}=={version}"
        for name, version in sorted(seen.items())
        if name not in ours and (name not in IMAGE or name in OTHER_VERSION)
    ]


def main() -> int:
    wheels = OUT / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels)]
    argv += ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for platform in platforms:
        argv += ["--platform", platform]
    subprocess.run([*argv, *wanted()], check=True)
    sys.path.insert(0, str(ROOT))
    from benchmarks.loop_check import bundled_tokenizer

    bundled_tokenizer(OUT / "tokenizer")
    size = sum(path.stat().st_size for path in OUT.rglob("*") if path.is_file())
    print(
        f"{len(list(wheels.glob('*.whl')))} wheels and the tokenizer in {OUT}: {size / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
