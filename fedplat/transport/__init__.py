"""Transports between clients and the coordinator: in-memory and gRPC."""
