"""Thinking Seeds for TRL: restart on-policy GRPO from the model's own earlier reasoning states."""

__version__ = "0.1.0"
