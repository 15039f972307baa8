# The two set-up commands of the README, and what they need.
SHELL := /bin/bash
APT_PACKAGES := mariadb-server mariadb-client mariadb-test sysbench libmariadb-dev pkg-config python3-venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: playground test test-shuffled deps check bench fuzz

playground: deps
	cargo run --release --bin hscale -- playground

test: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo check --manifest-path fuzz/Cargo.toml --locked --target-dir target
	cargo test --workspace
	tests/compat/run.sh

# The Rust tests with the test binaries and each binary's tests in an order
# drawn from SEED (tests/shuffled.sh; a random seed, printed, when unset).
test-shuffled: deps
	tests/shuffled.sh $(SEED)

# MariaDB server, client and test suite (mariadb-test), sysbench, and what
# the mysqlclient suite builds
# with, from the OS packages, when missing.
deps:
	@missing=""; \
	command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing="$$missing mariadb-server"; \
	command -v mariadb >/dev/null || missing="$$missing mariadb-client"; \
	command -v sysbench >/dev/null || missing="$$missing sysbench"; \
	command -v mariadb-test >/dev/null || missing="$$missing mariadb-test"; \
	pkg-config --exists libmariadb 2>/dev/null || missing="$$missing libmariadb-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(APT_PACKAGES); \
	fi

bench: deps
	bench/seed.sh

# Each fuzz target for FUZZ_SECONDS: SQL analysis, backend responses, client
# packets, the admin grammar (fuzz/); `make test` checks that they compile. Needs a nightly toolchain and `cargo install cargo-fuzz`.
FUZZ_SECONDS ?= 60
fuzz:
	cd fuzz && for target in statement backend_response client_packets admin_command; do \
	  cargo +nightly fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done
