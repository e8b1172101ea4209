# Two commands for a fresh machine: `make run` and `make test`.
# On a CPU machine the local torch==2.13.0 CPU build is installed first, so nothing pulls the CUDA
# wheels. On a GPU machine (nvidia-smi present) the venv sees the user's own torch instead.
VENV ?= .venv
PY := $(VENV)/bin/python
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
# the venv's tools (ninja for the CPU kernel build) come first
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install run test test-browser bench docs clean

$(VENV)/.installed: pyproject.toml constraints.txt
ifeq ($(HAS_GPU),1)
	python3 -m venv --system-site-packages $(VENV)
else
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
endif
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m mmspec generate

test: install
	$(PY) -m pytest -q -n auto tests

# the demos (demos/*.py) driven in Debian's Chromium by Playwright; screenshots in tests/browser/out/
test-browser: install
	$(PY) -m pip install -q -c constraints.txt -e ".[demo]" playwright
	bash demos/install_browser.sh
	MMSPEC_BROWSER=1 $(PY) -m pytest -q tests/browser

bench: install
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) -m mmspec bench all --plot

# the docs site into site/ from docs/ and the docstrings, offline, warnings as errors
docs: install
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) *.egg-info site
