# rollbox — see README.md. Every target installs what it needs first (idempotent).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
ROLLBOX := $(VENV)/bin/rollbox
PYTEST_ARGS ?=

# A backend that cannot run fails the tests instead of skipping them (tests/requirebackends.py)
# under CI and on the machine kind that has every backend's tools (root, bwrap, runsc, qemu).
# Elsewhere skips are allowed and listed at the end; set the variable empty to allow them here.
ALL_BACKENDS := namespace,gvisor,microvm
HAVE_ALL_TOOLS := $(shell [ "$$(id -u)" = 0 ] && command -v bwrap && command -v runsc \
	&& command -v qemu-system-x86_64)
export ROLLBOX_REQUIRE_BACKENDS ?= $(if $(or $(CI),$(HAVE_ALL_TOOLS)),$(ALL_BACKENDS))

.PHONY: setup demo test lint docs unit integration vm cgroup-v2 bench clean-cache

setup:
	@./scripts/setup.sh

demo: setup
	@./scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# The docs site (docs/ + mkdocs.yml); --strict turns a broken link or page into a failure.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# pytest's exit code 5 (nothing collected) must fail, never pass silently. Each run gets its
# own pytest temp root, so a mount an interrupted earlier run left under /tmp/pytest-of-root
# cannot break this run's temp-dir cleanup.
test: setup lint docs
	@export ROLLBOX_TEST_PG_URL=$$(./scripts/ci-services.sh) && \
	export PYTEST_DEBUG_TEMPROOT=$$(mktemp -d /var/tmp/rollbox-pytest.XXXXXX) && \
	$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	rm -rf --one-file-system "$$PYTEST_DEBUG_TEMPROOT" 2>/dev/null; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

unit: setup
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

vm: setup
	$(VENV)/bin/pytest tests/vm $(PYTEST_ARGS)

# rollbox inside a cgroup-v2 microVM guest (also part of `make test`)
cgroup-v2: setup
	$(VENV)/bin/pytest -m cgroup_v2 tests/v2 $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/baselines.py
