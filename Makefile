# Two commands on a fresh machine: `make run` (the whole pipeline) and `make test`.
# Every target bootstraps what it needs; the stamps make re-runs cheap.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP_PY  := $(VENV)/.installed
STAMP_NPM := node_modules/.installed

.PHONY: run test soak lint typecheck compile schemas bench devnet bootstrap clean

bootstrap: $(STAMP_PY) $(STAMP_NPM)

$(STAMP_PY): pyproject.toml
	@# Bootstrap output goes to stderr: stdout stays the command's own (see `run`).
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) >&2
	@$(BIN)/python -m pip install -q --upgrade pip >&2
	@$(BIN)/python -m pip install -q -e '.[dev,local]' >&2
	@touch $@

$(STAMP_NPM): package.json package-lock.json
	@npm ci --no-audit --no-fund --loglevel=error >&2
	@touch $@

# `@`: make echoes no command, so `make run ARGS="--tasks 20 --exit" | jq` reads clean JSON.
run: bootstrap
	@$(BIN)/escrowd run $(ARGS)

devnet: bootstrap
	$(BIN)/escrowd devnet

# The suite on TEST_WORKERS pytest-xdist workers (each with its own PostgreSQL and broker);
# most tests wait on processes (anvil, escrowd services, Kafka), so more workers than cores
# pay. `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 4

test: bootstrap
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

soak: bootstrap
	$(BIN)/python -m pytest -q -m soak $(PYTEST_ARGS)

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check . || true

typecheck: bootstrap
	$(BIN)/mypy schemas runtime chain indexer relayer verification lifecycle panels api escrowd

compile: $(STAMP_NPM)
	node scripts/compile_contracts.js

schemas: bootstrap
	$(BIN)/escrowd schemas export

bench: bootstrap
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache
