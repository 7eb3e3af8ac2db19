"""Signals sent at each decision of the protocol, for metrics and audit hooks.

Every signal is sent with ``sender`` = the endpoint (``"POST /v1/workers"``) and the
keyword arguments ``principal``, ``endpoint`` and ``key_hash`` (a short digest of the
key, ``django_idempotency.logs.key_hash``); some add more, listed below. Receivers
must be cheap and must not raise: they run on the request path. Keys are never sent.
The app's own receivers: structured logs (``logs.py``, always connected) and
metrics (``metrics.connect(sink)``, opt-in).

The outbox's signals (``outbox_*``) are sent by the relay with ``sender`` = the
message's topic and the keyword arguments listed with each; ``audited``, at the end, by
the keys-minted audit, with the arguments listed with it.
"""

from __future__ import annotations

from django.dispatch import Signal

from django_idempotency.conf import conf

#: A claim was made (``taken_over``: an earlier attempt's claim was taken over;
#: ``presence``: at once, because that attempt's database session was gone, not
#: because its lease expired; docs/robustness.md#owner-presence; ``cause``: why it was
#: taken over, ``"presence"``, ``"lease"`` (the lease ran out) or ``"operator"`` (an
#: operator ended it), ``""`` for a claim that took over nothing).
claimed = Signal()
#: A stored response was replayed (``status``: the replayed status; ``age``: seconds
#: since the record was claimed, ``window``: seconds from its claim to the end of its
#: retention window, ``None`` where unknown; ``near_window_end``: ``age`` is past
#: ``RETENTION_WARNING_FRACTION`` of ``window``, see :func:`replay_near_window_end`).
replayed = Signal()
#: A duplicate arrived while the original was in flight: 409 (``waiters_full``, when
#: sent: it could have waited, but ``MAX_WAITERS`` requests already did).
in_flight = Signal()
#: A waiting duplicate (``wait=``) was woken by the owner's completion or departure,
#: not by polling (``waited``: seconds it waited).
woken = Signal()
#: The automatic heartbeat extended a lease (``seconds``: the new lease; ``kept``:
#: ``False`` when the claim was found taken over, and the heartbeat stopped).
extended = Signal()
#: The key was reused with a different request: 422.
mismatched = Signal()
#: The completion was fenced off (lease lost); the view's writes were rolled back.
fenced = Signal()
#: The claim was released (``status``: the response's status, or ``None`` if it raised).
released = Signal()
#: A response was stored (``status``).
completed = Signal()
#: An execution ended, however it ended (stored, released, raised, fenced off):
#: ``duration`` (seconds from the view's start under its claim to its end), ``lease``
#: (seconds of the lease the claim was granted), ``renewed`` (the lease was extended
#: while it ran: heartbeat or ``extend_lease``) and ``near_lease`` (see
#: :func:`execution_near_lease`). Sent once per execution of a view or ``once()`` block.
executed = Signal()
#: The store failed while claiming or completing: 503 (``error``: the exception).
store_failed = Signal()

#: An outbox message was delivered and marked sent: ``message_id``, ``attempts`` and
#: ``lag`` (seconds from ``created_at`` to now), for the delivery-lag metric
#: (docs/observability.md).
outbox_delivered = Signal()
#: An outbox delivery failed and will be retried: ``message_id``, ``attempts``,
#: ``error``, ``retry_in`` (seconds).
outbox_failed = Signal()
#: An outbox delivery failed for the last time; the message is ``dead``:
#: ``message_id``, ``attempts``, ``error`` (``None`` when the attempt never reported back).
outbox_dead_lettered = Signal()

#: The audit of keys minted per attempt ran (``management.audit``): ``groups``, a dict
#: of endpoint to the number of groups found (one principal and one fingerprint under
#: several keys within ``window`` seconds), every endpoint with at least one;
#: ``window``: the seconds audited; ``using``: the database alias (``None``: every
#: database of the task's run, counts added up). Sender: ``using``.
audited = Signal()


def execution_near_lease(duration: float, lease: float, renewed: bool) -> bool:
    """Whether an execution ran past ``LEASE_WARNING_FRACTION`` of its lease.

    Args:
        duration: seconds the execution ran.
        lease: seconds of the lease its claim was granted.
        renewed: the lease was extended while it ran (heartbeat or ``extend_lease``);
            such an execution is never near its lease by this rule: its lease moved.

    Returns:
        ``True`` when ``duration >= LEASE_WARNING_FRACTION * lease`` and the lease was
        not renewed.
    """
    return not renewed and lease > 0 and duration >= conf.lease_warning_fraction * lease


def replay_near_window_end(age: float | None, window: float | None) -> bool:
    """Whether a replayed record is past ``RETENTION_WARNING_FRACTION`` of its window.

    Args:
        age: seconds since the record was claimed (``None``: unknown).
        window: seconds from its claim to the end of its retention window.

    Returns:
        ``True`` when both are known and ``age >= RETENTION_WARNING_FRACTION * window``.
    """
    if age is None or not window:
        return False
    return age >= conf.retention_warning_fraction * window
