"""Sandbox backends: the contract (base.py), the registry, and the implementations."""
