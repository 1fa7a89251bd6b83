"""Studies: one question each, each behind `python -m bench STUDY` (bench/__main__.py)."""
