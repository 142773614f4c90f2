# The two quick-start commands: `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install install-test demo test lint lab-extension

# The demo needs flnotes alone; the tests add their extra (pytest, ruff, Ray, Flower, ...).
# No Jupyter kernel is installed: notebooks run in a kernel of this interpreter that flnotes
# makes for itself (flnotes/repro/kernel.py), never over the user's own "python3".
# JupyterLab saves the explorers' widget state with a notebook, so that a copy saved while
# they ran opens again with its controls rather than "Error displaying widget: model not
# found" (a package default in JupyterLab's overrides.d), and a small prebuilt extension keeps
# that restored state from marking the notebook unsaved (jupyter-config/). A wheel installs
# both itself; pip's editable install here did not (setuptools 84), so these targets copy them
# into the JupyterLab this Python runs.
LAB_DEFAULTS = $(PYTHON) jupyter-config/install_into_lab.py

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

# Maintainers only: rebuild the prebuilt JupyterLab extension in jupyter-config/labextension/
# from jupyter-config/widget-state-extension/ (needs node and npm; users and CI need neither).
lab-extension:
	$(PYTHON) jupyter-config/build_lab_extension.py
