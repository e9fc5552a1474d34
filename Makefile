PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# what CI tested: every package pinned (updated on purpose, dated, in a commit of its own)
CONSTRAINTS := constraints.txt
LATEST := .venv-latest
# Google ADK and Strands cap packages below CONSTRAINTS' pins: their adapters' tests run in a
# venv of their own, pinned by FW_CONSTRAINTS
FRAMEWORKS := .venv-frameworks
FW_STAMP := $(FRAMEWORKS)/.installed
FW_CONSTRAINTS := constraints-frameworks.txt
FW_TESTS := tests/test_adk.py tests/test_strands.py tests/test_pickle.py tests/conformance/test_frameworks.py \
	tests/test_tau_frameworks.py tests/test_usage_streams_google.py tests/test_usage_streams_bedrock.py \
	tests/test_outages_frameworks.py \
	"tests/test_docs.py::test_examples_run[adk.md]" "tests/test_docs.py::test_examples_run[strands.md]"
# the benchmark: the tether-bench distribution (package tether.bench), installed editable beside
# the library so `make test` (tests/test_bench*.py) and `make bench` run this checkout's copy
BENCH := benchmarks
# CrewAI pins openai, mcp and pydantic below CONSTRAINTS' pins, and LiteLLM's newer releases
# python-dateutil (through boto3): their adapters' tests run in a venv of their own too (with
# redis: the fleet-live litellm-router scenario's Router and token budget share Redis)
CREW := .venv-crewai
CREW_STAMP := $(CREW)/.installed
CREW_CONSTRAINTS := constraints-crewai.txt
CREW_TESTS := tests/test_crewai.py tests/test_litellm.py tests/conformance/test_crewai_venv.py tests/test_outages_crewai.py \
	tests/test_crewai_threads.py tests/test_tau_crewai.py tests/test_tau_litellm.py \
	tests/test_fleet_live_litellm.py tests/test_context_reset_crewai.py \
	"tests/test_docs.py::test_examples_run[crewai.md]" "tests/test_docs.py::test_examples_run[litellm.md]"
FW_OUT := --ignore=tests/test_adk.py --ignore=tests/test_strands.py \
	--ignore=tests/test_usage_streams_google.py --ignore=tests/test_usage_streams_bedrock.py \
	--ignore=tests/conformance/test_frameworks.py --ignore=tests/test_tau_frameworks.py \
	--ignore=tests/test_crewai.py --ignore=tests/test_litellm.py --ignore=tests/test_context_reset_crewai.py \
	--ignore=tests/test_outages_frameworks.py --ignore=tests/test_outages_crewai.py \
	--ignore=tests/test_tau_crewai.py --ignore=tests/test_tau_litellm.py \
	--ignore=tests/conformance/test_crewai_venv.py --ignore=tests/test_crewai_threads.py \
	--ignore=tests/test_fleet_live_litellm.py \
	--deselect "tests/test_docs.py::test_examples_run[adk.md]" \
	--deselect "tests/test_docs.py::test_examples_run[strands.md]" \
	--deselect "tests/test_docs.py::test_examples_run[crewai.md]" \
	--deselect "tests/test_docs.py::test_examples_run[litellm.md]"

.PHONY: install test lint bench demo clean test-latest constraints constraints-frameworks \
	constraints-crewai

$(STAMP): pyproject.toml $(BENCH)/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -e '.[all,dev]' -e $(BENCH) -c $(CONSTRAINTS)
	touch $(STAMP)

$(FW_STAMP): pyproject.toml $(BENCH)/pyproject.toml $(FW_CONSTRAINTS)
	$(PYTHON) -m venv $(FRAMEWORKS)
	$(FRAMEWORKS)/bin/python -m pip install --quiet -e '.[all,adk,strands,dev]' -e $(BENCH) \
		-c $(FW_CONSTRAINTS)
	touch $(FW_STAMP)

