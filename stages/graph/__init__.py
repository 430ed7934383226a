"""The model graph tunaflow works on: typed nodes with static shapes, and the passes over it."""
