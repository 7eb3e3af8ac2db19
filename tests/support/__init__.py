"""Shared helpers of the test suite: factories, faults, workers, test apps, URLconfs."""
