# The course's commands. `make lab` opens the course, `make test` runs every test; both set up
# .venv first, and set-up is a no-op (seconds) until pyproject.toml or this Makefile changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# SYSTEM_TORCH=1 keeps the torch that $(PYTHON) already has (the CUDA build of a GPU box or a hosted
# notebook), if the course runs on it (utils/torch_versions.py: 2.11-2.15): .venv sees the system's packages,
# the other pins go in beside that torch under a constraints file naming its exact version, and the course
# itself with --no-deps.
SYSTEM_TORCH ?=
STAMP  := $(VENV)/.installed-stamp$(if $(SYSTEM_TORCH),-system-torch)
# JupyterLab's defaults for the course (no "Jupyter news?" pop-up, no kernel chooser): installed by setup into
# .venv's app settings, so `make lab`, the hub's learners and the Slurm job all get them (utils/course/lab_overrides.json)
LAB_SETTINGS  := utils/course/lab_overrides.json
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/distributed-course.json
LAB_ARGS ?=
PYTEST_ARGS ?=
# JupyterLab refuses to run as root (common in workshop containers) unless told it may.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

# Prints "torch==<the installed version>" (a pip constraint), or stops: no torch, or one outside the range
# utils/torch_versions.py states (read with runpy: it imports nothing, and nothing is installed yet).
define SYSTEM_TORCH_PIN
import importlib.metadata as metadata, runpy, sys
supported = runpy.run_path("utils/torch_versions.py")
try:
    version = metadata.version("torch")
except metadata.PackageNotFoundError:
    sys.exit(f"SYSTEM_TORCH=1 keeps the torch of {sys.executable}, which has none: install torch "
             f"{supported['SUPPORTED']} there, or leave out SYSTEM_TORCH=1 and .venv gets torch 2.13.0")
if not supported["is_supported"](version):
    sys.exit(f"SYSTEM_TORCH=1: the course runs on torch {supported['SUPPORTED']}, and {sys.executable} has torch "
             f"{version}: use another Python (make PYTHON=...), or leave out SYSTEM_TORCH=1 and .venv gets torch 2.13.0")
print(f"torch=={version}")
endef
# Prints pyproject.toml's dependencies, one a line, all but torch.
define PINS_BUT_TORCH
import re, tomllib
for pin in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if re.match(r"[A-Za-z0-9_.-]+", pin).group(0).lower() != "torch":
        print(pin)
endef
export SYSTEM_TORCH_PIN PINS_BUT_TORCH
NO_SYSTEM_SITE = SYSTEM_TORCH=1: $(VENV) was made without --system-site-packages, so it cannot see the
NO_SYSTEM_SITE += system's torch: rm -rf $(VENV), then run make again
TORCH_NOT_SEEN = SYSTEM_TORCH=1: $(PYTHON)'s torch is not visible in $(VENV): is $(PYTHON) itself in a
TORCH_NOT_SEEN += virtual environment? Then install the course into that environment (README)

.PHONY: setup lab test course bench strip clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(LAB_SETTINGS)
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v <= (3, 12) else \
	  "The course needs Python 3.11 or 3.12, but $(PYTHON) is %d.%d: run make PYTHON=python3.11 ..." % v)'
ifeq ($(SYSTEM_TORCH),)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --editable .
else
	@$(PYTHON) -c "$$SYSTEM_TORCH_PIN" >/dev/null  # refuse before creating anything
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	@grep -qs "include-system-site-packages = true" $(VENV)/pyvenv.cfg || { echo "$(NO_SYSTEM_SITE)"; exit 1; }
	$(BIN)/python -c "$$SYSTEM_TORCH_PIN" > $(VENV)/system-torch.txt || { echo "$(TORCH_NOT_SEEN)"; exit 1; }
	$(BIN)/python -c "$$PINS_BUT_TORCH" > $(VENV)/pins-but-torch.txt
	$(BIN)/python -m pip install --quiet --constraint $(VENV)/system-torch.txt --requirement $(VENV)/pins-but-torch.txt
	$(BIN)/python -m pip install --quiet --no-deps --editable .
