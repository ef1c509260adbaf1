# attune: the two commands that matter are `make quickstart` and `make test`.
.PHONY: quickstart test down build fmt lint up

quickstart: ## set everything up, start attune, run an action through the API
	scripts/quickstart.sh

test: ## the whole test suite (what CI runs)
	scripts/test.sh

down: ## stop the attune started by quickstart
	@if [ -f .attune/up.pid ] && kill -0 $$(cat .attune/up.pid) 2>/dev/null; then \
		kill $$(cat .attune/up.pid) && echo "stopped attune (pid $$(cat .attune/up.pid))"; \
	else echo "attune is not running"; fi

build:
	cargo build --workspace --bins

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
