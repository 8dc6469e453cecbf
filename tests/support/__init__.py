"""Helpers shared by the test modules: harnesses, oracles, fakes and sample logs.

Test modules import from here, never from each other (``tests/unit/test_test_layout.py``
checks it); nothing here is a test, and nothing outside ``tests/`` imports it.
"""
