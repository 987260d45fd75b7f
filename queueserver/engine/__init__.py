"""The pure engine: jobs, queues, timers and the state machine over them."""
from .engine import Engine, lease_view, result_view, inspect_view
from .job import Job, NEW, COMPLETED, FAILED, PENDING, LEASED

__all__ = ["Engine", "Job", "lease_view", "result_view", "inspect_view",
           "NEW", "COMPLETED", "FAILED", "PENDING", "LEASED"]
