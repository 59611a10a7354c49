# rollbox — see README.md. Every target installs what it needs first (idempotent).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
ROLLBOX := $(VENV)/bin/rollbox
PYTEST_ARGS ?=

.PHONY: setup demo test lint unit integration vm bench clean-cache

setup:
	@./scripts/setup.sh

demo: setup
	@./scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# pytest's exit code 5 (nothing collected) must fail, never pass silently.
test: setup lint
	@export ROLLBOX_TEST_PG_URL=$$(./scripts/ci-services.sh) && \
	$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

unit: setup
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

vm: setup
	$(VENV)/bin/pytest tests/vm $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/baselines.py
