"""The pure engine: jobs, queues, timers and the state machine over them."""
from .engine import Engine
from .views import LeaseView, as_lease, inspect_view, lease_view, result_view
from .job import Job, NEW, COMPLETED, FAILED, PENDING, LEASED

__all__ = ["Engine", "Job", "LeaseView", "as_lease",
           "lease_view", "result_view", "inspect_view",
           "NEW", "COMPLETED", "FAILED", "PENDING", "LEASED"]
