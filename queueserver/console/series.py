"""A node's throughput and depth over time, kept at several resolutions for
the console's charts: the last hour every 5 s, the last day every minute,
the last week every 10 minutes (:data:`RESOLUTIONS`). Pure: each sample
comes with its time, nothing here reads a clock.

A sample is the node's rates (added, completed, failed per second over the
interval that ends at its time), its jobs by state, and each queue's rates
and depth (jobs held). Queues are many and points are thousands, so a point
keeps at most :data:`MAX_QUEUES` queues, the most active (rates, then
depth), packed into one array of floats; a queue missing from a point was
idle (no rates, no jobs) when the point is ``complete``, unknown otherwise
(more queues were active than a point keeps). A coarser point sums its
finer samples' jobs counted (rates weighted by their intervals) and takes
the depth of the last of them. Memory stays bounded: some 3,200 points of
at most :data:`MAX_QUEUES` queues each (a few MB at the most).
"""
from __future__ import annotations

from array import array
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

#: (seconds per point, points kept) of each resolution, finest first.
RESOLUTIONS: Tuple[Tuple[int, int], ...] = ((5, 720), (60, 1440), (600, 1008))
#: The ranges a chart may show, by name, in seconds.
RANGES: Dict[str, int] = {"30m": 1800, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800}
#: Queues one point keeps (the most active).
MAX_QUEUES = 100
#: A node's values per point: rates, then jobs by state.
NODE_KEYS = ("added", "completed", "failed", "ready", "scheduled", "leased", "finished")
#: A queue's values per point.
QUEUE_KEYS = ("added", "completed", "failed", "depth")

#: A queue's values in a sample: added, completed, failed per second, and its depth.
QueueValues = Tuple[float, float, float, float]


class Point:
    """One point of a resolution (see the module's docstring)."""

    __slots__ = ("t", "node", "names", "values", "complete")

    def __init__(self, t: float, node: Sequence[float], names: Tuple[str, ...], values: "array[float]",
                 complete: bool) -> None:
        self.t = t                  # unix time, the end of its interval
        self.node = tuple(node)     # NODE_KEYS
        self.names = names          # the queues it keeps (shared with the point before when the same)
        self.values = values        # QUEUE_KEYS of each of names, one after another
        self.complete = complete    # every active queue is among names

    def queue(self, name: str) -> Optional[QueueValues]:
        """``name``'s values; zeros if it was idle, None if not known."""
        try:
            i = self.names.index(name) * 4
        except ValueError:
            return (0.0, 0.0, 0.0, 0.0) if self.complete else None
        v = self.values
        return v[i], v[i + 1], v[i + 2], v[i + 3]


def _busiest(queues: Dict[str, QueueValues], most: int) -> List[str]:
    """The ``most`` queues of ``queues`` with the highest rates (then depth), in name order."""
    names = list(queues)
    if len(names) > most:
        names.sort(key=lambda n: (-(queues[n][0] + queues[n][1] + queues[n][2]), -queues[n][3], n))
        names = names[:most]
    return sorted(names)


class _Ring:
    """One resolution: its points, and the sum of the finer samples of the point under way."""

    def __init__(self, step: int, size: int) -> None:
        self.step = step
        self.points: Deque[Point] = deque(maxlen=size)
        self._start: Optional[float] = None      # where the point under way began
        self._seconds = 0.0
        self._node = [0.0] * 3                   # jobs counted (rate x seconds)
        self._states: Sequence[float] = (0.0, 0.0, 0.0, 0.0)
        self._queues: Dict[str, List[float]] = {}   # name -> jobs counted x3, its last depth
        self._complete = True

    def take(self, t: float, seconds: float, node: Sequence[float], queues: Dict[str, QueueValues],
             complete: bool) -> None:
        """A sample of ``seconds`` ending at ``t``; a point once they cover a step."""
        if self._start is None:
            self._start = t - seconds
        self._seconds += seconds
        for i in range(3):
            self._node[i] += node[i] * seconds
        self._states = node[3:7]
        for acc in self._queues.values():   # a queue not in this sample: no jobs now (if complete)
            acc[3] = 0.0
        for name, values in queues.items():
            acc = self._queues.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += values[i] * seconds
            acc[3] = values[3]
        self._complete = self._complete and complete
        if t - self._start >= self.step - 0.5:   # (sampling times wander a little)
            self._close(t)

    def _close(self, t: float) -> None:
        seconds = self._seconds or 1.0
        node = [self._node[i] / seconds for i in range(3)] + list(self._states)
        queues = {name: (acc[0] / seconds, acc[1] / seconds, acc[2] / seconds, acc[3])
                  for name, acc in self._queues.items() if any(acc)}
        self.append(Point(t, node, (), array("d"), True), queues, self._complete)
        self._start, self._seconds, self._node = None, 0.0, [0.0] * 3
        self._queues, self._complete = {}, True

    def append(self, point: Point, queues: Dict[str, QueueValues], complete: bool) -> None:
        """Keep ``point`` with the busiest of ``queues`` packed in."""
        names = tuple(_busiest(queues, MAX_QUEUES))
        if self.points and self.points[-1].names == names:
            names = self.points[-1].names   # one tuple for a run of points alike
        point.names = names
        point.values = array("d", [x for name in names for x in queues[name]])
        point.complete = complete and len(names) == len(queues)
        self.points.append(point)


class Series:
    """Every resolution's points (see the module's docstring)."""

    def __init__(self, resolutions: Sequence[Tuple[int, int]] = RESOLUTIONS) -> None:
        self.rings = [_Ring(step, size) for step, size in resolutions]

    def add(self, t: float, seconds: float, node: Sequence[float], queues: Dict[str, QueueValues]) -> None:
        """A sample: over the ``seconds`` up to ``t`` (unix time), the node's
        :data:`NODE_KEYS` and each active queue's :data:`QUEUE_KEYS` (a queue
        left out had no rates and no jobs)."""
        finest, *coarser = self.rings
        finest.append(Point(t, node, (), array("d"), True), queues, True)
        for ring in coarser:
            ring.take(t, seconds, node, queues, True)

    def latest(self) -> Optional[Point]:
        points = self.rings[0].points
        return points[-1] if points else None

    def ring_for(self, seconds: float) -> _Ring:
        """The finest resolution whose points reach ``seconds`` back, or
        that still holds every point since the first sample (a node up for
        less than the range: its finest view of all it has)."""
        for ring in self.rings:
            size = ring.points.maxlen or 0
            if ring.step * size >= seconds or len(ring.points) < size:
                return ring
        return self.rings[-1]

    def window(self, seconds: float, now: Optional[float] = None) -> Tuple[int, List[Point]]:
        """``(step, the points of the last seconds)``, oldest first (``now``:
        the end of the window; the newest point's time if None)."""
        ring = self.ring_for(seconds)
        points = list(ring.points)
        if not points:
            return ring.step, []
        end = now if now is not None else points[-1].t
        return ring.step, [p for p in points if p.t > end - seconds]
