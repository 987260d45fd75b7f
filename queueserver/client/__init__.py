"""The Python workq client and the worker loop built on it."""
from .client import (Client, ClientError, ConnectionLost, Job, JobInfo, NotFound, Result, ServerError,
                     TimedOut, WorkqError)
from .worker import Worker, load_handler

__all__ = ["Client", "ClientError", "ConnectionLost", "Job", "JobInfo", "NotFound", "Result",
           "ServerError", "TimedOut", "WorkqError", "Worker", "load_handler"]
