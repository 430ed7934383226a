"""In-model refinement: the log's top records of each op timed inside the built model, the verdict logged."""
