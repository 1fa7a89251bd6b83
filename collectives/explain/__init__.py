"""`python -m collectives.explain`: the command line of collectives.teaching.explain."""
