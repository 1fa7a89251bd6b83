"""`python -m collectives.launch`: run N local workers of one script (see __main__.py)."""
