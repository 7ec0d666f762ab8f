# Kiln — `make run` starts the platform, `make test` runs every check. Both set themselves up from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
KILN_HOST ?= 127.0.0.1
KILN_PORT ?= 8080

.PHONY: run install dev test test-fast lint typecheck unit flake-hunt bench bench-smoke clean services mount-tools sandbox-tools \
	node-tools console console-tools browser-tools slurm-tools slurm-up slurm-down

# uv installs into the venv what pip would (the same versions: pyproject's ranges), in a sixth of the CPU time: pip
# took 2.5 CPU-minutes of `make test`'s setup here, and as long again in the quick start's test of `make run`.
UV := $(BIN)/uv pip install -q --python $(BIN)/python

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Kiln needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q 'uv>=0.13,<0.14'

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(UV) -e .
	@# The commit this is built from, for `kiln --version` where there is no .git to read (kiln/version.py).
	@git rev-parse HEAD > src/kiln/BUILD 2>/dev/null || rm -f src/kiln/BUILD
	@# Precompile: this machine sets PYTHONDONTWRITEBYTECODE, so every server and CLI start would recompile.
	$(BIN)/python -m compileall -q src
	@touch $@

$(VENV)/.dev-installed: $(VENV)/.installed
	$(UV) -e '.[dev]'
	@touch $@

install: $(VENV)/.installed console

dev: $(VENV)/.dev-installed

run: install sandbox-tools console
	KILN_HOST=$(KILN_HOST) KILN_PORT=$(KILN_PORT) $(BIN)/kiln server

# PostgreSQL is part of this kind of machine; start it if it is installed but stopped.
services:
	@if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then \
		echo "starting PostgreSQL on 127.0.0.1:5432 (the database tests run on it as well as on SQLite)"; \
		pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start || true; \
	fi
	@command -v pg_isready >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -p 5432 || \
		echo "WARNING: PostgreSQL is not reachable on 127.0.0.1:5432; its tests will FAIL (KILN_TEST_WITHOUT=postgresql skips them)"

# FUSE and the tools that mount `mode: mount` inputs (Debian's packages): the mount tests use them.
MOUNT_PACKAGES := fuse3 rclone s3fs
mount-tools:
	@if ! command -v rclone >/dev/null 2>&1 || ! command -v s3fs >/dev/null 2>&1 || ! command -v fusermount3 >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing $(MOUNT_PACKAGES) with apt-get (FUSE mounts of mode: mount inputs; the mount tests use them)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends $(MOUNT_PACKAGES) >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(MOUNT_PACKAGES) >/dev/null; }; \
		else \
			echo "WARNING: install $(MOUNT_PACKAGES) (as root: apt-get install $(MOUNT_PACKAGES)); the mount tests need them"; \
		fi; \
	fi

# bubblewrap sandboxes jobs on the local executor (setpriv, prlimit and nsenter come with util-linux); passt's pasta
# connects each job's own network namespace to the outside world and nftables holds its egress rules; libseccomp
# compiles the jobs' seccomp filter (pyseccomp loads libseccomp.so.2). Without them the server refuses jobs
# (network: isolated/none) unless KILN_SANDBOX=none.
SANDBOX_PACKAGES := bubblewrap passt nftables libseccomp2
sandbox-tools:
	@if ! command -v bwrap >/dev/null 2>&1 || ! command -v pasta >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1 || \
			! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 '; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing $(SANDBOX_PACKAGES) with apt-get (the job sandbox and its network; without them the server refuses jobs)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends $(SANDBOX_PACKAGES) >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(SANDBOX_PACKAGES) >/dev/null; }; \
		else \
			echo "WARNING: install $(SANDBOX_PACKAGES) (as root: apt-get install $(SANDBOX_PACKAGES)); jobs are refused without them"; \
		fi; \
	fi

# Debian's Slurm and MUNGE: the tests start a real two-node cluster of them (tests/slurm_cluster.py: slurmctld and
# two slurmd in network namespaces on a private bridge, its own munged), and stop it after. Installing starts nothing
# here (no systemd); the cluster needs root for its namespaces.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
slurm-tools:
	@if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 || \
			! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing $(SLURM_PACKAGES) with apt-get (the Slurm tests run a two-node cluster of them)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES) >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES) >/dev/null; }; \
		else \
			echo "WARNING: install $(SLURM_PACKAGES) (as root: apt-get install $(SLURM_PACKAGES)); the Slurm tests need them"; \
		fi; \
	fi

# The test cluster for a developer, in the foreground until Ctrl-C (it prints the SLURM_CONF to use); slurm-down
# removes what one that was killed left behind (its daemons, namespaces and bridge). Standard library only: any
# Python 3.11 runs it, no virtual environment needed.
slurm-up: slurm-tools
	$(PYTHON) -m tests.slurm_cluster up

slurm-down:
	$(PYTHON) -m tests.slurm_cluster down