endif
	@# jsonschema 4.26 imports rfc3987-syntax at start-up where it is installed (jupyter-events asks for it), which
	@# builds a Lark grammar: ~2 s of CPU in every process that imports nbformat (papermill's per notebook, nbconvert,
	@# the grader), jsonschema issue #1428. Only jsonschema's "iri" format checks use it, and no schema installed here
	@# has that format: removed (tests/test_project.py checks that it is gone).
	$(BIN)/python -m pip uninstall --quiet --yes rfc3987-syntax 2>/dev/null || true
	@# The course's own kernel, inside .venv; JUPYTER_PATH (below, and tests/conftest.py) puts it first,
	@# so a user-wide "python3" kernel from another environment cannot take its place.
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (distributed course)" >/dev/null
	@# JupyterLab reads <sys.prefix>/share/jupyter/lab/settings/overrides.d/*.json as its defaults (jupyterlab_server's
	@# _get_overrides); a learner's own settings still win. tests/test_lab_settings.py checks them.
	mkdir -p $(dir $(LAB_OVERRIDES)) && cp $(LAB_SETTINGS) $(LAB_OVERRIDES)
	@# git strips notebook outputs when staging: nbstripout as a git filter (.gitattributes names it), keeping
	@# cell ids; not "required", so a removed .venv leaves `git add` working (the tests still refuse outputs)
	@if git rev-parse --git-dir >/dev/null 2>&1; then $(BIN)/nbstripout --install --attributes .gitattributes && \
	  git config filter.nbstripout.clean '"$(CURDIR)/$(BIN)/python" -m nbstripout --keep-id' && \
	  git config diff.ipynb.textconv '"$(CURDIR)/$(BIN)/python" -m nbstripout --keep-id -t' && \
	  git config filter.nbstripout.required false; fi
	touch $(STAMP)

lab: setup
	@# root_dir: opening a file alone would make its folder the root, and labs/ unreachable from the file browser
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(BIN)/jupyter lab $(ROOT_ARGS) --ServerApp.root_dir=$(CURDIR) $(LAB_ARGS) notebooks/00_start_here.ipynb

# pytest-xdist: TEST_WORKERS processes run the tests at once (auto: one a core, at most 4; tests/conftest.py),
# each notebook run on its own, each other test file whole; TEST_WORKERS=0 runs everything in this one process.
# Each worker runs on its own share of the cores (tests/conftest.py), and the longest notebooks start first:
# --no-loadscope-reorder keeps that order (by default xdist starts the test files with the most tests first).
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The edit loop: the unit tests less those marked slow, and only the notebooks that the change since QUICK_SINCE
# touches (the notebook, its lab's solution, its scripts, a utils module it imports: utils/course/changes.py).
QUICK_SINCE ?= HEAD
.PHONY: test-quick
test-quick: setup  ## unit tests (not slow) + the notebooks your change touches (since QUICK_SINCE=HEAD; e.g. main)
	$(BIN)/python -m pytest $(XDIST) -m "not slow" --changed-since=$(QUICK_SINCE) $(PYTEST_ARGS)

.PHONY: shown
shown: setup  ## the utils source that lessons print and your change edits, with the lessons (since QUICK_SINCE=HEAD)
	$(BIN)/python -m utils.course.shown_source --changed $(QUICK_SINCE)

course: setup  ## every notebook with its full parameters, into build/course/, then a table; then their stray output
	@# the stray check runs even where a notebook failed (its list tells more); the target fails if either does
	@status=0; $(BIN)/python -m utils.course.notebook_runner || status=$$?; \
	  $(BIN)/python -m utils.course.stray_output build/course || status=$$?; exit $$status

bench: setup  ## launch-time benchmark of run_ranks (not a test: it only measures)
	$(BIN)/python -m utils.course.bench_launch

# The mutation score of each lab's checker (utils/course/mutants): every mutant of the reference solution through the
# checker, one process each, the accepted ones through a one-process oracle; a table per lab and build/mutants/<lab>.json.
# A benchmark (about 5 s a mutant, ~680 mutants), not part of `make test`. LAB=02_ddp_lab runs one lab;
# MUTANTS_ARGS="--sample 40 --seed 0" draws a sample per lab, --limit N the first N, --list only counts them,
# --table prints the table and the misses of the last runs again.
LAB ?=
MUTANTS_ARGS ?=
.PHONY: mutants
mutants: setup  ## mutation score of every lab's checker (LAB=name for one; MUTANTS_ARGS="--sample 40 --seed 0"); build/mutants/
	$(BIN)/python -m utils.course.mutants $(if $(LAB),--lab $(LAB)) $(MUTANTS_ARGS)

.PHONY: minutes
minutes: setup  ## each notebook's minutes (reading, code, running, exercises; utils.course.minutes); MINUTES_ARGS=--write stores them
	$(BIN)/python -m utils.course.minutes $(MINUTES_ARGS)

.PHONY: test-catch-up
test-catch-up: setup  ## every notebook run alone, from its own fresh copy of the course: a learner can start anywhere (long)
	$(BIN)/python -m pytest $(XDIST) -m notebook --alone $(PYTEST_ARGS)

