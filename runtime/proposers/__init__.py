"""Drafters: where draft tokens come from. One proposer per module, one interface."""

from .base import Draft, Proposer, TargetOutput  # noqa: F401
