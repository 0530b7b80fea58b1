"""The only place that touches the world: gRPC, kazoo, rocksdict, real files and fsync, the wall clock."""
