"""Metadata store (SQLite/PostgreSQL), blobs, provenance digests, export."""
