# make demo: fit, save, export to ONNX and reload flow heads on the embedded defaults; print
# before/after (each step says what it does; progress bars while it encodes and trains)
# make test: the documentation build (warnings as errors), then the whole test suite, a
# process per CPU (pytest-xdist)
# make docs: the documentation site (docs/, with the API reference) into build/site
# Both create .venv on first use: the CPU build of torch first, then bertflow and its extras.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test docs lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[demo,st,export,retrieval,plots,dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/python experiments/demo.py

test: $(STAMP) docs
	$(BIN)/python -m pytest -n auto --dist loadgroup

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check bertflow tests experiments

clean:
	rm -rf $(VENV) checkpoints/demo .pytest_cache build/site
