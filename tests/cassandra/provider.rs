//! Cassandra-specific behaviour of the provider.