# Node.js runs the API docs page's signing script in its tests (Debian's package, where the machine has none).
node-tools:
	@if ! command -v node >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing nodejs with apt-get (the API docs page's signing script is tested with it)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends nodejs >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends nodejs >/dev/null; }; \
		else \
			echo "WARNING: install Node.js (as root: apt-get install nodejs); the API docs tests need it"; \
		fi; \
	fi

# Chromium drives the web console in its browser tests (tests/e2e/test_console.py) through Playwright for Python (in
# .[dev]), launched by path: Debian's package where the machine has none (and a font for its pages' text);
# `playwright install` is not used.
BROWSER_PACKAGES := chromium fonts-liberation
browser-tools:
	@if [ ! -x /usr/bin/chromium ]; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing $(BROWSER_PACKAGES) with apt-get (the web console's browser tests drive Chromium)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES) >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES) >/dev/null; }; \
		else \
			echo "WARNING: install Chromium at /usr/bin/chromium (as root: apt-get install chromium); the console's browser tests need it"; \
		fi; \
	fi

# The web console: console/ (Vite, its lockfile committed) built into the package, src/kiln/api/console_dist, which
# the server serves at / (docs/console.md). `npm ci` when the lockfile changed, `npm run build` when anything in
# console/ did. Node.js and npm from the machine, else Debian's packages. Without console/ the server is API only.
# Its API types are generated from the server's OpenAPI document (console/scripts/api-types.mjs, with this venv's
# Python) first, on every run: the file changes only when the document does, and then the console is rebuilt, so a
# field renamed in the server's schemas fails `make console` where the console reads it.
CONSOLE_DIST := src/kiln/api/console_dist
CONSOLE_STAMP := $(CONSOLE_DIST)/.built
CONSOLE_DEPS := console/node_modules/.installed
CONSOLE_SOURCES := $(shell find console -path console/node_modules -prune -o -type f -print 2>/dev/null)
CONSOLE_ENV := KILN_PYTHON=$(abspath $(BIN)/python)

console: $(VENV)/.installed
	@if [ -f console/package.json ]; then \
		$(MAKE) --no-print-directory $(CONSOLE_DEPS) && \
		(cd console && $(CONSOLE_ENV) npm run --silent api-types) && \
		$(MAKE) --no-print-directory $(CONSOLE_STAMP); \
	else \
		echo "console/package.json not found: the web console is not built (the server runs API only)"; \
	fi

$(CONSOLE_DEPS): console/package.json console/package-lock.json | console-tools
	cd console && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(CONSOLE_STAMP): $(CONSOLE_DEPS) $(CONSOLE_SOURCES)
	@echo "building the web console with Node.js $$(node --version) into $(CONSOLE_DIST)"
	cd console && $(CONSOLE_ENV) npm run build
	@test -f $(CONSOLE_DIST)/index.html || { echo "npm run build wrote no $(CONSOLE_DIST)/index.html"; exit 1; }
	@touch $@

console-tools:
	@if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			echo "installing nodejs and npm with apt-get (they build the web console, console/)"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q --no-install-recommends nodejs npm >/dev/null 2>&1 || \
				{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends nodejs npm >/dev/null; }; \
		else \
			echo "ERROR: install Node.js and npm (as root: apt-get install nodejs npm) to build the web console"; \
			exit 1; \
		fi; \
	fi

lint: dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports --no-cache  # the layers and no cycles: [tool.importlinter] in pyproject.toml

typecheck: dev
	$(BIN)/mypy

# Three workers (pytest-xdist) on this 2-CPU machine, a test file at a time each (the long files' tests one by one),
# the longest first (tests/conftest.py): the suite is mostly waiting on real servers and jobs (two workers kept the
# CPUs 62 % busy: 32.5 CPU-minutes in a 26-minute run).
test: dev services mount-tools sandbox-tools node-tools browser-tools slurm-tools console lint typecheck
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder --durations=25

unit: dev
	$(BIN)/python -m pytest -q tests/unit

# The edit-run loop: the unit tests but the heavy ones (marked: each starts processes or a server), on two workers.
test-fast: dev
	$(BIN)/python -m pytest -q -n 2 -m "not heavy and not slow" tests/unit

# A flake's hunt: TESTS (files or node ids) run N times each (pytest-repeat), spread over WORKERS pytest-xdist
# workers, while LOAD busy loops (stress-ng's if it is installed, else one Python loop each; one per CPU unless set)
# keep the CPUs busy, as make test's load does. E.g. make flake-hunt TESTS=tests/integration/servers/test_paused_server.py N=20
N ?= 20
WORKERS ?= 2
LOAD ?= $(shell nproc)
flake-hunt: dev
	@test -n "$(TESTS)" || { echo 'usage: make flake-hunt TESTS="tests/...py[::test]" [N=20] [WORKERS=2] [LOAD=CPUs]'; exit 2; }
	@load=""; \
	if [ "$(LOAD)" -gt 0 ] && command -v stress-ng >/dev/null; then stress-ng --quiet --cpu $(LOAD) & load=$$!; \
	else for i in $$(seq 1 $(LOAD)); do $(BIN)/python -c 'while True: pass' & load="$$load $$!"; done; fi; \
	trap 'kill $$load 2>/dev/null; wait 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist load --count $(N) --repeat-scope function -rf $(TESTS)

bench: install
	$(BIN)/python benchmarks/submit_latency.py

# Every benchmark at its smallest size (--smoke), run to its results table; figures not judged. `make test` runs the
# same module (tests/e2e/test_benchmarks_smoke.py) with the rest of the suite.
bench-smoke: dev sandbox-tools mount-tools browser-tools console
	$(BIN)/python -m pytest -q -n 2 --durations=0 tests/e2e/test_benchmarks_smoke.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache $(CONSOLE_DIST) console/node_modules
