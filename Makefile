PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint bench demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
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

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .coverage build dist

COVERAGE_FLOOR ?= 80
