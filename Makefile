# The README's two commands: `make demo` (the main job on built-in data, no cluster needed)
# and `make test` (the whole suite, real sshd nodes on 127.0.0.x included). Both set up what
# they need: a virtualenv in .venv and, for the tests, Debian's openssh-server.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test sshd bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "iadeep needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,plot]'
	touch $(STAMP)

sshd:
	@test -x /usr/sbin/sshd || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openssh-server openssh-client; }

demo: $(STAMP)
	$(BIN)/iadeep sim

test: $(STAMP) sshd
	$(BIN)/pytest -q

bench: $(STAMP) sshd
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
