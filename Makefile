# The two commands (see README):  make report   -- run every notebook, write the HTML report
#                                 make test     -- run the tests
# Both work on a fresh machine with Python >= 3.10 and pip: they create .venv and install what is missing.
# The venv sees the system's packages (--system-site-packages), so a GPU build of torch already installed
# there is used as it is and never replaced. Only when no torch is importable is $(TORCH) installed.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
ARGS   ?=

.PHONY: setup report test test-fast test-gpu test-browser lab wheelhouse clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed

report: setup                 ## every notebook, preset for this machine (configs/gpu.yaml or cpu-smoke.yaml)
	$(VENV)/bin/kit run $(ARGS)

test: setup                   ## every CPU test (what CI runs); -v names each test as it starts
	$(PY) -m pytest -v --durations=15 $(ARGS)

test-fast: setup              ## the edit loop: CPU tests not marked slow (no whole-notebook or many-rank runs)
	$(PY) -m pytest -m "not slow and not gpu" $(ARGS)

test-gpu: setup               ## tests marked gpu (most need 2 CUDA GPUs; one-GPU paths need 1)
	$(PY) -m pytest -m gpu $(ARGS)

$(VENV)/.lab-installed: $(VENV)/.installed
	$(PY) -m pip install -e ".[lab]"
	touch $@

# make lab ARGS="--ip=0.0.0.0 --no-browser --IdentityProvider.token=SECRET"; as root --allow-root is added
lab: $(VENV)/.lab-installed   ## JupyterLab on the notebooks (JupyterLab installed once)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(ARGS)

$(VENV)/.browser-installed: $(VENV)/.installed
	$(PY) -m pip install selenium
	touch $@

# the newest report in headless Chromium (apt-get install -y chromium chromium-driver); not part of make test / CI
# make test-browser ARGS="results/reports/<run-id> --screenshots docs/screenshots"
test-browser: $(VENV)/.browser-installed  ## every page of the last report: images load, no error cell
	$(PY) tests/browser/check_report.py $(ARGS)

wheelhouse: setup             ## wheels for an offline node: make wheelhouse ARGS="wheels --python-version 3.12"
	$(VENV)/bin/kit wheelhouse $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info
