"""`make bench` rewrites only its own part of docs/benchmark.md: the hand-written runs stay."""

from __future__ import annotations

from e2e.bench.cli import BEGIN, END, merged


def test_a_new_file_holds_the_report_between_the_markers():
    assert merged(None, "# Report\n\nrow\n") == f"{BEGIN}\n# Report\n\nrow\n{END}\n"


def test_a_run_replaces_the_last_report_and_keeps_everything_around_it():
    old = f"intro\n{BEGIN}\n# Report\n\nold rows\n{END}\n\n## A hand-written run\n\nkept\n"
    new = merged(old, "# Report\n\nnew rows\n")
    assert new == f"intro\n{BEGIN}\n# Report\n\nnew rows\n{END}\n\n## A hand-written run\n\nkept\n"
    assert merged(new, "# Report\n\nnew rows\n") == new  # the same report twice: the same file


def test_a_file_without_the_markers_is_kept_after_the_report():
    old = "## Speculative decoding\n\nmeasured by hand\n"
    new = merged(old, "# Report\n")
    assert new.startswith(f"{BEGIN}\n# Report\n{END}\n")
    assert new.endswith(old)