.PHONY: guide
guide: setup  ## rewrites TEACHING.md, the teacher's guide, from the notebooks' stated minutes and measured memory (utils.course.teaching_guide)
	$(BIN)/python -m utils.course.teaching_guide

.PHONY: test-matrix
test-matrix: setup  ## every notebook at every WORLD_SIZE from 1 to 8 it supports (metadata.course.world_sizes; long)
	$(BIN)/python -m pytest $(XDIST) -m notebook --world-sizes=1,2,3,4,5,6,7,8 $(PYTEST_ARGS)

# Another torch (a new release, before it joins utils/torch_versions.py's range): its own environment (TORCH_VENV,
# made once, reused), the whole suite there, and build/torch-$(TORCH)/report.md: the notebooks, claim pointers and
# other tests that broke (utils/course/torch_suite.py). .venv and `make test` are untouched; needs no `make setup`.
TORCH ?=
TORCH_VENV ?= build/torch-$(TORCH)/venv

.PHONY: test-torch
test-torch:  ## the whole suite on TORCH=2.15.0 in its own environment (TORCH_VENV=dir); report in build/torch-$(TORCH)/
	@test -n "$(TORCH)" || { echo "make test-torch TORCH=2.15.0: which torch release to run the suite on"; exit 1; }
	$(PYTHON) utils/course/torch_suite.py $(TORCH) --venv $(TORCH_VENV) --python $(PYTHON) --workers $(TEST_WORKERS) \
	  -- $(PYTEST_ARGS)

.PHONY: robust
robust: setup  ## one core kept busy: the notebook suite, then each timing-sensitive notebook 5 times (long)
	$(BIN)/python -m utils.course.robustness $(ROBUST_ARGS)

# Gives every cell an id (nbformat 4.5), then writes each notebook as nbstripout does, outputs removed.
define STRIP_NOTEBOOKS
import glob, uuid, nbformat
from nbstripout import strip_output
for path in sorted(glob.glob("notebooks/*.ipynb") + glob.glob("labs/*.ipynb")):
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nb.nbformat_minor = max(nb.nbformat_minor, 5)
    for cell in nb.cells:
        cell.setdefault("id", uuid.uuid4().hex[:8])
    nbformat.write(strip_output(nb, keep_output=False, keep_count=False, keep_id=True), path)
endef
export STRIP_NOTEBOOKS

strip:  ## remove outputs from every notebook (what git's nbstripout filter does on `git add`); adds missing cell ids
	$(BIN)/python -W ignore -c "$$STRIP_NOTEBOOKS"

clean:
	rm -rf build .pytest_cache

# Workshops: grade the learners' lab notebooks (utils/workshop/grade.py). SUBMISSIONS: one folder per learner,
# as nbgrader collects them (submitted/<learner>/<assignment>/<lab>.ipynb); the gradebook and feedback go to GRADEBOOK.
SUBMISSIONS ?=
GRADEBOOK ?= build/gradebook
GRADE_ARGS ?=

.PHONY: grade
grade: setup  ## grade SUBMISSIONS=folder (nbgrader's submitted/) into GRADEBOOK=build/gradebook; GRADE_ARGS=--workers N ...
	@test -n "$(SUBMISSIONS)" || { echo "make grade SUBMISSIONS=folder: the submissions, one folder per learner" \
	  "(nbgrader's submitted/<learner>/<assignment>/<lab>.ipynb)"; exit 1; }
	$(BIN)/python -m utils.workshop.grade "$(SUBMISSIONS)" "$(GRADEBOOK)" $(GRADE_ARGS)

# Optional lesson 13 (TensorFlow beside torch): its own extra, never part of `make setup`/`make test`.
# Only the extra's pins are installed (the course and its torch stay as they are, SYSTEM_TORCH=1 too).
define FRAMEWORKS_PINS
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["frameworks"]))
endef
export FRAMEWORKS_PINS
FW_STAMP := $(VENV)/.frameworks-stamp

.PHONY: frameworks test-frameworks
frameworks: $(FW_STAMP)  ## the [frameworks] extra (TensorFlow, CPU) into .venv, for notebook 13

$(FW_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -c "$$FRAMEWORKS_PINS" > $(VENV)/frameworks-pins.txt
	$(BIN)/python -m pip install --quiet --requirement $(VENV)/frameworks-pins.txt
	$(BIN)/python -m pip check
	touch $(FW_STAMP)

test-frameworks: frameworks  ## notebook 13 at its suite_world_sizes (2) and its unit tests
	$(BIN)/python -m pytest tests/test_frameworks.py tests/test_notebooks.py -k "frameworks or 13_" $(PYTEST_ARGS)

# Prints the `browser` extra of pyproject.toml (the Playwright pin), for `make browser-test`.
define BROWSER_PINS
import tomllib
print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["browser"])
endef
export BROWSER_PINS
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
EXECUTED ?=

