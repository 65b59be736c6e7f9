# Two entry points: `make demo` and `make test`.  Both create .venv if it is
# missing and install the pinned requirements and the package into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# the test runs keep compiled modules (pytest's assertion-rewritten ones too) where the environment
# says not to write them: collecting the tests took 19 s a worker without them, 13 s with
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-quick test-for test-kernels test-real test-ray lint validate clean-venv

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/harness run hypotheses/induction.yaml

# lint and types first (seconds), then the test suite on two workers, each test module on one of
# them (most tests run torch on one thread), then the tests that compare a model run with numbers
# stored in the repository again under other CPU kernels and thread counts
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadfile
	@$(MAKE) --no-print-directory test-kernels

# the edit-test loop: ruff, then every test not marked slow (tests/slow_tests.txt and the slow
# modules) on two workers: under 90 s on two cores, and a run that is not says so at its end
# (tests/conftest.py); make test runs mypy and every test
test-quick: $(STAMP)
	$(BIN)/ruff check harness tests fixtures benchmarks
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile

# float32 results differ in the last digits between CPUs; these settings make this machine
# compute like others (PyTorch's portable kernels; MKL's reproducible code path and a
# different reduction order), so a stored-number comparison that holds for one kernel only
# fails here before it fails on someone else's machine (tests/committed.py has the rule)
# the tests of one file or folder, from tests/package_map.txt: make test-for P=harness/model/loading.py
test-for: $(STAMP)
	@test -n "$(P)" || { echo "usage: make test-for P=harness/PATH"; exit 2; }
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $$(awk -F: -v p="$(P)" '!/^#/ && NF > 1 && index(p, $$1) == 1 \
	    { n = split($$2, f, " "); for (i = 1; i <= n; i++) print "tests/" f[i] ".py" }' tests/package_map.txt | sort -u)

# (the two settings run side by side, one on each core, the first's output printed after the second's)
test-kernels: $(STAMP)
	@log=$$(mktemp); a=$$(mktemp -d); b=$$(mktemp -d); \
	ATEN_CPU_CAPABILITY=default HARNESS_THREADS=1 $(BIN)/python -m pytest -q -m stored_numbers -p no:cacheprovider \
	    --basetemp=$$a > $$log 2>&1 & first=$$!; \
	MKL_CBWR=COMPATIBLE HARNESS_THREADS=2 $(BIN)/python -m pytest -q -m stored_numbers -p no:cacheprovider \
	    --basetemp=$$b; second=$$?; wait $$first; code=$$?; \
	echo "ATEN_CPU_CAPABILITY=default:"; cat $$log; rm -rf $$log $$a $$b; \
	test $$code -eq 0 -a $$second -eq 0

# the opt-in tier on a real trained model (SmolLM2-135M-Instruct, about 10 minutes on two cores):
# every command and claim kind with the numbers checked for sense; it needs the model in the
# cache first (`.venv/bin/python benchmarks/real_model.py --fetch`, once), else it skips saying so
test-real: $(STAMP)
	$(BIN)/python -m pytest -q --real -m real

# the opt-in Ray tier (about 3 minutes): a sweep killed and resumed on a local Ray instance, a
# running cluster joined, a worker that dies; make test runs one Ray sweep and one crash
test-ray: $(STAMP)
	$(BIN)/python -m pytest -q --ray -m ray

lint: $(STAMP)
	$(BIN)/ruff check harness tests fixtures benchmarks
	$(BIN)/mypy

validate: $(STAMP)
	$(BIN)/harness validate hypotheses/*.yaml

clean-venv:
	rm -rf $(VENV)
