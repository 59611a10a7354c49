"""Rollouts and runs: Harbor task loader, agents, verifier, runner."""
