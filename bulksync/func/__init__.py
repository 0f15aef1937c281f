"""The functional API, as ``langgraph.func`` has it: ``@entrypoint`` and ``@task``."""

from bulksync.func.entrypoint import EntrypointGraph, entrypoint
from bulksync.func.task import TaskFunction, task

__all__ = ["EntrypointGraph", "TaskFunction", "entrypoint", "task"]
