"""docs/recovery.md lists exactly the crash points (failpoints) the code defines, each once."""

from __future__ import annotations

from collections import Counter

from tests.failpoint_names import in_code, in_docs


def test_the_docs_list_every_failpoint_of_the_code_and_no_other() -> None:
    code, docs = in_code(), in_docs()
    assert len(code) >= 20, "the scan found the failpoints of the code"
    assert {"local.create.file-written", "node.stage.formatted", "aws.attach.requested"} <= set(code)
    twice = sorted(name for name, n in Counter(docs).items() if n > 1)
    assert not twice, f"listed more than once in docs/recovery.md: {twice}"
    missing = {name: where for name, where in code.items() if name not in docs}
    assert not missing, f"failpoints missing from docs/recovery.md: {missing}"
    stale = sorted(set(docs) - set(code))
    assert not stale, f"docs/recovery.md lists failpoints the code does not have: {stale}"
