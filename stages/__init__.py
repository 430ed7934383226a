"""The real work, as plain Python: nothing in here imports Prefect."""
