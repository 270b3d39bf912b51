"""The live charts' data, pure: the token counter from /metrics, tokens/s between looks,
samples carried by SessionObserved and kept (the last 60) by the transitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.control import store
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.chart_samples import (
    TOKENS_METRIC,
    metric_value,
    recent_rate,
    remember,
    same_reading,
    sample,
    tokens_per_second,
)
from orchestrator.control.rules.state import SAMPLES, Sample, StageStatus, State
from orchestrator.control.rules.transitions import apply
from orchestrator.engine.coordinator.metrics import Metrics
from tests.support.sessions import running_session as session


def test_the_counter_is_read_from_the_coordinators_own_exposition_text():
    m = Metrics(["stage-0", "stage-1"])
    assert metric_value(m.render(), TOKENS_METRIC) == 0.0
    m.add_tokens(42)
    m.observe_stage("stage-0", {"step_ms": 3.5})
    assert metric_value(m.render(), TOKENS_METRIC) == 42.0


@pytest.mark.parametrize("text,expected", [
    ("", None),
    ("# HELP pipeserve_generated_tokens_total Tokens.\n# TYPE pipeserve_generated_tokens_total counter\n", None),
    ("pipeserve_generated_tokens_total 17\n", 17.0),
    ("pipeserve_generated_tokens_total{} 17 1700000000000\n", 17.0),  # empty labels and a timestamp
    ('pipeserve_generated_tokens_total{stage="x"} 5\npipeserve_generated_tokens_total 9\n', 9.0),  # labelled: skipped
    ("pipeserve_generated_tokens_total_created 123\npipeserve_generated_tokens_total 2.5e3\n", 2500.0),
    ("pipeserve_generated_tokens_total NaN-ish\n", None),
    ("pipeserve_prompt_tokens_total 8\n", None),
])
def test_metric_value(text: str, expected: float | None):
    assert metric_value(text, TOKENS_METRIC) == expected


def test_tokens_per_second_between_two_readings():
    assert tokens_per_second((10.0, 100), (12.0, 150)) == 25.0
    assert tokens_per_second((10.0, 100), (10.3, 101)) == 3.3  # one decimal
    assert tokens_per_second(None, (1.0, 5)) is None and tokens_per_second((1.0, 5), None) is None
    assert tokens_per_second((2.0, 5), (2.0, 9)) is None  # no time passed
    assert tokens_per_second((1.0, 50), (2.0, 3)) is None  # counter went back: a restarted coordinator


def test_the_rate_spans_the_last_readings_and_starts_over_after_a_gap_or_a_reset():
    readings: tuple = ()
    for k in range(8):  # 10 tokens every half second
        readings = remember(readings, (k * 0.5, 10.0 * k), keep=5)
    assert len(readings) == 5 and readings[0] == (1.5, 30.0) and recent_rate(readings) == 20.0
    assert recent_rate(remember((), (0.0, 1.0))) is None  # one reading: no rate yet
    assert remember(readings, None) == ()  # unreadable: start over
    assert remember(readings, (9.0, 3.0)) == ((9.0, 3.0),)  # counter reset: start over


def test_a_slow_decode_reads_its_rate_not_a_flicker_to_zero():
    readings: tuple = ()
    rates = []
    for k in range(60):  # a look every 0.4 s; a token every 3.2 s (0.31 tok/s) from t = 2 s
        t = k * 0.4
        readings = remember(readings, (t, float(max(0, int((t - 2) / 3.2) + 1)) if t >= 2 else 0.0))
        rates.append(recent_rate(readings, busy=True))
    decoding = rates[20:]
    assert all(r is not None and 0.15 <= r <= 0.7 for r in decoding), decoding
    # the same readings while nothing is in flight: the last 2 s only (0 between tokens, as it is)
    assert recent_rate(readings, busy=False) in (0.0, 0.5)
    assert len(readings) == 60 and len(remember(readings * 2, (99.0, 99.0))) == 75


def test_a_sample_rounds_and_same_reading_ignores_time():
    statuses = (StageStatus(step_ms=12.3456), StageStatus(step_ms=None))
    a = sample(100.0, 4.0, statuses)
    assert a == Sample(at=100.0, tokens_per_s=4.0, step_ms=(12.35, None))
    assert same_reading(a, sample(100.5, 4.0, statuses))
    assert not same_reading(a, sample(100.5, 4.1, statuses))
    assert not same_reading(a, sample(100.5, 4.0, (StageStatus(step_ms=12.0), StageStatus())))
    assert not same_reading(None, a)


def test_session_observed_appends_its_sample_and_keeps_the_last_sixty():
    st = State(sessions=(session(),))
    status = (StageStatus(alive=True), StageStatus(alive=True))
    for k in range(SAMPLES + 5):
        st = apply(st, ev.SessionObserved(session_id="s1", stage_status=status,
                                          sample=Sample(at=float(k), tokens_per_s=float(k))))
    kept = st.session("s1").samples
    assert len(kept) == SAMPLES and kept[0].at == 5.0 and kept[-1].at == SAMPLES + 4.0
    # a look without a sample (only a status changed) keeps the samples
    after = apply(st, ev.SessionObserved(session_id="s1", stage_status=(StageStatus(alive=False), StageStatus())))
    assert after.session("s1").samples == kept and after.session("s1").stage_status[0].alive is False
    assert after.version == st.version + 1


def test_an_observation_of_an_unknown_session_changes_nothing():
    st = State(sessions=(session(),))
    assert apply(st, ev.SessionObserved(session_id="nope", stage_status=(), sample=Sample(at=1.0))) is st


def test_samples_are_live_only_never_persisted(tmp_path: Path):
    s = session().model_copy(update={"samples": (Sample(at=1.0, tokens_per_s=3.0),)})
    store.save(tmp_path, State(sessions=(s,)))
    assert "tokens_per_s" not in (tmp_path / "control.json").read_text()
    assert store.load(tmp_path).sessions[0].samples == ()
