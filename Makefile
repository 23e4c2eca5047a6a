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

.PHONY: setup report test test-gpu lab wheelhouse clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed

report: setup                 ## every notebook, preset for this machine (configs/gpu.yaml or cpu-smoke.yaml)
	$(VENV)/bin/kit run $(ARGS)

test: setup                   ## CPU tests (what CI runs)
	$(PY) -m pytest $(ARGS)

test-gpu: setup               ## tests marked gpu (most need 2 CUDA GPUs; one-GPU paths need 1)
	$(PY) -m pytest -m gpu $(ARGS)

lab: setup                    ## JupyterLab on the notebooks
	$(PY) -m pip install -e ".[lab]"
	$(VENV)/bin/jupyter lab notebooks/

wheelhouse: setup             ## wheels for an offline node: make wheelhouse ARGS="wheels --python-version 3.12"
	$(VENV)/bin/kit wheelhouse $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info
