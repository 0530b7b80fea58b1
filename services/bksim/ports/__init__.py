"""Contracts (typing.Protocol) for what the pure layers need from the world. Adapters implement them."""
