"""Cost models: features of configs, a learnt ranking of them, and how good that ranking is."""
