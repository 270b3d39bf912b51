"""The Prometheus text exposition format, written in one place (the coordinator's and the router's
`GET /metrics`): a metric family is its HELP and TYPE lines and its samples, label values escaped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Labels = Mapping[str, object] | None
Sample = tuple[Labels, float | int | str]


def escape(value: object) -> str:
    """A label value: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample(name: str, value: float | int | str, labels: Labels = None) -> str:
    """One sample line: `name{k="v",...} value`."""
    if labels:
        inner = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {value}"
    return f"{name} {value}"


def family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    """A metric family's lines: HELP, TYPE (counter, gauge, histogram), then each (labels, value)."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *(sample(name, v, labels) for labels, v in samples)]


def one(name: str, kind: str, help_text: str, value: float | int | str) -> list[str]:
    """A family with a single unlabelled sample."""
    return family(name, kind, help_text, [(None, value)])


def exposition(lines: Iterable[str]) -> str:
    """The document: the lines, newline-terminated."""
    return "\n".join(lines) + "\n"
