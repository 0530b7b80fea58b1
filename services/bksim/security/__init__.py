"""Security: certificates and TLS for gRPC links, tokens and authorization (PROTOCOL.md §8)."""
