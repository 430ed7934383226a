"""One module per command (group); tunaflow.cli registers them."""
