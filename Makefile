# Two commands a new user needs: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The oldest Dask lightwork supports, with numpy and pandas of its time: `make test` also
# runs the Dask tests against it, in a venv of its own.
OLDEST_VENV := .venv-oldest-dask
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_PINS := 'dask[array,bag,dataframe]==2024.11.1' 'numpy<2.2' 'pandas<2.3'
DASK_TESTS := tests/test_dask_get.py tests/test_diagnostics_callbacks.py \
	tests/test_diagnostics_profilers.py tests/test_diagnostics_plain.py

.PHONY: demo test chaos bench clean browser

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(OLDEST_STAMP): pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -e '.[test]' $(OLDEST_PINS)
	touch $(OLDEST_STAMP)

$(VENV)/.bench-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

# make demo DEMO_ARGS=--dashboard also serves the demo's live dashboard (URL printed).
demo: $(STAMP)
	$(PY) -m lightwork demo $(DEMO_ARGS)

# Pyflakes' checks first (ruff's F rules: undefined names, unused imports): a NameError on
# a rarely taken path is caught here, not by a user.
test: $(STAMP) $(OLDEST_STAMP) browser
	$(PY) -m ruff check --select F src tests
	$(PY) -m pytest -q
	$(OLDEST_VENV)/bin/python -m pytest -q $(DASK_TESTS)

# The chaos suite's full-size variants (minutes each; figures printed on stderr);
# `make test` runs scaled-down ones.
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m chaos -o timeout=900 -o faulthandler_timeout=880

bench: $(STAMP) $(VENV)/.bench-installed
	$(PY) bench/run.py
	$(PY) bench/cluster.py --json bench/cluster-results.json
	$(PY) bench/spill.py
	$(PY) bench/dashboard.py
	$(PY) bench/deep_queue.py

# Chromium, for the tests that open visualize()'s HTML and the dashboard in a real browser. Installed when
# this runs as root with apt-get (as in CI); otherwise those tests are skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } \
		|| echo "Chromium is not installed: the browser test will be skipped"

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build src/*.egg-info
