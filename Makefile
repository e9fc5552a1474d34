PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# what CI tested: every package pinned (updated on purpose, dated, in a commit of its own)
CONSTRAINTS := constraints.txt
LATEST := .venv-latest

.PHONY: install test lint bench demo clean test-latest constraints

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -e '.[all,dev]' -c $(CONSTRAINTS)
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy --strict src

test: lint
	$(BIN)/python -m pytest --cov --cov-report=term --cov-fail-under=$(COVERAGE_FLOOR)

bench: $(STAMP)
	$(BIN)/tether bench

demo: $(STAMP)
	$(BIN)/tether demo

# the same gates on the newest release of every dependency (no constraints), in a venv of
# its own: what the next `make constraints` would bring
test-latest:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade -e '.[all,dev]'
	$(LATEST)/bin/ruff check src tests
	$(LATEST)/bin/mypy --strict src
	$(LATEST)/bin/python -m pytest --cov --cov-report=term --cov-fail-under=$(COVERAGE_FLOOR)

# re-resolve the newest versions and write them as the constraints (commit it on its own)
constraints: test-latest
	{ echo "# Every package \`make install\` takes, pinned: resolved on $$(date -u +%F) by \`make constraints\`"; \
	  echo "# (the newest releases then, tested by \`make test-latest\`). Update on purpose, in a commit of its own."; \
	  $(LATEST)/bin/python -m pip freeze --all --exclude-editable | grep -v '^tether[= ]' | sort -f; } > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) $(LATEST) .mypy_cache .pytest_cache .ruff_cache .coverage build dist

COVERAGE_FLOOR ?= 80
