"""Fault injection: real machine-code faults in chosen candidates, to prove the tuner survives them."""
