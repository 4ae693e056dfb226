"""Benchmarks run by `featurectl bench NAME`; shared reporting lives in `bench._report`."""
