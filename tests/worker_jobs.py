"""Job functions the worker tests run."""
import time


def shout(job):
    return job.payload.upper()


def boom(job):
    raise ValueError(f"cannot handle {job.payload!r}")


def dawdle(job):
    time.sleep(float(job.payload))
    return b"too late"
