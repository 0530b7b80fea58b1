"""metadata layer."""
