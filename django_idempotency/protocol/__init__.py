"""The request path, top-down: from a view's call to the response it answers.

Read the modules in this order; each uses only the ones after it (and ``store``,
``transactions`` and the top-level modules below them):

1. ``decorators`` (``@idempotent``) and ``drf`` (``IdempotentMixin``, replay-aware
   content negotiation): where a view enters, after DRF's authentication, permissions
   and throttling;
2. ``handle``: one view call through the protocol, and the ``ATOMIC_REQUESTS`` blocks
   the app opens instead of Django;
3. ``begin``: the key, the principal, the scope and the fingerprint; bad input
   answered before anything is claimed;
4. ``decide``: the claim, and what to answer when the key is taken (replay, 422, 409,
   503);
5. ``execute``: the view once, in ``transaction.atomic()``, then the fenced
   completion, the release or the 409 of a lost lease;
6. ``decisions``: what ``begin`` returns (bypass, respond, proceed, nested, cannot run);
7. ``context`` (``request.idempotency``) and ``phases`` (atomic phases, recovery
   points, derived keys); ``release``: the release of a claim, shared by ``execute``,
   ``phases`` and the inbox;
8. ``options``: what a view chose, merged with the settings;
9. ``responses`` (what is stored and replayed) and ``problems`` (problem+json);
10. ``fingerprint`` (with ``exact_json``) and ``keys`` (the ``Idempotency-Key`` header
    and key extractors' keys).
"""
