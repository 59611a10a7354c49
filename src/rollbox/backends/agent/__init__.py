"""The in-sandbox agent: a static C program (``agent.c``) that runs as the sandbox's PID 1
and runs commands on request over a unix socket, and its host-side client."""

from rollbox.backends.agent.build import agent_binary
from rollbox.backends.agent.client import AgentClient
from rollbox.backends.agent.protocol import ExecRequest

__all__ = ["AgentClient", "ExecRequest", "agent_binary"]
