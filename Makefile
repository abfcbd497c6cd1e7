# Two commands a new user needs: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(VENV)/.bench-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

demo: $(STAMP)
	$(PY) -m lightwork demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP) $(VENV)/.bench-installed
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info
