# Entry points; the README's two commands are `make demo` and `make test`.
.PHONY: setup test demo proto lint e2e

setup:
	scripts/setup

test:
	scripts/test

demo:
	scripts/setup --runtime
	.venv/bin/ballast-csi demo

proto:
	.venv/bin/python proto/generate.py

lint: setup
	.venv/bin/ruff check csi shim tests benchmarks && .venv/bin/mypy

# The Kubernetes test bed alone (real control plane + sidecars; builds them on first use).
e2e:
	scripts/test tests/e2e
