# The two set-up commands of the README. Each installs what it needs into .venv first.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# The default run: the GPU layout where torch sees a GPU, else the co-located CPU layout.
TOPOLOGY ?= $(shell $(PY) -c 'import torch; print("topologies/doom_basic_gpu.yaml" \
	if torch.cuda.is_available() else "topologies/doom_basic.yaml")' 2>/dev/null \
	|| echo topologies/doom_basic.yaml)
ARGS ?= --max-frames 1000000

.PHONY: install run test lint clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	# Sample Factory's VizDoom scenario files (doom_battle, doom_deathmatch_bots, ...), which
	# sfbus does not ship; without its dependencies, which gymnasium 1 conflicts with and the
	# files do not need (nothing imports the package).
	$(PY) -m pip install --quiet --no-deps sample-factory==2.1.1
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/sfbus run $(TOPOLOGY) $(ARGS)

# install-test-deps.sh adds the Prometheus server and promtool (Debian package) when it can;
# without them the Prometheus test skips, or fails under CI=true.
test: install
	sh scripts/install-test-deps.sh
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check sfbus sfbus_components examples bench tests

clean:
	$(VENV)/bin/sfbus clean || true
	rm -rf runs .pytest_cache
