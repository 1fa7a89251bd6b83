"""A deterministic simulator of the failure side: the coordinator machine, a rank machine per
member and a simulated network on one virtual clock, from a seed (world.py)."""
