# crewbot: `make run` sets everything up and starts the bot; `make test` sets everything up and runs the checks.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup engine image host-image test-deps lint test test-deploy test-kubernetes test-stress run bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# A Docker engine (installs Debian's docker.io and starts dockerd without a bridge when none runs).
engine:
	bash scripts/docker-engine.sh

# The subagent image, built when missing or stale (its agent code, its base or SUBAGENT_IMAGE_PACKAGES/APT
# changed: seconds without tools), with a local debootstrap base when no registry answers.
image: setup engine
	$(PY) -m runner.runtimes.image

# The bot's own image, crewbot-host:latest (deploy/Dockerfile.host), on the subagent image's base: its wheels
# are built here into deploy/wheels first (a minute or two), so the image build needs no package index.
host-image: setup engine
	$(PY) scripts/host_image.py

# What the tests need besides the engine and the image (a static busybox for the Docker runtime tests).
test-deps:
	bash scripts/test-deps.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_import_cycles.py
	$(PY) scripts/check_module_size.py

test: lint image test-deps
	$(VENV)/bin/pytest -m "not kubernetes and not deploy"

# Not part of `make test` (a few minutes: every wheel and an image build): the host image (deploy/Dockerfile.host)
# built from a copy of these sources, run against this engine, a subagent run from inside it (tests/deploy/).
test-deploy: image
	$(VENV)/bin/pytest -m deploy

# The Kubernetes backend's tests against the cluster at KUBECONFIG (skipped, saying why, without one). With the
# test kit (../shared/kube: `export KUBECONFIG=$$(bash ../shared/kube/up.sh | tail -n1)`) the subagent image and
# the bot's own (host-image: deploy/kubernetes runs in a pod, tests/runner/kube/test_kube_in_cluster.py) are
# loaded into its node first; another cluster's node must have crewbot-agent:latest and crewbot-host:latest.
KUBE_KIT ?= ../shared/kube
test-kubernetes: image
	@if [ -z "$$KUBECONFIG" ]; then \
	  echo "test-kubernetes: skipped: no KUBECONFIG (start the kit: export KUBECONFIG=\$$(bash $(KUBE_KIT)/up.sh | tail -n1))"; \
	  exit 0; fi
	@if [ -f $(KUBE_KIT)/load-image.sh ] && [ "$$KUBECONFIG" = /var/lib/crewbot-kube/admin.kubeconfig ]; then \
	  $(MAKE) --no-print-directory host-image \
	  && bash $(KUBE_KIT)/load-image.sh crewbot-agent:latest crewbot-host:latest >&2; fi
	$(VENV)/bin/pytest -m kubernetes

# Not part of `make test`: the Docker tests ROUNDS times (default 3) with every core busy, to shake out races.
ROUNDS ?= 3
test-stress: image test-deps
	$(PY) scripts/stress.py --rounds $(ROUNDS) -- -m docker -p no:cacheprovider

# Subagents need the engine and the image; without them the bot still answers and says why spawns fail.
run: setup
	@bash scripts/docker-engine.sh && $(PY) -m runner.runtimes.image \
	  || echo "crewbot: no Docker engine or subagent image: the bot runs, subagents will fail until there is one"
	$(PY) -m crewbot run

bench: image
	$(PY) -m bench

# The documentation site from docs/ into site/ (mkdocs.yml), the settings reference regenerated from the model first.
docs: setup
	$(PY) -m crewbot.settings_reference
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build site .mypy_cache .ruff_cache .pytest_cache
