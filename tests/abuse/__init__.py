"""The gRPC abuse suite (see conftest.py and harness.py); a package so that its `target` fixture ends with it."""
