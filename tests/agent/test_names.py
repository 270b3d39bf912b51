"""Names that become paths: whatever is accepted stays inside its directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.agent.names import InvalidName, check_id, check_model_id, check_relpath

# Strings built from the characters that matter for traversal, plus anything else.
tricky = st.lists(st.sampled_from(list("./\\a0_-~:%\x00 ") + ["..", "../", "/..", "%2e"]), max_size=12).map("".join)


@given(st.one_of(tricky, st.text(max_size=40)))
def test_an_accepted_relpath_stays_inside_the_base(text):
    base = Path("/base/model")
    try:
        check_relpath(text)
    except InvalidName:
        return
    resolved = Path(os.path.normpath(base / text))
    assert resolved.is_relative_to(base) and resolved != base
    assert ".." not in text.split("/") and not text.startswith("/") and "\\" not in text


@given(st.one_of(tricky, st.text(max_size=40)))
def test_an_accepted_id_is_one_visible_path_component(text):
    try:
        check_model_id(text)
    except InvalidName:
        return
    assert "/" not in text and not text.startswith(".") and ".." not in text and text


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "/etc", ".hidden", "a..b", "x" * 129, "a b", "a\x00"])
def test_bad_ids(bad):
    with pytest.raises(InvalidName):
        check_id(bad)


@pytest.mark.parametrize("bad", ["x.part", "sub/model.safetensors.part",  # the agent's partial files (issue 20)
                                 "", "/etc/passwd", "../x", "a/../b", "a//b", "a/./b", "a\\b", "a/", "x\x00",
                                 "a/b/c/d/e", "é.json"])
def test_bad_relpaths(bad):
    with pytest.raises(InvalidName):
        check_relpath(bad)


@pytest.mark.parametrize("good", ["config.json", "model-00001-of-00002.safetensors", ".gitattributes",
                                  "original/params.json", "a/b/c/d.txt"])
def test_good_relpaths(good):
    assert check_relpath(good) == good