.PHONY: site site-executed browser-test
site: setup  ## the course as a static site in build/site/ from the executed notebooks (EXECUTED=dir: prefer those)
	$(BIN)/python website/build.py $(if $(EXECUTED),--executed $(EXECUTED))

# From a fresh clone no notebook has been run, so `make site` shows every page "not executed": this runs them all
# first (make course: every notebook with its full parameters into build/course/, which the site prefers). A failing
# notebook does not stop the site: make course runs the others and marks it in its table, and its exit status is
# ignored here (the leading -: make prints "Error 1 (ignored)"), so the exit status is the site build's. Lessons
# 13a/13b need `make frameworks` (TensorFlow), or make course skips them.
site-executed: setup  ## every notebook run (make course, ~28 min on 2 cores, ~36 with make frameworks), then the site: build/site/
	-$(MAKE) --no-print-directory course
	$(MAKE) --no-print-directory site

browser-test: setup  ## JupyterLab in headless Chromium: lesson 00's %%ranks, the two widgets, lab 01a's check panel; the site offline; screenshots in build/browser/
	@command -v chromium >/dev/null || { echo "installing Debian's chromium (apt-get; Playwright downloads no browser)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }
	$(BIN)/python -m pip install --quiet $$($(BIN)/python -c "$$BROWSER_PINS")
	$(BIN)/python -m pytest tests/browser -v -rs -p no:cacheprovider $(PYTEST_ARGS)

# Teaching a workshop (README): the `teacher` extra of pyproject.toml (never part of `make setup`); the course served
# to USERS learners from this machine by JupyterHub; a check of the box; the Slurm recipe; the student release.
define TEACHER_PINS
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["teacher"]))
endef
export TEACHER_PINS
TEACHER_STAMP := $(VENV)/.teacher-stamp
USERS ?= 4
# TEACHING.md's schedule, whose notebooks make preflight asks memory for: all, one-day, two-days or three-days
SCHEDULE ?= all
HUB_PORT ?= 8000
HUB_ARGS ?=
SLURM_ARGS ?= --learners alice,bob --account dl-course --start 2026-12-01T09:00:00

.PHONY: teacher hub test-hub preflight slurm-recipe student
teacher: $(TEACHER_STAMP)  ## the [teacher] extra (JupyterHub and its proxy in Python, nbgrader) into .venv

$(TEACHER_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -c "$$TEACHER_PINS" > $(VENV)/teacher-pins.txt
	$(BIN)/python -m pip install --quiet --requirement $(VENV)/teacher-pins.txt
	$(BIN)/python -m pip check
	@# the teacher extra brings rfc3987-syntax back (jupyter-events): removed again, as `make setup` does (above)
	$(BIN)/python -m pip uninstall --quiet --yes rfc3987-syntax 2>/dev/null || true
	touch $(TEACHER_STAMP)

hub: student  ## JupyterHub serving the student release to USERS=N learners, each in a sandbox (learner1..N) on HUB_PORT; HUB_PASSWORD sets the password; HUB_ARGS="--hub-port P --proxy-api-port Q"
	$(BIN)/python -m utils.workshop.hub --users $(USERS) --port $(HUB_PORT) $(HUB_ARGS)

test-hub: teacher  ## a real hub with 4 learners running 2-rank launches at once, the seats, the Slurm recipe (slow)
	$(BIN)/python -m pytest -n 0 -v -rs tests/test_workshop_hub.py tests/test_workshop_slurm.py $(PYTEST_ARGS)

preflight: setup  ## check this box before a workshop for USERS learners following SCHEDULE: a verdict, with the fix for each failure
	$(BIN)/python -m utils.workshop.preflight --learners $(USERS) --schedule $(SCHEDULE)

slurm-recipe: setup  ## the Slurm recipe (reservation, one JupyterLab job per learner, SSH tunnel); SLURM_ARGS
	$(BIN)/python -m utils.workshop.slurm $(SLURM_ARGS)

# The course as learners get it, no reference solution anywhere (utils/workshop/student.py): an nbgrader course
# directory in build/student/, whose release/ is the course to copy to a hub or a repository.
student: teacher  ## the student release: build/student/release/ (nbgrader's layout; no labs/solutions, no USE_REFERENCE)
	$(BIN)/python -m utils.workshop.student --out build/student
