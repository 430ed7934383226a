"""Prefect flows: thin wiring of the plain stages, so runs show up in the Prefect UI."""
