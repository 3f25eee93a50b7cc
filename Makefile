# effectgate: every target bootstraps what it needs (uv via pip; PostgreSQL via apt-get as root).
SHELL := /bin/bash
.DEFAULT_GOAL := help
# uv as a module of the same python3 that pip installs it into: no PATH or shim surprises.
UV ?= python3 -m uv
PY := $(UV) run --frozen python
# pytest-xdist workers for make test (the machine CI uses has 2 cores); PYTEST_WORKERS=0 runs serially
PYTEST_WORKERS ?= 2

.PHONY: help uv sync demo test check lint typecheck pytest proofs compat notebooks bench browser serve pg-start pg-stop clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

uv: ## install uv with pip when it is missing
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv \
	  || python3 -m pip install --quiet --user --break-system-packages uv

sync: uv ## create .venv from uv.lock (all workspace members, dev tools), bytecode compiled
	@$(UV) sync --frozen --all-packages --quiet --compile-bytecode
	@$(PY) -m compileall -q core/src integrations/*/src

demo: sync ## the shop demo on the embedded SQLite default
	@$(UV) run --frozen effectgate demo

lint: sync ## ruff lint + format check
	@$(UV) run --frozen ruff check .
	@$(UV) run --frozen ruff format --check .

typecheck: sync ## mypy --strict on core/src and the adapters
	@$(UV) run --frozen mypy core/src integrations/*/src

check: lint typecheck ## lint and types

pg-start: sync ## start the throwaway PostgreSQL server on 127.0.0.1
	@$(PY) tests/pgserver.py start

pg-stop:
	@$(PY) tests/pgserver.py stop

browser: sync ## Debian's chromium for the browser tests (apt-get when root and missing)
	@$(PY) tests/web/browser.py >/dev/null || echo "no chromium: the browser tests will skip (fail under CI)" >&2

pytest: sync browser
	@$(PY) tests/pgserver.py start >/dev/null; status=$$?; \
	if [ $$status -ne 0 ] && [ "$${CI:-}" = "true" ]; then echo "CI: PostgreSQL could not start" >&2; exit 1; fi; \
	$(UV) run --frozen pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	$(PY) tests/pgserver.py stop; exit $$rc

serve: sync ## the reviewer inbox on the demo database (after make demo), approvers in approvers.toml
	@$(UV) run --frozen effectgate serve --db sqlite:///effectgate-demo.db --app effectgate.examples.shop:app \
	  --approvers $${APPROVERS:-approvers.toml}

notebooks: sync ## run every notebook and store its outputs (CI checks they are current)
	@$(UV) run --frozen python -m tests.notebooks

bench: sync ## benchmarks: ratios measured in one run
	@$(UV) run --frozen python -m benchmarks

test: check pytest ## the whole suite: lint, types, tests (SQLite and PostgreSQL), notebooks, bench smoke

proofs: sync ## the kill and race proofs at full size (make test runs them smaller; EFFECTGATE_PROOFS=long)
	@$(MAKE) --no-print-directory pytest PYTEST_ARGS="tests/proofs" EFFECTGATE_PROOFS=long

compat: uv ## the adapter suites on the lowest and the newest framework versions each adapter declares
	@UV="$(UV)" python3 tests/compat.py

clean:
	rm -rf .pgtest .pgtest.lock .pytest_cache .mypy_cache .ruff_cache .compat artifacts effectgate-demo.db*
