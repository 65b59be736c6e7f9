# Two entry points: `make demo` and `make test`.  Both create .venv if it is
# missing and install the pinned requirements and the package into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint validate clean-venv

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/harness run hypotheses/induction.yaml

# lint and types first (seconds), then the test suite
test: lint
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check harness tests fixtures
	$(BIN)/mypy

validate: $(STAMP)
	$(BIN)/harness validate hypotheses/*.yaml

clean-venv:
	rm -rf $(VENV)
