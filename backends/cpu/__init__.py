"""The CPU backend: torch trainer cells and HTTP engines on Ray, weights over gloo."""
