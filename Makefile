# attune: the two commands that matter are `make quickstart` and `make test`.
.PHONY: quickstart test test-fast test-chaos bench down build fmt lint settings-doc

quickstart: ## set everything up, start attune, run an action through the API
	scripts/quickstart.sh

test: ## the whole test suite (what CI runs)
	scripts/test.sh

test-fast: ## everything but the system tests: unit, repository, broker-adapter, in-process API and executor step tests (PostgreSQL and RabbitMQ must run)
	cargo test --workspace --exclude attune-system-tests

test-chaos: ## only the defense-in-depth tests (dead workers, DLQ, poison, database and broker loss)
	cargo build --workspace --bins
	cargo test -p attune-system-tests --test defense
	cargo test -p attune-system-tests --test chaos_broker -- --ignored --test-threads=1

bench: ## the full benchmark on a fresh database (a few minutes); writes docs/bench/ (ARGS=... passes options)
	scripts/bench.sh $(ARGS)

down: ## stop the attune started by quickstart
	@if [ -f .attune/up.pid ] && kill -0 $$(cat .attune/up.pid) 2>/dev/null; then \
		kill $$(cat .attune/up.pid) && echo "stopped attune (pid $$(cat .attune/up.pid))"; \
	else echo "attune is not running"; fi

settings-doc: ## rewrite the README's settings table from common/src/settings.rs
	ATTUNE_BLESS=1 cargo test -p attune-common --test settings_doc

build:
	cargo build --workspace --bins

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
