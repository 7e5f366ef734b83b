# Two commands on a fresh machine: `make lab` and `make test`. See README.md.
include tools/kit.mk
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

SITE ?= site

.PHONY: test student solutions site

test: $(STAMP)
	@command -v bwrap >/dev/null || echo "labkit: bubblewrap (bwrap) is not installed: the labkit grade tests that need its sandbox are skipped"
	$(PY) -m labkit student --check
	LABKIT_PROFILE=tiny $(PY) -m pytest -q tests
	LABKIT_PROFILE=cpu $(PY) -m pytest -q $(NBVAL) solutions

# Re-execute the solutions in place (outputs are committed), then regenerate notebooks/.
solutions: $(STAMP)
	LABKIT_PROFILE=cpu $(PY) -m labkit execute solutions/*.ipynb
	$(PY) -m labkit student

student: $(STAMP)
	$(PY) -m labkit student

# The executed solutions as a static reading site: open $(SITE)/index.html (no Python needed to read it).
site: $(STAMP)
	$(PY) -m labkit site $(SITE)
