"""The console's time series (queueserver.console.series), fed samples with
a fake clock: a day and a week of samples are kept at coarser resolutions
(ranges past the finest hour), rates are averaged over a coarse point and
depth is its last sample's, a node younger than a range shows all it has,
and a point keeps only the busiest queues, saying when it left some out."""
from __future__ import annotations

from queueserver.console.series import MAX_QUEUES, RANGES, RESOLUTIONS, Series

T0 = 1_800_000_000.0


def feed(series: Series, samples: int, step: float = 5.0, start: float = T0, **queues: float) -> float:
    """``samples`` samples ``step`` apart: 10 added/s on the node, depth growing by one a sample;
    each named queue adding its rate; returns the last sample's time."""
    t = start
    for i in range(samples):
        t = start + (i + 1) * step
        series.add(t, step, (10.0, 8.0, 1.0, float(i), 2.0, 3.0, 4.0),
                   {name: (rate, 0.0, 0.0, float(i)) for name, rate in queues.items()})
    return t


def test_a_day_is_kept_a_minute_a_point_and_a_week_ten_minutes_a_point():
    series = Series()
    day = 86_400 // 5
    end = feed(series, day + 10, emails=2.0)
    step, hour = series.window(RANGES["1h"])
    assert step == 5 and len(hour) == 720 and hour[-1].t == end
    step, points = series.window(RANGES["24h"])
    assert step == 60 and 1430 <= len(points) <= 1440          # a day of minutes, not 5-second points
    assert points[-1].t > end - 120 and points[0].t <= end - 86_000
    assert all(abs(p.node[0] - 10.0) < 1e-9 for p in points)  # rates averaged over each minute
    last = points[-1]
    index = round((last.t - T0) / 5) - 1   # the sample the point ended with
    assert last.node[3] == float(index) and last.node[4:] == (2.0, 3.0, 4.0)   # depth: its last sample's
    assert last.queue("emails") == (2.0, 0.0, 0.0, float(index))
    step, week = series.window(RANGES["7d"])
    assert step == 600 and 140 <= len(week) <= 145               # the day so far, ten minutes a point
    assert all(abs(p.node[1] - 8.0) < 1e-9 for p in week)


def test_a_week_of_samples_stays_bounded():
    small = Series(((1, 60), (10, 60), (100, 60)))   # the same rings, scaled down
    end = feed(small, 20_000, step=1.0, busy=1.0)
    assert [len(ring.points) for ring in small.rings] == [60, 60, 60]
    step, points = small.window(6000)
    assert step == 100 and len(points) == 60 and points[-1].t <= end
    assert points[-1].queue("busy")[0] == 1.0


def test_a_young_node_shows_all_it_has_whatever_the_range():
    series = Series()
    end = feed(series, 30)   # two and a half minutes
    for name, seconds in RANGES.items():
        step, points = series.window(seconds)
        assert step == 5 and len(points) == 30 and points[-1].t == end, name


def test_a_point_keeps_the_busiest_queues_and_says_when_it_left_some_out():
    series = Series()
    busy = {f"q{i:03d}": float(i + 1) for i in range(MAX_QUEUES + 20)}
    feed(series, 1, **busy)
    point = series.latest()
    assert point is not None and not point.complete and len(point.names) == MAX_QUEUES
    assert point.queue(f"q{MAX_QUEUES + 19:03d}")[0] == float(MAX_QUEUES + 20)   # the busiest kept
    assert point.queue("q000") is None                                          # left out: not known
    feed(series, 1, start=T0 + 5, only=3.0)
    point = series.latest()
    assert point.complete and point.queue("q000") == (0.0, 0.0, 0.0, 0.0)       # idle: zeros
    assert point.queue("only")[0] == 3.0


def test_resolutions_reach_a_week():
    assert RESOLUTIONS[-1][0] * RESOLUTIONS[-1][1] >= RANGES["7d"]
    assert max(RANGES.values()) > 1800   # ranges longer than the old 30 minutes
