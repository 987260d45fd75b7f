"""The report's chart choices (queueserver/history/charts.py) on plain lists, without Spark:
bars or steps, linear or log, the headroom above the tallest bar, and names that fit; and the
SVG each chart is drawn as, with the data its hover and zoom read."""
from __future__ import annotations

import json
import math
import re

import pytest

from queueserver.history import charts
from queueserver.history.charts import (BARS_UP_TO, Buckets, chart_kind, ellipsize, headroom,
                                        needs_log, nice_ceiling, plan_counts, plan_times, spread,
                                        tick_positions)

MINUTE = 60_000_000
T0 = 1_767_261_600 * 1_000_000      # 2026-01-01 10:00:00 UTC


def test_few_buckets_are_bars_and_many_are_steps():
    assert chart_kind(1) == chart_kind(2) == chart_kind(BARS_UP_TO) == "bars"
    assert chart_kind(BARS_UP_TO + 1) == chart_kind(240) == "steps"
    assert plan_counts({"added": [4, 7], "completed": [3, 6]}).kind == "bars"
    assert plan_counts({"added": [1] * 180}).kind == "steps"


@pytest.mark.parametrize("values, log", [
    ([5, 6, 7, 5, 6], False),                      # steady
    ([0, 0, 0, 5, 0, 0, 6], False),                # zeros are not traffic: no spread from them
    ([5] * 50 + [2500], True),                     # a burst: 500× the usual minute
    ([5] * 50 + [100], False),                     # 20×: still linear (the rule is "above 20")
    ([5] * 50 + [101], True),
    ([], False), ([0, 0, 0], False), ([7], False),
])
def test_a_log_scale_when_the_busiest_bucket_dwarfs_the_median(values, log):
    assert needs_log(values) is log
    assert plan_counts({"s": values}).log is log


def test_spread_is_the_maximum_over_the_median_of_nonzero_values():
    assert spread([0, 2, 4, 0, 100]) == 25.0
    assert spread([None, math.nan, 3.0]) == 1.0
    assert spread([]) == 1.0


def test_the_log_decision_looks_at_every_series_of_the_chart():
    steady = [5] * 60
    assert not plan_counts({"added": steady, "completed": steady}).log
    assert plan_counts({"added": steady[:-1] + [3000], "completed": steady}).log


def test_times_ignore_blank_buckets():
    plan = plan_times({"p50": [None, 0.01, None, 0.012], "p99": [None, 0.02, None, 5.0]})
    assert plan.log and plan.kind == "bars" and plan.top > 5.0
    flat = plan_times({"p50": [None, 1.0, 1.2]})
    assert not flat.log and 1.2 * 1.1 <= flat.top


@pytest.mark.parametrize("peak", [1, 2, 3, 7, 9, 10, 19, 20, 99, 100, 101, 1234, 2500, 99_999])
def test_bars_have_headroom_to_a_round_number(peak):
    top = headroom(peak)
    assert top >= peak * 1.1 and top > peak
    assert top <= max(peak * 1.6, peak + 2)          # room, not a half-empty chart
    assert top == nice_ceiling(top)                  # a round number: a tick can sit there
    log_top = headroom(peak, log=True)
    assert log_top > peak * 2


def test_headroom_of_nothing_and_of_small_counts():
    assert headroom(0) == 1.0
    assert headroom(1) == 2.0
    assert headroom(0.004, integers=False) > 0.004


def test_nice_ceiling_rounds_up_to_a_round_step():
    assert [nice_ceiling(v) for v in (0.9, 8.8, 11, 23, 77, 110, 2750)] == [
        1.0, 10.0, 12.5, 25.0, 80.0, 125.0, 3000.0]


def test_long_names_are_ellipsized():
    assert ellipsize("emails") == "emails"
    long = "billing." * 20
    cut = ellipsize(long, 32)
    assert len(cut) == 32 and cut.endswith("…") and long.startswith(cut[:-1])


def test_ticks_fit_and_fall_on_round_buckets():
    assert tick_positions(3) == [0, 1, 2]
    for count in (10, 41, 180, 240):
        ticks = tick_positions(count)
        assert 2 <= len(ticks) <= 9 and ticks[0] == 0 and ticks[-1] < count
        assert len({b - a for a, b in zip(ticks, ticks[1:])}) == 1


def test_bucket_labels_show_the_date_where_it_changes():
    axis = Buckets(T0 + 14 * 60 * MINUTE - 2 * MINUTE, MINUTE, 4, "minute")   # 23:58 .. 00:01
    assert [axis.label(i, i - 1 if i else None) for i in range(4)] == [
        "23:58\nJan 01", "23:59", "00:00\nJan 02", "00:01"]


def test_totals_are_zero_where_nothing_happened():
    axis = Buckets(T0, MINUTE, 4, "minute")
    rows = [(T0, {"added": 3}), (T0 + 3 * MINUTE, {"added": 1, "completed": 2}),
            (T0 + 3 * MINUTE, {"added": 1})]
    assert charts.totals(rows, axis, ["added", "completed"]) == {
        "added": [3, 0, 0, 2], "completed": [0, 0, 0, 2]}


