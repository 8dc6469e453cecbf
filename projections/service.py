"""The projection process's parts, wired once: store, SSE hub, consumer, webhook dispatcher.

The composition root (``framespool``) does::

    service = ProjectionService.open(data_dir, bootstrap, producer, webhooks=WebhookConfig(...))
    app = make_app(ApiConfig(auth=keys, store=service.store, hub=service.hub, producer=producer,
                             artifacts=artifacts, background=service.background))
    ...
    service.close()
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framespool.log import Sender
from framespool.projections.consumer import ProjectionConsumer
from framespool.projections.hub import Hub
from framespool.projections.serialized_store import SerializedStore
from framespool.projections.storage import StorageLedger
from framespool.projections.store.port import ViewStore
from framespool.projections.store.rocks import RocksViewStore
from framespool.projections.webhooks import WebhookConfig, WebhookDispatcher
from framespool.schemas.topics import DEAD_LETTER, JOB_EVENTS, PROGRESS, PROJECTION_STORE


@dataclass
class ProjectionService:
    store: ViewStore
    hub: Hub
    consumer: ProjectionConsumer
    dispatcher: WebhookDispatcher | None
    storage: StorageLedger | None = None

    @classmethod
    def open(
        cls,
        data_dir: str | Path,
        bootstrap_servers: str,
        producer: Sender,
        *,
        webhooks: WebhookConfig | None = None,
        store: ViewStore | None = None,
        job_events: str = JOB_EVENTS.name,
        progress: str = PROGRESS.name,
        dead_letter: str = DEAD_LETTER.name,
        storage: StorageLedger | None = None,
    ) -> ProjectionService:
        """``producer`` (a ``LogProducer``, or the memory fake) sends dead letters; ``webhooks=None`` disables them.

        The projection folds on a thread of its own, off the API's event loop, so
        the store every part shares is serialized (``SerializedStore``)."""
        if store is None:
            path = Path(data_dir) / PROJECTION_STORE
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            store = RocksViewStore(str(path))
        if not isinstance(store, SerializedStore):
            store = SerializedStore(store)
        hub = Hub()
        dispatcher = WebhookDispatcher(store, webhooks) if webhooks is not None else None
        consumer = ProjectionConsumer(
            store,
            bootstrap_servers=bootstrap_servers,
            topics=(job_events, progress),
            dead_letter_topic=dead_letter,
            dead_letter_sender=producer,
            hub=hub,
            on_deliveries=dispatcher.notify if dispatcher is not None else None,
            fold_thread=True,
            storage=storage,
        )
        return cls(store, hub, consumer, dispatcher, storage)

    @property
    def background(self) -> tuple[Callable[[], Coroutine[Any, Any, None]], ...]:
        """What ``ApiConfig.background`` should run for the app's lifetime."""
        runs: tuple[Callable[[], Coroutine[Any, Any, None]], ...] = (self.consumer.run,)
        if self.dispatcher is not None:
            runs += (self.dispatcher.run,)
        return runs

    def close(self) -> None:
        self.consumer.close()
        self.store.close()
        if self.storage is not None:
            self.storage.close()
