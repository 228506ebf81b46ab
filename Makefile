# fedplat: two commands on a fresh Debian (bookworm) machine with Python 3.11.
#   make demo   installs everything, then runs the Fashion-MNIST demo
#   make test   installs everything, then runs lint, types and the whole test suite
#   make test-fast  the same without the integration tests (real processes, browsers)
# System packages need root: run as root, or have sudo (SUDO is picked automatically).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := dataset-fashion-mnist postgresql chromium podman buildah runc debootstrap g++
EXTRAS ?= dev,postgres,ui,export,flower,ray

.PHONY: setup system-deps venv demo test test-fast lint proto clean

setup: system-deps venv

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

venv:
	@# A venv left half-made by an interrupted run is rebuilt.
	@$(PY) -m pip --version >/dev/null 2>&1 || rm -rf $(VENV)
	@[ -x $(PY) ] || $$(command -v $(PYTHON) || command -v python3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"

demo: setup
	$(VENV)/bin/fedplat demo

test: setup
	bash scripts/run_tests.sh

test-fast: setup
	bash scripts/run_tests.sh -m 'not integration and not slow'

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PATH=$(abspath $(VENV))/bin:$$PATH bash scripts/typecheck.sh

proto:
	PATH=$(VENV)/bin:$$PATH bash scripts/gen_proto.sh

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
