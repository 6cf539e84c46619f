"""Drafters: where draft tokens come from. One proposer per module, one interface."""

from .base import Proposal, Proposer  # noqa: F401
