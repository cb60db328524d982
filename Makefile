# The course's commands. `make lab` opens the course, `make test` runs every test; both set up
# .venv first, and set-up is a no-op (seconds) until pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
LAB_ARGS ?=
PYTEST_ARGS ?=
# JupyterLab refuses to run as root (common in workshop containers) unless told it may.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup lab test course bench strip clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v <= (3, 12) else \
	  "The course needs Python 3.11 or 3.12, but $(PYTHON) is %d.%d: run make PYTHON=python3.11 ..." % v)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --editable .
	@# The course's own kernel, inside .venv; JUPYTER_PATH (below, and tests/conftest.py) puts it first,
	@# so a user-wide "python3" kernel from another environment cannot take its place.
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (distributed course)" >/dev/null
	touch $(STAMP)

lab: setup
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(BIN)/jupyter lab $(ROOT_ARGS) $(LAB_ARGS) notebooks/00_start_here.ipynb

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

course: setup  ## every notebook with its full parameters, into build/course/, then a table
	$(BIN)/python tests/notebook_runner.py

bench: setup  ## launch-time benchmark of run_ranks (not a test: it only measures)
	$(BIN)/python tests/benchmarks/bench_launch.py

.PHONY: robust
robust: setup  ## one core kept busy: the notebook suite, then each timing-sensitive notebook 5 times (long)
	$(BIN)/python tests/robustness.py $(ROBUST_ARGS)

strip:  ## remove outputs from every notebook before committing
	$(BIN)/jupyter nbconvert --clear-output --inplace notebooks/*.ipynb labs/*.ipynb

clean:
	rm -rf build .pytest_cache
