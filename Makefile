# attune: the two commands that matter are `make quickstart` and `make test`.
.PHONY: quickstart test test-fast test-chaos test-cluster bench down build fmt lint tidy settings-doc docs

quickstart: ## set everything up, start attune, run an action through the API
	scripts/quickstart.sh

test: ## the whole test suite (what CI runs)
	scripts/test.sh

test-fast: ## everything but the system tests: unit, repository, broker-adapter, in-process API and executor step tests, and the tidy rules (PostgreSQL and RabbitMQ must run)
	cargo test --workspace --exclude attune-system-tests
	cargo test -p attune-system-tests --test tidy

test-chaos: ## only the defense-in-depth tests (dead workers, DLQ, poison, database and broker loss)
	cargo build --workspace --bins
	cargo test -p attune-system-tests --test faults defense::
	cargo test -p attune-system-tests --test chaos_broker -- --ignored --test-threads=1

test-cluster: ## attune across hosts (root): a three-node RabbitMQ cluster of this machine (scripts/test-cluster.sh) with nodes stopped under a stream of executions; workers in network namespaces cut off and healed; a PostgreSQL primary and its synchronous standby (scripts/test-pg-standby.sh) switched over under streams of executions
	cargo build --workspace --bins
	scripts/test-cluster.sh start
	cargo test -p attune-system-tests --test broker_cluster -- --ignored --test-threads=1; status=$$?; scripts/test-cluster.sh stop; exit $$status
	cargo test -p attune-system-tests --test hosts -- --ignored --test-threads=1
	scripts/test-pg-standby.sh start
	cargo test -p attune-system-tests --test pg_switchover -- --ignored --test-threads=1; status=$$?; scripts/test-pg-standby.sh stop; exit $$status

bench: ## the full benchmark on a fresh database (a few minutes); writes docs/bench/ (ARGS=... passes options)
	scripts/bench.sh $(ARGS)

down: ## stop the attune started by quickstart
	@bash -c '. scripts/lib.sh && { stop_started || echo "attune is not running"; }'

tidy: ## the rules that hold the documents and the configuration to the code (tests/tests/tidy; no service started)
	cargo test -p attune-system-tests --test tidy

settings-doc: ## rewrite the book's settings table (book/src/settings.md) from common/src/settings.rs
	ATTUNE_BLESS=1 cargo test -p attune-system-tests --test tidy settings_doc::

docs: ## build the book (book/src) into target/book, with its link check; mdBook is built into target/mdbook once
	bash -c '. scripts/lib.sh; ensure_mdbook && "$$MDBOOK" build book && cargo test -q -p attune-system-tests --test tidy book::'

build:
	cargo build --workspace --bins

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
