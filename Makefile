# Two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# --no-compile: no bytecode for every file of every wheel (torch's thousands: ~20 s of a
# ~55 s install on 2 cores); Python compiles and caches the modules a run imports.
$(BIN)/commsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[dev,calibrate]'
	touch $@

.PHONY: install demo test lint bench clean
install: $(BIN)/commsim

demo: install
	$(BIN)/commsim plan

# Two phases: the tests that time nothing on every core (pytest-xdist; torch tests that only
# count bytes are marked shared), then the tests that time real processes and shaped links
# (root, torch) alone, so that nothing else shares the cores.
test: install
	$(BIN)/pytest -q -n auto -m "not root and not torch or shared"
	$(BIN)/pytest -q -m "(root or torch) and not shared"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/bench_closed_form.py
	$(BIN)/python benchmarks/bench_graph.py
	$(BIN)/python benchmarks/bench_planner.py
	$(BIN)/python benchmarks/bench_scale.py

clean:
	rm -rf $(VENV) build *.egg-info
