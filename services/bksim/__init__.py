"""bksim: a faithful, runnable Apache BookKeeper cluster."""
