"""Fixture rows of the evaluation suites (licences in README.md)."""
