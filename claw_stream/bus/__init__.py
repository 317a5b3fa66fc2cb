"""Kafka side: topic specs, topic apply/drift, JSON Schemas, producer and consumer factories."""
