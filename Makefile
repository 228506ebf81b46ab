# fedplat: two commands on a fresh Debian (bookworm) machine with Python 3.11.
#   make demo   installs what the demo needs, then runs the Fashion-MNIST demo
#   make test   installs everything, then runs lint, types and the whole test suite
#   make test-fast  the same without the integration tests (real processes, browsers)
# System packages need root: run as root, or have sudo (SUDO is picked automatically).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The demo needs only the dataset; the tests need PostgreSQL, a browser (UI
# tests), the container tools (image tests) and g++ (compiled robust kernels).
DEMO_APT := dataset-fashion-mnist
APT_PACKAGES ?= $(DEMO_APT) postgresql chromium podman buildah runc debootstrap g++
EXTRAS ?= dev,postgres,ui,export,flower,ray

.PHONY: setup demo-setup system-deps venv demo test test-fast lint proto clean

setup: system-deps venv

# What `make demo` needs and no more: the dataset and fedplat's own dependencies.
demo-setup:
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(DEMO_APT)"
	@$(MAKE) --no-print-directory venv EXTRAS=

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
	$(PY) -m pip install -q -e "$(if $(EXTRAS),.[$(EXTRAS)],.)"

demo: demo-setup
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
