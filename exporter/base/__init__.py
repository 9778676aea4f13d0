"""The ground floor every layer stands on: plain reading types, records, redaction, errors.

Nothing here imports another part of the product; sources, the core, the store, discovery
and the web all import from here, never from each other to borrow a type.
"""
