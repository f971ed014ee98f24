# Two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/commsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,calibrate]'
	touch $@

.PHONY: install demo test lint bench clean
install: $(BIN)/commsim

demo: install
	$(BIN)/commsim plan

test: install
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/bench_closed_form.py
	$(BIN)/python benchmarks/bench_graph.py
	$(BIN)/python benchmarks/bench_planner.py
	$(BIN)/python benchmarks/bench_scale.py

clean:
	rm -rf $(VENV) build *.egg-info
