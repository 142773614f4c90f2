# The two quick-start commands: `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install install-test demo test lint

# The demo needs flnotes alone; the tests add their extra (pytest, ruff, Ray, Flower, ...).
# No Jupyter kernel is installed: notebooks run in a kernel of this interpreter that flnotes
# makes for itself (flnotes/repro/kernel.py), never over the user's own "python3".
install:
	$(PIP_INSTALL) -e .

install-test:
	$(PIP_INSTALL) -e '.[test]'

demo: install
	$(PYTHON) -m flnotes demo --out out/demo

# pytest exits with 5 when it collected no tests: that is a failure here, not a pass.
# Two workers (pytest-xdist), each file on one of them (its module fixtures, JupyterLab and
# Ray, start once), one torch thread each: the 2-core CI machine is busy with both, and two
# threads per process there are slower than one. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: install-test
	$(PYTHON) -m ruff check flnotes tests
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest tests notebooks --nbval-lax \
	  --sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadfile; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
