# scaletrain: `make demo` shows the whole job on a local cluster; `make test` runs the whole test suite.
# Both do the full set-up first, and a second run redoes nothing (stamp files under .venv/).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
TORCH_VERSION := 2.13.0
APT_PACKAGES := openmpi-bin libopenmpi-dev openssh-server shellcheck debootstrap iproute2
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: setup demo test lint apt clean rehearsal

setup: apt $(VENV)/.installed node_modules/.installed rehearsal

# The rehearsal nodes' root (launch local up), built by the image recipe's own scripts: minutes the first time,
# then from the cache under ~/.cache/scaletrain/rehearsal (keyed by the recipe and the source). Needs root.
rehearsal: $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ]; then $(VENV)/bin/launch local build; \
	else echo "not root: no rehearsal nodes (launch local up --loopback works without them)"; fi

# System packages: only what is missing is installed (root, or sudo when there is one).
apt:
	@missing=""; \
	command -v mpirun >/dev/null || missing="$$missing openmpi-bin"; \
	command -v mpicxx >/dev/null || missing="$$missing libopenmpi-dev"; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
	  echo "installing:$$missing"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(VENV)/bin/python
	$(PIP) install --quiet --upgrade pip setuptools wheel
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	touch $@

$(VENV)/.horovod: $(VENV)/.torch scripts/build-horovod.sh
	bash scripts/build-horovod.sh $(PY)
	touch $@

$(VENV)/.installed: $(VENV)/.horovod pyproject.toml
	$(PIP) install --quiet -e '.[train,infra,dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

lint: setup
	$(VENV)/bin/ruff check .

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -n 2 --durations=25

demo: setup
	bash scripts/demo.sh

clean:
	rm -rf $(VENV) node_modules cdk.out
