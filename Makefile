# Two commands on a fresh machine: `make lab` and `make test`. See README.md.
include tools/kit.mk
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

SITE ?= site
# The unit tests, then the browser tests (their own step, timed on its own), then the solutions under nbval, each on
# two pytest-xdist workers, one test file (one notebook) each, one thread each (two workers on two cores: torch's own
# threads would only contend)
TWO_WORKERS := LABKIT_PROFILE=tiny OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

.PHONY: test long-test student solutions site lock

test: $(STAMP)
	@command -v bwrap >/dev/null || echo "labkit: bubblewrap (bwrap) is not installed: the labkit grade tests that need its sandbox are skipped"
	@command -v chromium >/dev/null || echo "labkit: chromium is not installed: the browser tests (every notebook in JupyterLab in Chromium) are skipped; apt-get install chromium runs them"
	$(PY) -m labkit student --check
	$(TWO_WORKERS) -m "not browser and not hub and not long" tests
	$(TWO_WORKERS) -m browser tests
	LABKIT_PROFILE=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile $(NBVAL) solutions

# The suites too long for `make test`, CI's second step after it, side by side on the two workers: a JupyterHub
# booted for three students who pull a lab 00-01 bundle and run it in Chromium, and for an instructor who collects
# and grades a class of hub homes from her own JupyterLab terminal (tests/test_hub.py), and
# `labkit grade` against the red team's class of attacks (tests/test_grade_attacks.py) and `bench grade`'s generated
# class of ten (tests/test_grade.py), and every lab's predicted peak against its solution run whole under the meter
# (tests/test_lab_peaks.py), and every lab run whole under bfloat16 autocast on the CPU (tests/test_autocast_labs.py);
# marker `long`
long-test: $(STAMP)
	@command -v configurable-http-proxy >/dev/null || echo "labkit: configurable-http-proxy is not installed: the hub test is skipped; npm install -g configurable-http-proxy runs it"
	@command -v bwrap >/dev/null || echo "labkit: bubblewrap (bwrap) is not installed: the red-team and bench grade tests are skipped"
	$(TWO_WORKERS) -m "hub or long" tests

# Re-execute the solutions in place (outputs are committed), then regenerate notebooks/.
solutions: $(STAMP)
	LABKIT_PROFILE=cpu $(PY) -m labkit execute solutions/*.ipynb
	$(PY) -m labkit student

student: $(STAMP)
	$(PY) -m labkit student

# The executed solutions as a static reading site: open $(SITE)/index.html (no Python needed to read it).
site: $(STAMP)
	$(PY) -m labkit site $(SITE)

# Refresh constraints.txt from the venv the tests passed in. torch and what only torch needs are left out:
# TORCH_SPEC pins torch, and a GPU hub keeps the CUDA build it has.
lock: $(STAMP)
	@{ echo "# The versions labkit was tested with: make lab, make test and environment.yml install with -c $(LOCK)."; \
	  echo "# Written by \`make lock\` (torch and its own dependencies are pinned elsewhere: TORCH_SPEC)."; \
	  echo "# python>=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') (made with it; an older Python installs without the lock)"; \
	  $(PY) -m pip freeze --local --exclude-editable \
	    | grep -viE '^(torch|triton|nvidia-[a-z0-9-]*|cuda-[a-z0-9-]*|sympy|mpmath|networkx|filelock|fsspec)=='; \
	} > $(LOCK).new && mv $(LOCK).new $(LOCK)
	@echo "wrote $(LOCK): $$(grep -vc '^#' $(LOCK)) pinned packages"
