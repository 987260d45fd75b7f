"""Job functions the worker tests run."""
import time


def shout(job):
    return job.payload.upper()


def boom(job):
    raise ValueError(f"cannot handle {job.payload!r}")


def dawdle(job):
    # Sleeping is the point: a job that outlives its TTR (the payload's
    # seconds, longer than the TTR the test gives). time.sleep never returns
    # early, so the TTR always runs out first.
    time.sleep(float(job.payload))
    return b"too late"
