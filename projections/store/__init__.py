"""The view store: the port the projection folds into and the API reads from, its
rocksdict adapter and its fake.

``port`` (the Protocol, the batch and page values, retention), ``rocks`` (the
rocksdict adapter every projection process uses) and ``memory`` (the in-memory
fake); the names below are the public ones. The fake is among them: most API
tests and the embedded runs build one.
"""

from framespool.projections.store.memory import InMemoryViewStore
from framespool.projections.store.port import Batch, Page, Retention, ViewStore
from framespool.projections.store.rocks import VIEW_CACHE, RocksViewStore

__all__ = [
    "VIEW_CACHE",
    "Batch",
    "InMemoryViewStore",
    "Page",
    "Retention",
    "RocksViewStore",
    "ViewStore",
]
