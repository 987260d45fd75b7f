"""What an engine event means for its job: the one rule that both the job
history (:mod:`.history`) and the metrics (:mod:`.stats`) read a job's
steps and outcome from, so that they never disagree.

An engine event is named by its kind and read with its job's state once
the event is over (a job it removed: as it was when it went). The history
event it makes is a step (``added``, ``leased``, ``requeued``, ...) or one
of the :data:`FINAL` events, which end the job and are its outcome.

A job ends once. A finished job may be kept (for ``result``) until its TTL
runs out or it is deleted, but dropping it then is not an outcome: its
first final event stays its outcome, so that drop makes no event at all.
takeanumber's DONE and goqueue's DELETE of a reserved job, and a RETRY with
no retries left, reach here as ``complete`` or ``fail`` followed by such a
drop (the engine makes them so): completed, and failed.
"""
from __future__ import annotations

from typing import Final, Optional

from ..engine.job import COMPLETED, FAILED
from ..engine.ops import HISTORY_STEPS

#: history events that end a job: its outcome
FINAL: Final = frozenset(("completed", "failed", "dead", "expired", "deleted", "taken"))


def history_event(kind: str, state: int) -> Optional[str]:
    """The history event of engine event ``kind`` whose job is in ``state``
    after it (its steps are declared in :data:`queueserver.engine.ops.EVENT_KINDS`);
    None when it is no step of a job's life (a wake-up, a slot move) or drops
    a job that had finished already."""
    steps = HISTORY_STEPS.get(kind)
    if steps is None:
        return None
    if state == FAILED:
        return steps[2]
    return steps[1] if state == COMPLETED else steps[0]
