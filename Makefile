# cpu-grpo: `make demo` runs the default job; `make test` runs the test suite. Both install what they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On this project's machines `pip install torch==2.13.0` finds it on disk; elsewhere
# add the CPU wheel index, e.g. make TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# The web app's browser tests drive Debian's chromium (Playwright's own browser download does not work here).
CHROMIUM ?= /usr/bin/chromium

.PHONY: install demo test test-fast lint docs clean-venv

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_INDEX) "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@# jemalloc: `cpu-grpo train` runs on it where the system has it (half the memory of glibc's malloc); as root on
	@# Debian/Ubuntu it is installed here, elsewhere `cpu-grpo doctor` says how
	ldconfig -p 2>/dev/null | grep -q libjemalloc || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends libjemalloc2' || echo "note: libjemalloc2 not installed: training uses glibc's malloc (more memory)"
	@# bubblewrap: the sandbox that model-written code runs in (code rewards); without it they are refused unless
	@# --allow-unisolated-code (docs/tasks.md)
	command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap' || echo "note: bubblewrap not installed: code rewards are refused (docs/tasks.md says how to install it)"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/cpu-grpo demo

# the full suite, what CI runs; as root (CI) it installs Debian's chromium for the browser test and nftables for
# the lossy-link test (tests/train/test_netns.py), otherwise those tests are skipped with the command to install them;
# llama-cpp-python compiles llama.cpp (~6 minutes on 2 cores, once) for the test that llama.cpp reads our GGUF files
test: install
	$(BIN)/python -c "import reasoning_gym" 2>/dev/null || $(BIN)/python -m pip install -q "reasoning-gym==0.1.25" || echo "note: reasoning-gym did not install (its pycosat needs a C compiler): the rg: task tests are skipped"
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || $(BIN)/python -m pip install -q "llama-cpp-python==0.3.36" || echo "note: llama-cpp-python did not build (it needs cmake and a C++ compiler): the llama.cpp test is skipped"
	test -x $(CHROMIUM) || [ "$$(id -u)" != 0 ] || env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends chromium'
	command -v nft >/dev/null || [ "$$(id -u)" != 0 ] || env DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends nftables' || echo "note: nftables not installed: the lossy-link test is skipped"
	$(BIN)/python -m pytest
	$(BIN)/ruff check src tests bench experiments examples

# the edit loop: everything but end-to-end training, the browser and the real model
test-fast: install
	$(BIN)/python -m pytest -m "not slow and not browser and not realmodel"

docs: install
	$(BIN)/python -c "from cpu_grpo.config import reference; print(reference(), end='')" > docs/config.md

lint: install
	$(BIN)/ruff check src tests bench experiments examples

clean-venv:
	rm -rf $(VENV)
