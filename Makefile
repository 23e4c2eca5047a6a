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

.PHONY: setup nbstripout-filter report docs-rules test test-fast test-gpu test-browser lab wheelhouse clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install -e ".[test]"
	touch $@

# Notebooks are committed without outputs. Of the two ways -- a git clean filter, or tests that only read what git
# would commit -- the filter: with it a notebook run and saved in JupyterLab stays out of `git status`, and
# `git commit -a` cannot take its outputs; the tests read a notebook through the same filter
# (tests/notebook_commit.py), so a saved notebook breaks no test either. The filter is nbstripout (.gitattributes
# names it); --keep-id: cells keep their ids (nbstripout would renumber them; JupyterLab keeps them across saves);
# NB_EXTRA_KEYS: what JupyterLab adds to the kernel's language_info on every save (the Python version among it).
# git keeps filters in the clone's own config, which a clone does not copy: hence this step on every `make setup`
# / `make lab` (a no-op outside a git checkout). `make clean` removes it with the venv it runs from. git takes a
# file whose size differs from the index's for changed without running the filter, so a saved notebook would stay
# in `git status` (`git diff` empty) until a `git add`; `make lab` sets JupyterLab's post-save hook
# kit.lab.git_refresh, which makes git compare the saved file's content instead: status is clean after a save.
NBSTRIP := "$(abspath $(PY))" -m nbstripout --keep-id
NB_EXTRA_KEYS := $(addprefix metadata.language_info.,codemirror_mode file_extension mimetype nbconvert_exporter \
                   pygments_lexer version)

nbstripout-filter: $(VENV)/.installed
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
	  git config filter.nbstripout.clean '$(NBSTRIP)' && git config filter.nbstripout.smudge cat && \
	  git config filter.nbstripout.required true && git config diff.ipynb.textconv '$(NBSTRIP) -t' && \
	  git config filter.nbstripout.extrakeys '$(NB_EXTRA_KEYS)'; fi

setup: $(VENV)/.installed nbstripout-filter

report: setup                 ## every notebook, preset for this machine (configs/gpu.yaml or cpu-smoke.yaml)
	$(VENV)/bin/kit run $(ARGS)

docs-rules: setup             ## regenerate docs/cli.md's table of the doctor's rules from the rule registry
	$(PY) -c "from kit.doctor.rules import write_table; write_table('docs/cli.md')"

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
lab: $(VENV)/.lab-installed nbstripout-filter  ## JupyterLab on the notebooks (JupyterLab installed once)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ContentsManager.post_save_hook=kit.lab.git_refresh \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(ARGS)

$(VENV)/.browser-installed: $(VENV)/.installed
	$(PY) -m pip install selenium -e ".[lab]"
	touch $@

# the newest report in headless Chromium (apt-get install -y chromium chromium-driver); not part of make test / CI
# make test-browser ARGS="results/reports/<run-id> --screenshots docs/screenshots"
# make test-browser ARGS="--lab collectives": also run that notebook in JupyterLab, save it, and check that git
# would commit it without outputs and that `git status` shows it unchanged (the file is put back after)
test-browser: $(VENV)/.browser-installed nbstripout-filter  ## every page of the last report: images load, no error cell
	$(PY) tests/browser/check_report.py $(ARGS)

wheelhouse: setup             ## wheels for an offline node: make wheelhouse ARGS="wheels --python-version 3.12"
	$(VENV)/bin/kit wheelhouse $(ARGS)

clean:
	-@git config --remove-section filter.nbstripout 2>/dev/null; git config --remove-section diff.ipynb 2>/dev/null; true
	rm -rf $(VENV) *.egg-info