$(CREW_STAMP): pyproject.toml $(BENCH)/pyproject.toml $(CREW_CONSTRAINTS)
	$(PYTHON) -m venv $(CREW)
	$(CREW)/bin/python -m pip install --quiet -e '.[crewai,litellm,redis,dev]' -c $(CREW_CONSTRAINTS)
	# the benchmark without its own dependencies (tether[all] would move CrewAI's pins): the
	# processes a fleet-live scenario spawns import tether.bench from the venv
	$(CREW)/bin/python -m pip install --quiet --no-deps -e $(BENCH)
	touch $(CREW_STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests $(BENCH)
	$(BIN)/ruff format --check src tests $(BENCH)
	$(BIN)/mypy --strict src $(BENCH)/src/tether/bench

test: lint $(FW_STAMP) $(CREW_STAMP)
	$(FRAMEWORKS)/bin/python -m pytest -p no:cacheprovider $(FW_TESTS)
	$(CREW)/bin/python -m pytest -p no:cacheprovider $(CREW_TESTS)
	$(BIN)/python -m pytest --cov --cov-report=term --cov-fail-under=$(COVERAGE_FLOOR) $(FW_OUT)

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
	$(LATEST)/bin/python -m pip install --quiet --upgrade -e '.[all,dev]' -e $(BENCH)
	$(LATEST)/bin/ruff check src tests $(BENCH)
	$(LATEST)/bin/mypy --strict src $(BENCH)/src/tether/bench
	$(LATEST)/bin/python -m pytest --cov --cov-report=term --cov-fail-under=$(COVERAGE_FLOOR)

# re-resolve the newest versions and write them as the constraints (commit it on its own)
constraints: test-latest
	{ echo "# Every package \`make install\` takes, pinned: resolved on $$(date -u +%F) by \`make constraints\`"; \
	  echo "# (the newest releases then, tested by \`make test-latest\`). Update on purpose, in a commit of its own."; \
	  $(LATEST)/bin/python -m pip freeze --all --exclude-editable | grep -v '^tether[= ]' | sort -f; } > $(CONSTRAINTS)

# re-resolve the frameworks venv (newest ADK and Strands with what they allow) and pin it
constraints-frameworks:
	rm -rf $(FRAMEWORKS)
	$(PYTHON) -m venv $(FRAMEWORKS)
	$(FRAMEWORKS)/bin/python -m pip install --quiet --upgrade -e '.[all,adk,strands,dev]' -e $(BENCH)
	$(FRAMEWORKS)/bin/python -m pytest -p no:cacheprovider $(FW_TESTS)
	{ echo "# Every package .venv-frameworks takes, pinned: resolved on $$(date -u +%F) by \`make constraints-frameworks\`"; \
	  $(FRAMEWORKS)/bin/python -m pip freeze --all --exclude-editable | grep -v '^tether[= ]' | sort -f; } > $(FW_CONSTRAINTS)

# re-resolve the CrewAI/LiteLLM venv (newest CrewAI and LiteLLM with what they allow) and pin it
constraints-crewai:
	rm -rf $(CREW)
	$(PYTHON) -m venv $(CREW)
	$(CREW)/bin/python -m pip install --quiet --upgrade -e '.[crewai,litellm,redis,dev]'
	$(CREW)/bin/python -m pytest -p no:cacheprovider $(CREW_TESTS)
	{ echo "# Every package .venv-crewai takes, pinned: resolved on $$(date -u +%F) by \`make constraints-crewai\`"; \
	  $(CREW)/bin/python -m pip freeze --all --exclude-editable | grep -v '^tether[= ]' | sort -f; } > $(CREW_CONSTRAINTS)

clean:
	rm -rf $(VENV) $(LATEST) $(FRAMEWORKS) $(CREW) .mypy_cache .pytest_cache .ruff_cache .coverage build dist

COVERAGE_FLOOR ?= 80
