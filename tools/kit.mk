# The kit's install and serve rules: included by the repository's Makefile, and the whole
# Makefile of a student bundle (`python -m labkit release`). See README.md.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8888
# torch is installed on its own, pinned, before the kit: an unpinned `torch`
# can pull a CUDA build of several GB onto a CPU machine. Where the Python that
# builds the venv already imports torch (a GPU hub image), that torch is kept (when it is at least TORCH_FLOOR).
TORCH_SPEC ?= torch==2.13.0
# Extra pip arguments for torch alone, e.g. a CPU wheel index on a Linux laptop.
TORCH_PIP_ARGS ?=
INSTALL_TORCH = $(PY) -m pip install --progress-bar on $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
# The oldest torch the kit is tested on (pyproject.toml's `torch>=`: CI's 2.13 on a CPU, 2.11 on an H200 for every
# lab; `labkit doctor` names where a torch was tested). A torch the Python already has that is older
# stops the install: pip would replace it in the venv with the public index's build (a CUDA build of several GB,
# not necessarily for this machine's driver) instead of keeping it. TORCH_UPGRADE=1 installs TORCH_SPEC over it.
TORCH_FLOOR := 2.11
TORCH_UPGRADE ?=
# exit 0 when the torch this Python imports is at least TORCH_FLOOR (argv[1]) as pip compares versions (2.13.0a0 is
# older than 2.13); print its version either way
export TORCH_FITS := import sys, torch; from pip._vendor.packaging.version import Version; print(torch.__version__); sys.exit(0 if Version(torch.__version__) >= Version(sys.argv[1]) else 1)
STAMP  := $(VENV)/.installed
# The kit's developer tools (pytest, nbval, Playwright, transformers: `make test`) where its tests are; a student
# bundle has none, so `make lab` there installs what the notebooks use and nothing more
EXTRAS ?= $(if $(wildcard tests/conftest.py),[dev],)
# The exact versions the kit was tested with (`make lock` writes it): installs take them, so a release of
# JupyterLab or ipywidgets in week 6 does not change the lab for whoever installs then. `make lab LOCK=` installs
# the newest versions pyproject.toml allows instead (another Python than the lock's may need it).
LOCK   ?= constraints.txt
# exit 0 when this Python is at least the one the lock names ("# python>=3.11")
export LOCK_FITS := import re, sys; m = re.search(r"^\# python>=(\d+)\.(\d+)", open(sys.argv[1]).read(), re.M); sys.exit(0 if m is None or sys.version_info[:2] >= (int(m[1]), int(m[2])) else 1)

# On a JupyterHub: its single-user server sets these in every process it starts (terminals and kernels). There
# the hub serves JupyterLab, and the image has its torch: `make hub` installs the kit into that Python (HUB_PYTHON,
# the one on PATH: on most images the kernels' own) without touching torch, and `make lab` does the same and starts
# no second server, which the student's browser could not reach. See docs/hub.md.
ON_HUB := $(or $(JUPYTERHUB_SERVICE_PREFIX),$(JUPYTERHUB_API_URL))
HUB_PYTHON ?= $(PYTHON)
# --user (your home: kept when the hub restarts your server, where an image's own folders are not) where that
# Python reads a user site (a virtual environment of its own does not); HUB_PIP_ARGS= installs into the environment
HUB_PIP_ARGS ?= $(shell $(HUB_PYTHON) -c 'import site; print("--user" if site.ENABLE_USER_SITE else "")' 2>/dev/null)

.PHONY: lab hub doctor clean

hub:
	@if ! have=$$($(HUB_PYTHON) -c "$$TORCH_FITS" $(TORCH_FLOOR) 2>/dev/null); then \
	  if [ -z "$$have" ]; then \
	    echo "labkit: $(HUB_PYTHON) does not import torch; make hub keeps a hub image's torch and installs none."; \
	    echo "labkit: Give the Python the hub's kernels run (make hub HUB_PYTHON=/path/to/python), or use make lab."; \
	  else \
	    echo "labkit: this Python's torch $$have is older than $(TORCH_FLOOR), the oldest the kit is tested on; make hub"; \
	    echo "labkit: never replaces an image's torch: ask the hub's admin for an image with torch>=$(TORCH_FLOOR)."; \
	  fi; \
	  exit 1; \
	fi
	@echo "labkit: installing the kit into $$($(HUB_PYTHON) -c 'import sys; print(sys.executable)') $(HUB_PIP_ARGS), its torch $$($(HUB_PYTHON) -c 'import torch; print(torch.__version__)') kept"
	$(HUB_PYTHON) -m pip install $(HUB_PIP_ARGS) --no-deps -e .
	$(HUB_PYTHON) labkit/env/hubdeps.py $(HUB_PIP_ARGS)
	@cd / && $(HUB_PYTHON) -c 'import labkit, torch; print(f"labkit: the kit imports from {labkit.__path__[0]}, beside torch {torch.__version__}")'
	@echo "labkit: open $(or $(START),notebooks/) in this hub's JupyterLab (its file browser); no second server is started."
	@echo "labkit: a notebook whose kernel started before this install cannot import the kit: Kernel > Restart Kernel."

