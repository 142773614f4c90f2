# The two quick-start commands: `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install install-test demo test lint

# The demo needs flnotes alone; the tests add their extra (pytest, ruff, Ray, Flower, ...).
# No Jupyter kernel is installed: notebooks run in a kernel of this interpreter that flnotes
# makes for itself (flnotes/repro/kernel.py), never over the user's own "python3".
# JupyterLab saves the explorers' widget state with a notebook, so that a copy saved while
# they ran opens again with its controls rather than "Error displaying widget: model not
# found": a package default (jupyter-config/) in JupyterLab's overrides.d. A wheel installs it
# itself; pip's editable install here did not (setuptools 84), so these targets copy it into
# the settings of the JupyterLab this Python runs.
HERE := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
LAB_DEFAULTS = $(PYTHON) -c "import pathlib, shutil; \
  from jupyterlab.commands import get_app_dir; \
  d = pathlib.Path(get_app_dir(), 'settings', 'overrides.d'); d.mkdir(parents=True, exist_ok=True); \
  shutil.copy('$(HERE)jupyter-config/flnotes-widget-state.json', d)"

install:
	$(PIP_INSTALL) -e .
	@$(LAB_DEFAULTS)

install-test:
	$(PIP_INSTALL) -e '.[test]'
	@$(LAB_DEFAULTS)

demo: install
	$(PYTHON) -m flnotes demo --out out/demo

# pytest exits with 5 when it collected no tests: that is a failure here, not a pass.
# Two workers (pytest-xdist), each file on one of them (its module fixtures, JupyterLab and
# Ray, start once), one torch thread each: the 2-core CI machine is busy with both, and two
# threads per process there are slower than one. TEST_WORKERS=0 runs them in this process.
# No test uses pytest-benchmark; where it is installed it warns under xdist: not loaded.
TEST_WORKERS ?= 2
test: install-test
	$(PYTHON) -m ruff check flnotes tests
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest tests notebooks --nbval-lax \
	  --sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -p no:benchmark \
	  -n $(TEST_WORKERS) --dist loadfile; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