def svgs(chart) -> list:
    """Each ``<svg class="chart">`` of a chart with its data: (markup, data)."""
    found = re.findall(r'(<svg class="chart".*?</svg>)<script type="application/json" '
                       r'class="chart-data">(.*?)</script>', chart.markup, re.S)
    assert found, chart.markup[:300]
    return [(svg, json.loads(data)) for svg, data in found]


def marks(svg: str) -> int:
    """The bars or cells drawn in a chart's plot area (its background, hover and selection aside)."""
    [area] = re.findall(r'<svg class="area".*?</svg>', svg, re.S)
    return area.count("<rect") - 3


def test_charts_are_drawn_as_planned():
    two = Buckets(T0, MINUTE, 2, "minute")
    chart = charts.counts_chart("Jobs", two, {"added": [4, 7], "completed": [3, 6]}, "jobs")
    assert chart.plan is not None and (chart.plan.kind, chart.plan.log) == ("bars", False)
    assert "Log scale" not in chart.subtitle
    [(svg, data)] = svgs(chart)
    assert marks(svg) == 4                                        # a bar per bucket and series
    assert [s["values"] for s in data["series"]] == [[4, 7], [3, 6]]
    assert (data["axis"], data["count"], data["first"], data["width"]) == ("time", 2, T0 // 1000,
                                                                          MINUTE // 1000)
    assert re.findall(r'class="value" data-bx="[^"]+">(\d+)<', svg) == ["4", "7", "3", "6"]

    many = Buckets(T0, MINUTE, 180, "minute")
    burst = [5] * 180
    burst[120] = 2500
    chart = charts.counts_chart("Jobs", many, {"added": burst}, "jobs")
    assert chart.plan is not None and (chart.plan.kind, chart.plan.log) == ("steps", True)
    assert "Log scale" in chart.subtitle and "500×" in chart.subtitle
    [(svg, data)] = svgs(chart)
    assert '<svg class="area" ' in svg and 'viewBox="0 0 180 ' in svg      # the plot, in buckets
    assert svg.count('<path class="line"') == 1 and marks(svg) == 0   # one path, no bars
    assert re.findall(r'class="tick">(\w+)</text>', svg)[:4] == ["0", "1", "10", "100"]   # log ticks

    three = Buckets(T0, MINUTE, 3, "minute")
    times = charts.times_chart("Times", three,
                               {"wait": {"p50": [0.01, None, 0.012], "p99": [0.02, None, 5.0]},
                                "run": {"p50": [1.0, 1.1, None], "p99": [1.2, 1.3, None]}})
    assert "log scale for wait times" in times.subtitle.lower() and "run" not in times.subtitle
    panels = svgs(times)
    assert [data["panel"] for _, data in panels] == ["wait", "run"]
    assert panels[0][1]["series"][1]["values"] == [0.02, None, 5.0]        # a blank stays blank
    queues = charts.queues_chart("Queues", [("x" * 200, {"completed": 5, "failed": 1}),
                                            ("short", {"completed": 2})])
    [(svg, data)] = svgs(queues)
    assert re.findall(r'class="name">([^<]*)<', svg) == ["x" * 31 + "…", "short"]   # cut on the chart
    assert data["rows"][0]["name"] == "x" * 200                           # whole in the hover


def test_the_queue_heat_map_turns_logarithmic_for_a_burst():
    axis = Buckets(T0, MINUTE, 180, "minute")
    steady = [("q1", [3] * 180), ("x" * 150, [0] * 90 + [2] * 90)]
    assert "Log colour" not in charts.heatmap_chart("Added", axis, steady, "jobs").subtitle
    burst = steady + [("burst", [0] * 120 + [2500] + [0] * 59)]
    chart = charts.heatmap_chart("Added", axis, burst, "jobs")
    assert "Log colour scale" in chart.subtitle
    [(svg, data)] = svgs(chart)
    assert data["kind"] == "heat" and [r["name"] for r in data["rows"]] == ["q1", "x" * 150, "burst"]
    assert marks(svg) == 180 + 90 + 1                                      # a cell where there are jobs


def test_heat_colours_grow_darker_with_the_count():
    light, dark = charts.heat_color(1, 100, False), charts.heat_color(100, 100, False)
    assert light != dark and dark == charts.HEAT[-1]
    assert charts.heat_color(10, 100, True) == charts.heat_color(50, 100, False)   # log: 10 is halfway
    assert sum(int(dark[i:i + 2], 16) for i in (1, 3, 5)) < sum(int(light[i:i + 2], 16) for i in (1, 3, 5))


def test_charts_of_nothing_are_still_drawn():
    one = Buckets(T0, MINUTE, 1, "minute")
    for chart in (charts.heatmap_chart("Added", one, [], "jobs"),
                  charts.counts_chart("Jobs", one, {"added": [0]}, "jobs"),
                  charts.times_chart("T", one, {"wait": {"p50": [None]}}),
                  charts.queues_chart("Q", [])):
        assert svgs(chart)


def test_a_value_cannot_end_the_data_element():
    one = Buckets(T0, MINUTE, 1, "minute")
    chart = charts.heatmap_chart("Added", one, [("</script><b>", [1])], "jobs")
    [(_, data)] = svgs(chart)
    assert data["rows"][0]["name"] == "</script><b>" and "</script><b>" not in chart.markup
