# The README's commands. Every target sets up .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
EXTRAS  ?= dev,hf,plot

.PHONY: demo test bench bench-quick check-results install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ckpt demo

# one test process per core (at most 4); `.venv/bin/python -m pytest tests/PATH` runs one part in one process
test: $(STAMP)
	$(BIN)/python -m pytest -m "not results" -n logical --maxprocesses 4

# after make bench: every committed results page names a clean commit no later code change outdates
check-results: $(STAMP)
	$(BIN)/python -m pytest -m results tests/test_results_pages.py

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
