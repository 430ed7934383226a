"""The library build: apply the best schedules, generate every other op, plan memory, link one shared library."""
