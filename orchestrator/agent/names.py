"""Validation of every name the agent turns into a file path: model ids, ids, file paths.

Pure functions. A name is checked here *and* the resulting path is resolved and checked
for containment where it is used (`inventory.contained`), so neither a clever string nor a
symlink can reach outside the models or state directory.
"""

from __future__ import annotations

import re

# Model ids and process ids: one path component, starting with a letter or digit (so never
# "." / ".." nor one of the agent's hidden working directories such as ".partial").
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Components of a file inside a model: HF repositories hold names such as
# ".gitattributes" or "tokenizer.model"; spaces, backslashes and control characters are out.
_COMPONENT = re.compile(r"[A-Za-z0-9._+-]{1,255}")
MAX_DEPTH = 4


class InvalidName(ValueError):
    """A model id, id or file path that could escape its directory or is malformed."""


def check_id(value: str, what: str = "id") -> str:
    """Return `value` if it is a safe single path component, else raise InvalidName."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise InvalidName(f"invalid {what} {value!r}: use 1-128 of A-Z a-z 0-9 . _ -, starting with a "
                          f"letter or digit, without '..'")
    return value


def check_model_id(value: str) -> str:
    """A model id is the name of one directory directly inside the models directory."""
    return check_id(value, "model id")


PARTIAL_SUFFIX = ".part"  # what a file being downloaded is called until it is verified


def check_relpath(value: str) -> str:
    """Return a model file's relative path ("a/b.json") if safe, else raise InvalidName."""
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise InvalidName(f"invalid file path {value!r}")
    parts = value.split("/")
    if len(parts) > MAX_DEPTH:
        raise InvalidName(f"invalid file path {value!r}: more than {MAX_DEPTH} levels")
    for part in parts:
        if part in (".", "..") or not _COMPONENT.fullmatch(part):
            raise InvalidName(f"invalid file path {value!r}: components use A-Z a-z 0-9 . _ + -, "
                              f"no '.', '..', empty parts or absolute paths")
    if value.endswith(PARTIAL_SUFFIX):
        # The agent's own partial files are named so: a source's `x.part` would be overwritten
        # by the partial of `x` (a job once reported done with the file missing).
        raise InvalidName(f"invalid file path {value!r}: names ending in {PARTIAL_SUFFIX} are this agent's "
                          "partial downloads")
    return value
