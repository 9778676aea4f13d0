"""Renderers: a published snapshot turned into /metrics, the /status document and the page.

They read what the loop already gathered and do no I/O of their own.
"""
