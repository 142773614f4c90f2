# The two quick-start commands: `make demo` (main job) and `make test` (test suite).
PYTHON ?= python3
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check

.PHONY: install demo test lint

install:
	$(PIP_INSTALL) -e '.[test]'
	$(PYTHON) -m ipykernel install --user --name python3 >/dev/null

demo: install
	$(PYTHON) -m flnotes demo --out out/demo

# pytest exits with 5 when it collected no tests: that is a failure here, not a pass.
test: install
	$(PYTHON) -m ruff check flnotes tests
	$(PYTHON) -m pytest tests notebooks --nbval-lax --sanitize-with tests/nbval_sanitize.cfg \
	  -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
