"""Helpers shared by several test suites (on ``sys.path`` through pytest's ``pythonpath``)."""
