"""The reliability harness: histories and their checks, nemeses, crash points, partitions."""
