# The README's commands. `make run` installs and serves the appliance (embedded mode);
# `make test` runs the whole suite; `make bench` measures the engine against raw llama.cpp.
# LLAMA_GPU=auto|cuda|cpu: which llama.cpp the install builds (tools/llama_build.py; auto: CUDA
# for the local card when nvcc and a card are both here, else the CPU).
PYTHON ?= python3
LLAMA_GPU ?= auto
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: run install install-test test bench lint worker jobs beat web

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The llama.cpp build first: pip would otherwise hand back a CPU wheel it built before.
install: $(VENV)/bin/activate
	LLAMA_GPU=$(LLAMA_GPU) $(PY) tools/llama_build.py --pip $(PIP) --venv $(VENV)
	$(PIP) install -e .

install-test: $(VENV)/bin/activate
	LLAMA_GPU=$(LLAMA_GPU) $(PY) tools/llama_build.py --pip $(PIP) --venv $(VENV)
	$(PIP) install -e '.[test,postgres]'

run: install
	$(PY) manage.py serve

# Split mode's tests run on PostgreSQL, as docker-compose.yml deploys split mode, in a pytest
# run of their own (Django has one default database per process); the rest on SQLite, as
# embedded mode runs. `make test SPLIT_DATABASE_URL=` runs them on SQLite too.
SPLIT_TESTS := tests/inference/serving/split tests/dashboard/chat/split \
	tests/inference/test_storable_on_postgresql.py
SPLIT_DATABASE_URL ?= postgres://appliance@127.0.0.1:5432/appliance

test: install-test
	$(PY) -m pytest $(addprefix --ignore=,$(SPLIT_TESTS))
	$(if $(SPLIT_DATABASE_URL),DATABASE_URL=$(SPLIT_DATABASE_URL)) $(PY) -m pytest $(SPLIT_TESTS)

bench: install
	$(PY) bench/engine.py

lint: install-test
	$(VENV)/bin/ruff check .

# Split mode (REDIS_URL set): the processes docker-compose.yml runs, started by hand.
web:
	$(PY) manage.py serve
worker:
	$(VENV)/bin/celery -A appliance worker -Q inference -P threads -c 16 -n inference@%h
jobs:
	$(VENV)/bin/celery -A appliance worker -Q jobs -c 2 -n jobs@%h
beat:
	$(VENV)/bin/celery -A appliance beat
