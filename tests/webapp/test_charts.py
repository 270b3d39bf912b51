"""Sparkline geometry (pure): steps that hold each value until the next sample, gaps for
unknown values, a window ending at the newest sample."""

from __future__ import annotations

import re

from orchestrator.control.rules.state import Sample
from tests.support.view_states import cluster
from webapp.views.charts import WINDOW_S, sparkline, step_chart, throughput_chart


def coords(path: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", path)]


def test_nothing_to_draw():
    c = sparkline([])
    assert c["empty"] and c["line"] == "" and c["area"] == "" and c["latest"] is None and c["peak"] is None


def test_steps_hold_each_value_and_the_newest_reaches_the_right_edge():
    c = sparkline([(0, 0), (15, 10), (30, 5)], width=100, height=20, pad=0)
    assert c["line"] == "M0 20 H50 V0 H100 V10" and c["peak"] == 10 and c["latest"] == 5 and c["top"] == 10
    assert c["area"] == "M0 20 V20 H50 V0 H100 V10 H100 V20 Z"


def test_unknown_values_break_the_line_after_holding_until_then():
    c = sparkline([(0, 4), (10, None), (20, 2), (30, 4)], width=30, height=10, pad=0)
    assert c["line"] == "M0 0 H10 V0 M20 5 H30 V0"
    assert c["area"].count("Z") == 2 and not c["empty"]


def test_a_value_from_before_the_window_is_carried_in_from_the_left():
    c = sparkline([(0, 8), (100, 8), (120, 4)], width=60, height=10, pad=0)  # window 90..120
    assert c["line"] == "M0 0 H20 V0 H60 V5"
    assert c["peak"] == 8


def test_every_point_stays_inside_the_box_and_small_values_do_not_fill_it():
    points = [(k, (k * 37) % 11) for k in range(0, 60)]
    c = sparkline(points, width=160, height=32, pad=3)
    values = coords(c["line"]) + coords(c["area"])
    assert all(0 <= v <= 160 for v in values)
    ys = [float(v) for v in re.findall(r"V(-?\d+(?:\.\d+)?)", c["line"] + c["area"])]
    assert ys and all(0 <= y <= 32 for y in ys)
    quiet = sparkline([(0, 0.01), (1, 0.02)], min_top=1.0, height=40, pad=3)
    assert quiet["top"] == 1.0 and all(y > 30 for y in coords(quiet["line"])[1::2])


def test_session_charts_label_their_numbers():
    s = cluster()
    t = throughput_chart(s)
    assert t["now"] == "4.0 tokens/s" and t["peak_text"] == "6.0 tokens/s" and "tokens per second" in t["aria"]
    st = step_chart(s, 1)
    assert st["now"] == "30.0 ms" and st["width"] == 160.0
    assert step_chart(s.model_copy(update={"samples": (Sample(at=1.0, step_ms=(5.0,)),)}), 1)["empty"]
    assert WINDOW_S == 30.0
