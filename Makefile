# Two commands a new user needs: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The oldest Dask and distributed lightwork supports, with numpy and pandas of its time:
# `make test` also runs the Dask tests and the cluster tests against them, in a venv of its
# own (its stamp names the version, so a change of pins builds it again).
OLDEST_DASK := 2024.11.1
OLDEST_VENV := .venv-oldest-dask
OLDEST_STAMP := $(OLDEST_VENV)/.installed-$(OLDEST_DASK)
OLDEST_PINS := 'dask[array,bag,dataframe]==$(OLDEST_DASK)' 'distributed==$(OLDEST_DASK)' \
	'numpy<2.2' 'pandas<2.3'
DASK_TESTS := tests/dask/test_dask_get.py tests/diagnostics/test_diagnostics_callbacks.py \
	tests/diagnostics/test_diagnostics_profilers.py tests/diagnostics/test_diagnostics_plain.py
# The cluster tests on the oldest distributed: the conformance suite's distributed half
# (LIGHTWORK_TEST_BACKENDS) and every cluster file but the seeds' programs, which start a
# 4-worker cluster of their own (11 s) and exercise no distributed API the others do not.
# This step costs about a minute and a half on 2 cores. test_cluster_actors.py is in it
# because its actor hand-over talks to the scheduler, which is what differs between
# versions. Left out: test_cluster_retries.py, which switches the shared scheduler's
# allowed-failures and back (a config read through run_on_scheduler, the same on every
# version).
OLDEST_CLUSTER_TESTS := tests/conformance/test_conformance.py \
	tests/engines/distributed/test_cluster_compat.py \
	tests/engines/distributed/test_cluster_sessions.py \
	tests/engines/distributed/test_cluster_state.py \
	tests/engines/distributed/test_cluster_diagnostics.py \
	tests/engines/distributed/test_cluster_callbacks.py \
	tests/engines/distributed/test_cluster_dashboard.py \
	tests/engines/distributed/test_cluster_actors.py \
	tests/engines/distributed/test_cluster_large_values.py \
	tests/engines/distributed/test_cluster_replies.py
# The runtime without its compiled module (lightwork._collector, optional: see
# src/lightwork/kernel/collector.py), as on a machine that could not build it: the
# tests of the objects it would take out of the collector, run on the fallback.
# ~25 s on 2 cores.
PURE_PYTHON_TESTS := tests/kernel/test_collector.py tests/api/test_objects.py \
	tests/api/test_tasks.py tests/engines/local/test_hot_path.py tests/kernel/test_event_log.py \
	tests/engines/local/test_deaths.py tests/api/test_actors.py \
	tests/engines/local/test_scheduler.py tests/api/test_cancel_states.py \
	tests/engines/local/test_submit_queue.py tests/engines/local/test_io_thread.py \
	tests/engines/local/test_cleanup.py tests/api/test_generators.py

.PHONY: demo test chaos bench clean browser
.PHONY: hooks install-check

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml setup.py src/lightwork/_collector.c | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(OLDEST_STAMP): pyproject.toml setup.py src/lightwork/_collector.c
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -e '.[test]' $(OLDEST_PINS)
	touch $(OLDEST_STAMP)

$(VENV)/.bench-installed: pyproject.toml setup.py src/lightwork/_collector.c | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

# make demo DEMO_ARGS=--dashboard also serves the demo's live dashboard (URL printed).
demo: $(STAMP)
	$(PY) -m lightwork demo $(DEMO_ARGS)

# The steps before the tests do not depend on each other (the two environments, Chromium,
# the install check with venvs of its own) and mostly wait on pip: they run side by side.
# Then Pyflakes' checks (ruff's F rules: undefined names, unused imports), on the
# benchmarks too: a NameError on a rarely taken path is caught here, not by a user.
test:
	$(MAKE) -j4 $(OLDEST_STAMP) browser install-check
	$(PY) -m ruff check --select F src tests bench
	$(PY) -m mypy src/lightwork
	$(PY) -m pytest -q
	$(MAKE) docs
	LIGHTWORK_PURE_PYTHON=1 $(PY) -m pytest -q $(PURE_PYTHON_TESTS)
	LIGHTWORK_TEST_BACKENDS=distributed $(OLDEST_VENV)/bin/python -m pytest -q $(DASK_TESTS) \
		$(OLDEST_CLUSTER_TESTS)

# The repository's git hooks (hooks/commit-msg: a subject of at most 72 characters, a
# blank line, the body), for everyone who runs make in a checkout. Only at the top of
# a git work tree that has hooks/: an unpacked sdist, or a copy inside another
# repository, is left alone.
hooks:
	@[ -d hooks ] && cdup=$$(git rev-parse --show-cdup 2>/dev/null) && [ -z "$$cdup" ] \
		&& [ "$$(git config core.hooksPath)" != hooks ] \
		&& git config core.hooksPath hooks && echo "git hooks: core.hooksPath set to hooks/" || true
demo test: hooks

# A wheel and an sdist built, installed in fresh venvs and run there, CLI and dashboard
# included (tests/packaging/check_install.py; about 25 s).
install-check: $(STAMP)
	$(PY) tests/packaging/check_install.py

# The chaos suite's full-size variants (minutes each; figures printed on stderr);
# `make test` runs scaled-down ones.
chaos: $(STAMP)
	$(PY) -m pytest -q -s -m chaos -o timeout=900 -o faulthandler_timeout=880

bench: $(STAMP) $(VENV)/.bench-installed
	$(PY) bench/run.py
	$(PY) bench/cluster.py --json bench/cluster-results.json
	$(PY) bench/cluster.py --hosts 3 --delay-ms 1 --json bench/cluster-hosts-results.json
	$(PY) bench/cluster_cpu.py --hosts 3 --delay-ms 1
	$(PY) bench/cluster_hops.py --json bench/cluster-hops.json
	$(PY) bench/cluster_hops.py --hosts 3 --delay-ms 1 --json bench/cluster-hops-hosts.json
	$(PY) bench/cluster_by_value.py
	$(PY) bench/spill.py
	$(PY) bench/dashboard.py
	$(PY) bench/task_profiler_cost.py
	$(PY) bench/task_profiler_cost.py --mode cprofile --rounds 4
	$(PY) bench/task_profiler_cost.py --rss
	$(PY) bench/deep_queue.py
	$(PY) bench/nested.py
	$(PY) bench/wakeups.py --json bench/wakeups.json
	$(PY) bench/readme_table.py

# The documentation site, warnings as errors (its examples run in `make test`: tests/docs).
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

# Chromium, for the tests that open visualize()'s HTML and the dashboard in a real browser. Installed when
# this runs as root with apt-get (as in CI); otherwise those tests are skipped, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } \
		|| echo "Chromium is not installed: the browser test will be skipped"

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build src/*.egg-info
