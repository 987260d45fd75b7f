"""Nodes, slots and moves: queueserver across hosts."""
