"""Celery's events, published on a Redis broker without a client made per event.

A worker sends three task events per message (received, started, succeeded), and Celery
publishes each flush of them through kombu's producer: its checks and declarations, the
message built and routed, and — on a Redis broker — a new Redis client for every publish. In
a worker busy with short tasks that was a quarter of its CPU, as much as the tasks' own work.

:class:`EventDispatcher` publishes the same message with what kombu's Redis channel would use:
its serializer, the transport's envelope (``publish.envelope``, kept equal to kombu's by
``tests/integration/test_events.py``), its topics, and a client it made, kept for the
channel's life instead of made per publish. Anything else — another transport, an exchange
that is not a fanout, another body encoding — goes through kombu as before, and so does any
event whose direct publish fails: Celery's own path then retries or buffers it, as it would
have.

The app uses it through :class:`Events` (``make_app``), so the coordinator's ``task-sent``
events sent through Celery (``publish.send``) take the same path.
"""

from __future__ import annotations

from typing import Any

from celery.app import events as app_events
from celery.events import dispatcher
from kombu.transport import redis as kombu_redis

from bulksync.workers.celery.publish import dumps, envelope, maybe_delivery_mode


class Events(app_events.Events):  # type: ignore[misc]
    """``app.events``, its dispatcher :class:`EventDispatcher`."""

    dispatcher_cls = f"{__name__}:EventDispatcher"


class EventDispatcher(dispatcher.EventDispatcher):  # type: ignore[misc]
    """Celery's event dispatcher, publishing straight to a Redis channel's topics."""

    _direct: tuple[Any, Any] | None = None
    """The channel last published on and its client (None: that channel goes through kombu)."""

    def _publish(self, event: Any, producer: Any, routing_key: str, **kwargs: Any) -> None:
        client = None if producer is None else self._client(producer.channel)
        if client is not None:
            try:
                self._publish_direct(client, producer.channel, event, routing_key)
                return
            except Exception:  # Celery's path retries or buffers it, as it would have
                self._direct = None
        super()._publish(event, producer, routing_key, **kwargs)

    def _client(self, channel: Any) -> Any:
        """The client publishing on ``channel`` directly, made once per connection pool of
        the channel (kombu makes a new one after a fork); None for kombu's way."""
        if (
            self._direct is None
            or self._direct[0] is not channel
            or (self._direct[1] is not None and self._direct[1].connection_pool is not channel.pool)
        ):
            usable = (
                isinstance(channel, kombu_redis.Channel)
                and channel.body_encoding == "base64"
                and channel.default_priority == 0
                and self.exchange.type == "fanout"
            )
            self._direct = (channel, channel._create_client() if usable else None)
        return self._direct[1]

    def _publish_direct(self, client: Any, channel: Any, event: Any, routing_key: str) -> None:
        content_type, encoding, data = dumps(event, serializer=self.serializer)
        exchange = self.exchange.name
        message = envelope(
            data,
            content_type,
            encoding,
            dict(self.headers),
            {"delivery_mode": maybe_delivery_mode(self.delivery_mode)},
            {"exchange": exchange, "routing_key": routing_key},
        )
        if hasattr(channel, "_get_publish_topics"):  # kombu 5.7: more topics than one
            topics = channel._get_publish_topics(exchange, routing_key)
        else:
            topics = [channel._get_publish_topic(exchange, routing_key)]
        for topic in topics:
            client.publish(topic, message)
