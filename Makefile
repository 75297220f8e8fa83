# opendrs — every target creates .venv when missing and installs what it needs: `make demo` the
# program alone, the other targets the test tools too (the dev extra), `make dist` the build tool.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-dev

.PHONY: demo screenshot test lint unit test-packages properties bench faults dist deb debs \
	deb-from-sdist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/opendrs demo

# docs/dashboard.png, the README's picture: opendrs demo's dashboard in headless Chromium
# (Debian's chromium and chromium-driver: make test-packages as root); a few minutes.
screenshot: $(TEST_STAMP)
	$(BIN)/python tools/screenshot.py docs/dashboard.png

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# The tests on pytest-xdist's workers, one per core and at most UNIT_WORKERS; the test files that
# share something of the machine's or the checkout's (the real clusters, make dist) run on one
# worker, their group's (tests/conftest.py: ONE_WORKER).
UNIT_WORKERS ?= 2

unit: $(TEST_STAMP)
	$(BIN)/python -m pytest --durations=20 -rs -n auto --maxprocesses=$(UNIT_WORKERS) --dist loadgroup

# As root, the Debian packages of the browser tests and of the real LXD and Incus cluster tests
# (tools/install-test-packages); the tests that need them skip with their reason where they are
# missing.
test-packages:
	@tools/install-test-packages

test: lint test-packages unit

# The property tests with a large, random budget (tests/conftest.py: the deep profile); hours.
# HYPOTHESIS_DEEP_EXAMPLES=2500 runs a tenth as many; PROPERTY_ARGS=tests/engine some of them.
PROPERTY_ARGS ?=

properties: $(TEST_STAMP)
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest -m hypothesis --hypothesis-show-statistics \
		$(PROPERTY_ARGS)

# The benchmark's peers (GPL-3.0, test-only: ProxLB and proxlb-solver) come with the bench extra.
BENCH_STAMP := $(VENV)/.installed-bench
BENCH_ARGS  ?=
# Where `make bench` writes its tables (Markdown) and every row's raw figures (JSON), beside the
# measurement history (bench/results/HISTORY.md); a --markdown or --json in BENCH_ARGS wins.
BENCH_OUT   ?= bench/results/latest

$(BENCH_STAMP): $(TEST_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench --markdown $(BENCH_OUT).md --json $(BENCH_OUT).json $(BENCH_ARGS)

# The simulator's fault campaign (bench/faults.py): 1,000 seeded fault mixes over simulated days,
# the daemon's invariants checked after every event; about an hour on 2 cores.
# FAULTS_ARGS="--seeds 100" runs fewer; exit status 1 if an invariant broke.
FAULTS_ARGS ?=

faults: $(TEST_STAMP)
	$(BIN)/python -m bench.faults $(FAULTS_ARGS)

# The sdist and the wheel, in dist/ (python -m build makes the wheel from the sdist).
DIST := dist
BUILD_STAMP := $(VENV)/.installed-build

$(BUILD_STAMP): | $(BIN)/python
	$(BIN)/python -m pip install --quiet 'build>=1.2'
	@touch $(BUILD_STAMP)

dist: $(BUILD_STAMP)
	rm -f $(DIST)/opendrs-*.tar.gz $(DIST)/opendrs-*.whl
	$(BIN)/python -m build --outdir $(DIST) .

# The Debian package for Debian 12 (RELEASE=bookworm, Proxmox VE 8) or 13 (RELEASE=trixie, Proxmox
# VE 9), by default this machine's release, in dist/ as opendrs_VERSION~debNN_ARCH.deb: a venv for
# that release's python3, built from the sdist by debian/rules with PyPI's wheels. On the release
# itself it needs build-essential, debhelper and python3-venv; for another release it is built,
# as root, in a clean root of that release (tools/debian-root: debootstrap, kept in
# /var/cache/opendrs-test). make test-packages installs them all, as root. make debs builds both.
RELEASE ?= $(shell . /etc/os-release 2>/dev/null && echo "$$VERSION_CODENAME")
DEB_RELEASES := bookworm trixie
DEBIAN_bookworm := 12
DEBIAN_trixie := 13
DEB_BUILD := build/deb

deb: dist
	@$(MAKE) --no-print-directory deb-from-sdist RELEASE=$(RELEASE)

debs: dist
	@for release in $(DEB_RELEASES); do \
		$(MAKE) --no-print-directory deb-from-sdist RELEASE=$$release || exit 1; done

# The package of RELEASE from the sdist already in dist/ (make deb and make debs make it first).
deb-from-sdist:
	$(if $(DEBIAN_$(RELEASE)),,$(error RELEASE="$(RELEASE)": the package is built for $(DEB_RELEASES) only))
	rm -rf $(DEB_BUILD)/$(RELEASE) $(DIST)/opendrs_*~deb$(DEBIAN_$(RELEASE))_*.deb
	mkdir -p $(DEB_BUILD)/$(RELEASE)
	tar -xzf $(DIST)/opendrs-*.tar.gz -C $(DEB_BUILD)/$(RELEASE)
	if [ "$(RELEASE)" = "$$(. /etc/os-release && echo "$$VERSION_CODENAME")" ]; then \
		cd $(DEB_BUILD)/$(RELEASE)/opendrs-*/ && dpkg-buildpackage --build=binary --no-sign; \
	else \
		tools/debian-root build $(RELEASE) $(DEB_BUILD)/$(RELEASE)/opendrs-*/; \
	fi
	cp $(DEB_BUILD)/$(RELEASE)/opendrs_*~deb$(DEBIAN_$(RELEASE))_*.deb $(DIST)/

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
