# memstream — the two commands: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV := .venv
MS := $(VENV)/bin/memstream
# tests run on their own stack (state and ports apart from the demo's)
TEST_HOME := $(HOME)/.cache/memstream/test-stack
TEST_ENV := MEMSTREAM_HOME=$(TEST_HOME) MEMSTREAM_KAFKA_PORT=29092 MEMSTREAM_REDIS_PORT=26379

.PHONY: install demo test test-unit stack-up stack-down clean

install:
	bash ops/install.sh

demo: install
	$(MS) demo

test: install
	$(TEST_ENV) $(MS) stack down
	rm -rf $(TEST_HOME)/kafka/data $(TEST_HOME)/redis/data  # every run starts on empty Kafka and Redis
	$(TEST_ENV) $(MS) stack up
	set +e; $(TEST_ENV) $(VENV)/bin/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	  $(TEST_ENV) $(MS) stack down; exit $$rc

test-unit: install
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not stack"

stack-up: install
	$(MS) stack up

stack-down:
	$(MS) stack down
