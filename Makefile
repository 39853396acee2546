# Shorthands once scripts/setup has installed make; the README's two commands are scripts/demo and
# scripts/test, which need nothing installed first.
.PHONY: setup test test-fast demo proto lint e2e

setup:
	scripts/setup

test:
	scripts/test

demo:
	scripts/demo

proto:
	.venv/bin/python proto/generate.py

# Exactly the static checks CI runs (scripts/test runs scripts/lint before pytest).
lint: setup
	scripts/lint

# The unit tests (fakes; no root, no Go-built tools): about half a minute.
test-fast:
	scripts/setup --runtime
	.venv/bin/pytest tests/unit tests/shim tests/test_tree.py tests/test_docs.py -m "not slow" \
		--ignore tests/shim/test_differential.py -p no:cacheprovider

# The Kubernetes test bed alone (real control plane + sidecars; builds them on first use).
e2e:
	scripts/test tests/e2e
