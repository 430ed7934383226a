"""Build candidates in parallel, then measure them one at a time in an isolated worker."""
