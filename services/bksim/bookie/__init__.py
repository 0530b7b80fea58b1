"""bookie layer."""