$(STAMP): pyproject.toml $(wildcard $(LOCK))
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	    echo "labkit: $(PYTHON) already imports torch $$($(PYTHON) -c 'import torch; print(torch.__version__)'); the venv will reuse it"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@if ! $(PY) -c 'import torch' 2>/dev/null; then \
	  echo "labkit: step 1 of 2, installing $(TORCH_SPEC) on its own (pip shows its progress)"; \
	  if [ -z "$(TORCH_PIP_ARGS)" ] && [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null; then \
	    echo "labkit: no NVIDIA GPU here (no nvidia-smi). On Linux the torch wheel of the public index is a CUDA"; \
	    echo "labkit: build of several GB; the CPU build is a 192 MB wheel (754 MB installed; torch 2.13.0, Python"; \
	    echo "labkit: 3.11). For it, stop (Ctrl-C) and run: make lab TORCH_PIP_ARGS='--index-url <the CPU index>'"; \
	    echo "labkit: (PyTorch's install selector, Linux, Pip, CPU, gives that index)."; \
	  fi; \
	  $(INSTALL_TORCH); \
	elif ! have=$$($(PY) -c "$$TORCH_FITS" $(TORCH_FLOOR)); then \
	  if [ -z "$(filter 1,$(TORCH_UPGRADE))" ]; then \
	    echo "labkit: this Python's torch $${have:-(its version unreadable)} is older than $(TORCH_FLOOR), the oldest the kit is"; \
	    echo "labkit: tested on (CI runs the suite on $(patsubst torch==%,%,$(TORCH_SPEC)) on a CPU; every lab ran on a GPU on $(TORCH_FLOOR)); pip"; \
	    echo "labkit: would replace it in $(VENV) with the public index's torch (a CUDA build of several"; \
	    echo "labkit: GB, not necessarily for this machine's driver). Install torch>=$(TORCH_FLOOR) for this CUDA into the"; \
	    echo "labkit: image (PyTorch's install selector gives the index), or install $(TORCH_SPEC) into $(VENV):"; \
	    echo "labkit: make $(firstword $(MAKECMDGOALS) lab) TORCH_UPGRADE=1 (with TORCH_PIP_ARGS='--index-url ...' for an index)"; \
	    exit 1; \
	  fi; \
	  echo "labkit: TORCH_UPGRADE=1: step 1 of 2, installing $(TORCH_SPEC) into $(VENV) over torch $$have"; \
	  $(INSTALL_TORCH); \
	fi
	@if [ -f "$(LOCK)" ] && $(PY) -c "$$LOCK_FITS" "$(LOCK)"; then set -- -c "$(LOCK)"; \
	elif [ -f "$(LOCK)" ]; then echo "labkit: $(LOCK) was made with a newer Python than $$($(PY) -V); installing the newest versions pyproject.toml allows"; fi; \
	echo "labkit: step 2 of 2, installing the kit$(if $(EXTRAS), and its developer tools,) (JupyterLab, ipywidgets, matplotlib: a few minutes)"; \
	$(PY) -m pip install --progress-bar on -e ".$(EXTRAS)" "$$@" || { \
	  echo "labkit: the install failed$(if $(wildcard $(LOCK)), with the tested versions of $(LOCK); \`make $(firstword $(MAKECMDGOALS) lab) LOCK=\` installs without them)"; \
	  exit 1; }
	@touch $(STAMP)

# Jupyter refuses root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# Serves the kit's folder (notebooks/, and solutions/ where there is one) and opens the first notebook.
START ?= $(firstword $(wildcard notebooks/00_start_here.ipynb) $(sort $(wildcard notebooks/*.ipynb)))

# JupyterLab's "get notified about Jupyter news?" toast, off for this venv's JupyterLab (its overrides.json, as
# the browser tests' settings do); a setting already there is kept
export NO_NEWS := import json, pathlib, sys; p = pathlib.Path(sys.prefix, "share", "jupyter", "lab", "settings", "overrides.json"); p.parent.mkdir(parents=True, exist_ok=True); d = json.loads(p.read_text()) if p.exists() else {}; d.setdefault("@jupyterlab/apputils-extension:notification", {}).setdefault("fetchNews", "false"); p.write_text(json.dumps(d, indent=1) + "\n")

ifeq ($(ON_HUB),)
lab: $(STAMP)
	@$(PY) -c "$$NO_NEWS"
	$(PY) -m jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) --ServerApp.root_dir=. \
	  $(if $(START),--LabApp.default_url=/lab/tree/$(START)) $(ROOT_FLAG)
else
lab: hub
	@echo "labkit: this is a JupyterHub server (JUPYTERHUB_SERVICE_PREFIX or JUPYTERHUB_API_URL is set): make lab"
	@echo "labkit: installed the kit as make hub does and starts no JupyterLab of its own (the hub serves yours)."
endif

doctor: $(if $(ON_HUB),,$(STAMP))
	$(if $(ON_HUB),$(HUB_PYTHON),$(PY)) -m labkit doctor

clean:
	rm -rf $(VENV) *.egg-info
