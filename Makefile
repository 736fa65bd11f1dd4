# The README's two commands: `make demo` (the main job on built-in data, no cluster needed)
# and `make test` (the whole suite, real sshd nodes on 127.0.0.x included). Both set up what
# they need: a virtualenv in .venv and, for the tests, Debian's openssh-server.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test docs cli-reference lint sshd slurm chromium promtool torch-cpu frameworks bench check-min-deps clean

# iadeep_cli/__init__.py holds the version, which the installed metadata (--version) copies
$(STAMP): pyproject.toml iadeep_cli/__init__.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "iadeep needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plot]'
	@# bytecode now: an editable install writes none, and where PYTHONDONTWRITEBYTECODE is set
	@# every command would compile its modules again (~0.1 s each: benchmarks/_common.py)
	$(BIN)/python -m compileall -q iadeep_cli
	touch $(STAMP)

# The nodes' sshd, sudo for run_as: submitter, and for `iadeep run --pty`: util-linux's
# `script` on the nodes (bsdutils) and tmux, the terminal its test types into.
sshd:
	@test -x /usr/sbin/sshd && command -v sudo >/dev/null && command -v script >/dev/null && \
	  command -v tmux >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openssh-server \
	  openssh-client sudo bsdutils tmux; }

# The Slurm backend's tests start a real single-machine Slurm (tests/helpers/slurm.py): Debian's
# daemons and client, about 16 s to install on the 2-core test machine, nothing when present.
slurm:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch \
	  >/dev/null && command -v munged >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq slurmctld slurmd \
	  slurm-client munge; }

# `iadeep web`'s tests drive a real headless browser: Debian's Chromium and its driver
# (Selenium, from the `test` extra, talks to /usr/bin/chromedriver; no browser download).
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install \
	  -y -qq chromium chromium-driver; }

# The metrics endpoint's tests lint a live scrape with Prometheus's own `promtool check
# metrics` (Debian's prometheus package; its server is not started).
promtool:
	@command -v promtool >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq prometheus; }

demo: $(STAMP)
	$(BIN)/iadeep sim

# The documentation site (mkdocs.yml, pages in docs/) into site/. --strict: a broken link or
# anchor fails the build (CI runs it after the tests). The `docs` extra is installed on first use.
DOCS_STAMP := $(VENV)/.docs-stamp
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,plot,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python tests/check_site_links.py site

# docs/reference/cli.md from the CLI itself (tests/unit/test_docs.py fails when it is stale)
cli-reference: $(STAMP)
	$(BIN)/python tests/cli_reference.py docs/reference/cli.md

# The PyTorch example job is tested when a CPU build of torch can be installed from this
# machine's disk (never a multi-GB download); elsewhere that one test is skipped and says why.
torch-cpu: $(STAMP)
	@whl=$$(ls /opt/wheels/torch-*+cpu-cp$$($(BIN)/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')-*.whl 2>/dev/null | head -n1); \
	if [ -n "$$whl" ] && ! $(BIN)/python -c 'import torch' 2>/dev/null; then \
	  $(BIN)/pip install -q "$$whl" || echo "note: $$whl did not install; the PyTorch example test is skipped"; \
	fi

# The training frameworks the hooks in iadeep_cli/integrations plug into (Lightning,
# transformers with accelerate, Keras 3 on the torch backend), for their tests: only once the
# CPU torch is installed, and pinned to it, so that pip never fetches a CUDA build of torch.
# They are not in the test extra: lightning requires torch, which pip would fetch from PyPI.
# Without them those tests are skipped and say why.
FRAMEWORKS := lightning transformers accelerate keras
frameworks: torch-cpu
	@if tv=$$($(BIN)/python -c 'import torch; print(torch.__version__)' 2>/dev/null) && \
	  ! $(BIN)/python -c 'import lightning, transformers, accelerate, keras' 2>/dev/null; then \
	  $(BIN)/pip install -q $(FRAMEWORKS) "torch==$$tv" || \
	    echo "note: $(FRAMEWORKS) did not install; their hooks' tests are skipped"; \
	fi

# Style checks (docs/contributing.md "Style checks"); `make test` runs them first, so CI fails on them.
lint: $(STAMP)
	$(BIN)/ruff check iadeep_cli tests benchmarks
	$(BIN)/mypy

# The suite runs in parallel (pytest-xdist): its tests mostly wait on sshd nodes, controller
# processes and polls, not on the CPU, so more workers than cores pays. Workers: twice the cores,
# at least 4, at most 8 (docs/contributing.md "Tests" has the times measured); `make test TEST_WORKERS=3`
# chooses, `.venv/bin/pytest -q` (no -n) runs it serially. --dist loadgroup keeps the os_global tests
# (accounts, sudoers, mounts, system daemons) in one worker, one after another. --durations
# lists the 20 slowest tests at the end, so CI's log says where the suite's time goes.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n * 2)); \
                  [ $$n -lt 4 ] && n=4; [ $$n -gt 8 ] && n=8; echo $$n)

test: $(STAMP) lint sshd slurm chromium promtool torch-cpu frameworks
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=20

# The lower bounds in pyproject.toml, tested: the oldest allowed version of every dependency
# (pins from tests/min_deps.py) in a fresh .venv-min, then there the in-process tests, the
# monitor's and two SSH ones (paramiko). Not part of `make test` (pip fetches old releases);
# docs/administration.md "Install for real use" has its time.
MIN_VENV  := .venv-min
MIN_TESTS := tests/unit tests/tui/test_tui.py tests/integration/test_ssh_hostkeys.py \
             tests/integration/test_poller_sshd.py

check-min-deps: $(STAMP) sshd
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(BIN)/python tests/min_deps.py > $(MIN_VENV)/requirements-min.txt
	$(MIN_VENV)/bin/pip install -q --only-binary :all: -r $(MIN_VENV)/requirements-min.txt \
	  pytest pytest-timeout pytest-xdist
	$(MIN_VENV)/bin/pip install -q --no-deps -e .
	$(MIN_VENV)/bin/pip check
	cat $(MIN_VENV)/requirements-min.txt
	$(MIN_VENV)/bin/python -m pytest -q -n 2 -p no:cacheprovider $(MIN_TESTS)

bench: $(STAMP) sshd
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(MIN_VENV) .pytest_cache .mypy_cache .ruff_cache site
