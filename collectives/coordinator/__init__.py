"""`python -m collectives.coordinator`: a standalone coordinator (see __main__.py)."""
