PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test quick lint bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/printery-workers

test: $(STAMP)
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || echo "browser tests skipped: no /usr/bin/chromium and chromedriver (apt-get install -y chromium chromium-driver)"
	$(BIN)/pytest -q -n 3 --dist loadfile

# The edit-run loop (README, Tests): unit and contract tests and the integration tests that
# start no process of their own and use no cluster; no fuzz, chaos, bench, browser or slow test.
QUICK := not (fuzz or chaos or bench or browser or slow or long) and (contract or not cluster) and (unit or not subprocess)

quick: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile -m "$(QUICK)"

lint: $(STAMP)
	$(BIN)/ruff check src tests examples tools
	$(BIN)/mypy --strict src
	$(BIN)/lint-imports
	$(BIN)/python tools/import_cycles.py src

bench: $(STAMP)
	$(BIN)/printery bench --events 50000 --stages 4
	$(BIN)/printery bench --rate 1000 --duration 20 --stages 4

chaos: $(STAMP)
	$(BIN)/pytest -q --long -m long
	$(BIN)/python -m tests.chaos.soak --deployments 20000 --duration $${DURATION:-600}

clean:
	rm -rf $(VENV) .printery .pytest_cache .mypy_cache .ruff_cache
