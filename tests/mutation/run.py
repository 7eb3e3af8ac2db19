"""Targeted mutation testing: does the suite notice when a condition of the protocol goes?

Each mutant below removes or weakens one condition (a fence, a lease check, a state
filter) in a copy of the package, then runs the tests that should notice, on the
backends where that code path runs. A mutant is

* ``killed`` when its tests fail on every backend it runs on (good: a test guards the
  condition there);
* ``survived`` when they pass on some backend (a hole in the suite, or an equivalent
  mutant: those are marked ``equivalent=`` with the reason and reported apart);
* ``stale`` when its original snippet is no longer in the file (the code moved on:
  update the mutant; this is never counted as a pass).

Usage (``make mutation`` runs the first form)::

    python tests/mutation/run.py                 # every mutant, PostgreSQL and SQLite
    python tests/mutation/run.py --list          # ids, files and backends
    python tests/mutation/run.py S1 R2           # some mutants only
    python tests/mutation/run.py --backend sqlite

PostgreSQL: ``MUTATION_DATABASE_URL`` or ``DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/postgres``). The work happens in a temporary copy
of the checkout (its own test databases), so the checkout is never left mutated.
Exit status: 0 when every mutant was killed (or is a known equivalent), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get(
    "MUTATION_DATABASE_URL",
    os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
)
if not PG_URL.startswith("postgres"):
    PG_URL = "postgres://postgres@127.0.0.1:5432/postgres"

PG, SQLITE = "pg", "sqlite"
BOTH = (PG, SQLITE)

GUARDS = "tests/protocol/test_guards.py"
OUTBOX_STORE = "tests/store/test_outbox_store.py"
_STOPS = "tests/outbox/test_relay_stops.py"
_OUTAGES = "tests/outbox/test_relay_outages.py"
_TENANTS = "tests/integration/test_tenants.py::test_tenant_scenario"


#: The server-side functions' code, and the migration that installs a frozen text of them.
_FUNCTIONS = "store/schema/functions.py"
_FROZEN_FUNCTIONS = "migrations/0001_initial.py"
#: What the code's interpolations in mutated snippets read as in the frozen text.
_RENDERED = {
    "{TABLE}": "django_idempotency_record",
    '{_SCOPE_LOCK.format(p="p_")}': "pg_advisory_xact_lock(hashtextextended(p_principal || "
    "chr(31) || p_endpoint || chr(31) || p_key, 7310034283826791680))",
}


def _rendered(snippet: str) -> str:
    for code, text in _RENDERED.items():
        snippet = snippet.replace(code, text)
    return snippet


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to django_idempotency/
    edits: tuple[tuple[str, str], ...]  # (exact original snippet, replacement)
    tests: tuple[str, ...]
    backends: tuple[str, ...] = BOTH
    what: str = ""
    equivalent: str = ""  # why surviving is expected (and harmless)
    # Edits of other files, applied together (file relative to django_idempotency/,
    # original, replacement): a mutant that drops two guards of one rule.
    also: tuple[tuple[str, str, str], ...] = ()

    def all_edits(self) -> dict[str, list[tuple[str, str]]]:
        """Every edit of this mutant, by file.

        An edit of a server-side function's code is made to the initial migration's
        frozen text of it too: the test database is migrated with that text, so a
        mutant of the code alone would leave the function the tests run unchanged.
        """
        edits: dict[str, list[tuple[str, str]]] = {self.file: list(self.edits)}
        for name, original, replacement in self.also:
            edits.setdefault(name, []).append((original, replacement))
        frozen = [
            (_rendered(original), _rendered(replacement))
            for original, replacement in edits.get(_FUNCTIONS, ())
        ]
        if frozen:
            edits.setdefault(_FROZEN_FUNCTIONS, []).extend(frozen)
        return edits


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed / survived / stale / error
    runs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def m(
    id: str,
    file: str,
    original: str | tuple[tuple[str, str], ...],
    replacement: str = "",
    *,
    tests: tuple[str, ...],
    backends: tuple[str, ...] = BOTH,
    what: str,
    equivalent: str = "",
    also: tuple[tuple[str, str, str], ...] = (),
) -> Mutant:
    edits = original if isinstance(original, tuple) else ((original, replacement),)
    return Mutant(id, file, edits, tests, backends, what, equivalent, also)


# --- the mutants ------------------------------------------------------------------

# PortableRecords.take_over's row lookup (store/records/portable.py)
_TAKE_OVER_FILTER = """                pk=record.record_id,
                state=RecordState.CLAIMED,
                owner_token=record.owner_token,  # type: ignore[misc]  # set on every row read
                recovery_point=record.recovery_point,
                lease_until__lte=now_value(self.using),
"""

EDGES = "tests/store/test_edges.py"
NESTED = "tests/protocol/test_nested_views.py"
RECEIVERS = "tests/inbox/test_receivers.py"
DATABASES = "tests/store/test_routing.py"
FINGERPRINT = "tests/protocol/test_fingerprint.py"
REPLAY_HEADERS = "tests/protocol/test_replay_headers.py"
RETENTION = "tests/retention/test_sweeper.py"
VIEW_TX = "tests/transactions/test_view_transactions.py"

# PG_TAKEOVER_SQL's row lookup (store/sql.py): the lease over, or the owner found gone
_PG_TAKEOVER_WHERE = (
    "    WHERE id = %(id)s AND state = 'claimed' AND owner_token = %(token)s\n"
    "      AND recovery_point = %(recovery_point)s\n"
    "      AND (lease_until <= {_NOW} OR %(by_presence)s)\n"
    "    FOR UPDATE SKIP LOCKED\n"
)

# The window invariant: every write keeps `expires_at >= lease_until` (heartbeat,
# takeover, claim, restamp). The readers (the claim's forget, the claim function, the
# sweeper) also check the lease: two guards of one rule. Dropping one alone changes
# nothing observable; the `x` mutants drop both and must be killed.
_HEARTBEAT_WINDOW_PG = (
    "store/sql.py",
    "UPDATE {TABLE} SET lease_until = {_NOW} + %(seconds)s * interval '1 second',\n"
    "    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')\n",
    "UPDATE {TABLE} SET lease_until = {_NOW} + %(seconds)s * interval '1 second'\n",
)
_HEARTBEAT_WINDOW_ORM = (
    "store/records/portable.py",
    'fenced(claim).update(lease_until=until, expires_at=Greatest(F("expires_at"), until))',
    "fenced(claim).update(lease_until=until)",
)
_SWEEP_LEASE = (
    "retention/sweeper.py",
    "        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now), expires_at__lte=now\n",
    "        expires_at__lte=now\n",
)
_INVARIANT = (
    "a second guard: every write keeps the window ending no earlier than the lease "
    "(claim, takeover, heartbeat and restamp push `expires_at`), so a record past its "
    "window never holds a live lease and the {what} never sees one. Dropped together with "
    "that invariant ({pair}), it is killed."
)

MUTANTS: list[Mutant] = [
    # store.py: takeover, reuse, fencing
    m(
        "S1",
        "store/records/portable.py",
        _TAKE_OVER_FILTER,
        _TAKE_OVER_FILTER.replace("                lease_until__lte=now_value(self.using),\n", ""),
        tests=(f"{GUARDS}::test_a_heartbeat_between_the_read_and_the_takeover_keeps_the_owner",),
        backends=(SQLITE,),
        what="takeover without `lease_until <= now`: a live owner taken over (ORM, SQLite)",
    ),
    m(
        "S1p",
        "store/sql.py",
        _PG_TAKEOVER_WHERE,
        _PG_TAKEOVER_WHERE.replace("      AND (lease_until <= {_NOW} OR %(by_presence)s)\n", ""),
        tests=(f"{GUARDS}::test_a_heartbeat_between_the_read_and_the_takeover_keeps_the_owner",),
        backends=(PG,),
        what="takeover without `lease_until <= now` (PG_TAKEOVER_SQL)",
    ),
    m(
        "S2",
        "store/records/portable.py",
        _TAKE_OVER_FILTER,
        _TAKE_OVER_FILTER.replace(
            "                owner_token=record.owner_token,  # type: ignore[misc]  "
            "# set on every row read\n",
            "",
        ),
        tests=(GUARDS, "tests/store/test_concurrency.py", "tests/store/test_state_machine.py"),
        backends=(SQLITE,),
        what="takeover without `owner_token = <the one read>` (ORM, SQLite)",
        equivalent=(
            "the lease condition already refuses a second contender: the first takeover "
            "sets a live lease (the ORM has no owner presence: only the lease ends a "
            "claim there). Only once that new lease has run out too does the "
            "stale UPDATE match, and then the contender wins a claim whose lease ran "
            "out, which it would win on its next round anyway (same record, same "
            "recovery point, which is still checked)."
        ),
    ),
    m(
        "S2p",
        "store/sql.py",
        _PG_TAKEOVER_WHERE,
        _PG_TAKEOVER_WHERE.replace(" AND owner_token = %(token)s", ""),
        tests=(
            "tests/store/test_presence.py::"
            "test_a_duplicate_that_found_the_owner_gone_before_another_took_over_does_not_win",
            GUARDS,
            "tests/store/test_concurrency.py",
            "tests/store/test_state_machine.py",
        ),
        backends=(PG,),
        what="takeover without `owner_token = <the one read>` (PG_TAKEOVER_SQL): two "
        "duplicates that found the owner gone both take the claim over",
    ),
    m(
        "S3",
        "store/records/portable.py",
        f"            .filter(\n{_TAKE_OVER_FILTER}            )\n",
        "            .filter(pk=record.record_id)\n",
        tests=(
            f"{GUARDS}::test_a_contender_that_read_before_another_took_over_does_not_win",
            "tests/store/test_concurrency.py::test_concurrent_takeover_of_an_expired_lease_has_one_winner",
        ),
        backends=(SQLITE,),
        what="unconditional takeover: two executions (ORM, SQLite)",
    ),
    m(
        "S3p",
        "store/sql.py",
        _PG_TAKEOVER_WHERE,
        "    WHERE id = %(id)s\n    FOR UPDATE SKIP LOCKED\n",
        tests=(
            f"{GUARDS}::test_a_contender_that_read_before_another_took_over_does_not_win",
            "tests/store/test_concurrency.py::test_concurrent_takeover_of_an_expired_lease_has_one_winner",
        ),
        backends=(PG,),
        what="unconditional takeover (PG_TAKEOVER_SQL): two executions",
    ),
    m(
        "S4",
        "store/records/portable.py",
        _TAKE_OVER_FILTER,
        _TAKE_OVER_FILTER.replace("                recovery_point=record.recovery_point,\n", ""),
        tests=(
            f"{GUARDS}::test_a_phase_committed_after_the_read_is_resumed_after_by_the_takeover",
        ),
        backends=(SQLITE,),
        what="takeover without the recovery point read: a committed phase run again (ORM)",
    ),
    m(
        "S4p",
        "store/sql.py",
        _PG_TAKEOVER_WHERE,
        _PG_TAKEOVER_WHERE.replace("      AND recovery_point = %(recovery_point)s\n", ""),
        tests=(
            f"{GUARDS}::test_a_phase_committed_after_the_read_is_resumed_after_by_the_takeover",
        ),
        backends=(PG,),
        what="takeover without the recovery point read (PG_TAKEOVER_SQL)",
    ),
    m(
        "S5",
        "store/claims.py",
        "    if record.expired and not live:\n",
        "    if record.expired:\n",
        tests=(
            f"{GUARDS}::test_a_record_past_its_window_is_not_replaced_while_its_lease_is_live",
            "tests/store/test_judge.py",
        ),
        what="a record past its window judged reusable while its lease is live",
    ),
    m(
        "S5x",
        "store/claims.py",
        "    if record.expired and not live:\n",
        "    if record.expired:\n",
        also=(_HEARTBEAT_WINDOW_PG, _HEARTBEAT_WINDOW_ORM),
        tests=(f"{GUARDS}::test_a_record_past_its_window_is_not_replaced_while_its_lease_is_live",),
        what="S5 and a heartbeat that does not push the window: a live owner's record forgotten",
    ),
    m(
        "S6",
        "store/records/portable.py",
        "            Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now),\n",
        "",
        tests=(
            f"{GUARDS}::test_a_heartbeat_after_the_read_keeps_an_expired_record_from_being_forgotten",
        ),
        backends=(SQLITE,),
        what="forgetting an expired record ignores a live lease (ORM, SQLite)",
        equivalent=_INVARIANT.format(what="forgetting DELETE", pair="S6x"),
    ),
    m(
        "S6p",
        "store/sql.py",
        "      AND (state = 'completed' OR lease_until <= {_NOW})\n",
        "",
        tests=(
            f"{GUARDS}::test_a_heartbeat_after_the_read_keeps_an_expired_record_from_being_forgotten",
        ),
        backends=(PG,),
        what="forgetting an expired record ignores a live lease (PG_FORGET_SQL, plain table)",
        equivalent=_INVARIANT.format(what="forgetting DELETE", pair="S6px"),
    ),
    m(
        "S6x",
        "store/records/portable.py",
        "            Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now),\n",
        "",
        also=(_HEARTBEAT_WINDOW_ORM,),
        tests=(
            f"{GUARDS}::test_a_heartbeat_after_the_read_keeps_an_expired_record_from_being_forgotten",
        ),
        backends=(SQLITE,),
        what="S6 and a heartbeat that does not push the window (ORM, SQLite)",
    ),
    m(
        "S6px",
        "store/sql.py",
        "      AND (state = 'completed' OR lease_until <= {_NOW})\n",
        "",
        also=(_HEARTBEAT_WINDOW_PG,),
        tests=(
            f"{GUARDS}::test_a_heartbeat_after_the_read_keeps_an_expired_record_from_being_forgotten",
        ),
        backends=(PG,),
        what="S6p and a heartbeat that does not push the window (plain table)",
    ),
    m(
        "S7",
        "store/records/base.py",
        "        pk=claim.record_id, owner_token=claim.owner_token, state=RecordState.CLAIMED\n",
        "        pk=claim.record_id, state=RecordState.CLAIMED\n",
        tests=("tests/store/test_state_machine.py",),
        backends=(SQLITE,),
        what="fence without the owner token (SQLite completion, release, advance, suspend)",
    ),
    m(
        "S8",
        "store/records/base.py",
        '        return bool(fenced(claim).filter(recovery_point="")._raw_delete(self.using))\n',
        "        return bool(fenced(claim)._raw_delete(self.using))\n",
        tests=("tests/protocol/test_phase_records.py", "tests/protocol/test_phases.py"),
        what="release deletes a record whose phase committed",
    ),
    m(
        "S8p",
        "store/sql.py",
        "    WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'\n"
        "      AND recovery_point = ''\n",
        "    WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'\n",
        tests=("tests/protocol/test_phase_records.py", "tests/protocol/test_phases.py"),
        backends=(PG,),
        what="release deletes a record whose phase committed (PG_RELEASE_UNLOCK_SQL, with "
        "the presence lock)",
    ),
    m(
        "S9",
        "store/records/postgresql.py",
        "        side = connection.in_atomic_block and claim.committed\n",
        "        side = False\n",
        tests=("tests/store/test_state_machine.py", "tests/store/test_concurrency.py"),
        backends=(PG,),
        what="heartbeat inside the view's transaction, invisible until it commits",
    ),
    m(
        "S11",
        "store/sql.py",
        "    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')\n"
        "WHERE id = %(id)s AND owner_token = %(token)s AND state = 'claimed'\n",
        "    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')\n"
        "WHERE id = %(id)s AND state = 'claimed'\n",
        tests=("tests/store/test_state_machine.py",),
        backends=(PG,),
        what="heartbeat not fenced: a stale owner extends the new owner's lease (PG_EXTEND_SQL)",
    ),
    m(
        "S12",
        "store/records/postgresql.py",
        "        if waited > min(_RESTAMP_AFTER, lease / 10)"
        " and not self._restamp(won, retention):\n",
        "        if False:\n",
        tests=(f"{EDGES}::test_a_claim_that_waited_gets_its_whole_lease[plain]",),
        backends=(PG,),
        what="a plain-table claim that queued behind a rolled-back insert is not stamped again",
    ),
    m(
        "S13",
        "store/sql.py",
        "OR %(by_presence)s)\n    FOR UPDATE SKIP LOCKED\n",
        "OR %(by_presence)s)\n",
        tests=(
            f"{EDGES}::test_a_takeover_skips_a_row_locked_by_a_stalled_owner",
            f"{EDGES}::test_a_takeover_enqueues_without_waiting_for_the_stalled_original",
        ),
        backends=(PG,),
        what="takeover without SKIP LOCKED: a retry queues behind a stalled owner's open "
        "transaction",
    ),
    m(
        "S10f",
        "store/schema/functions.py",
        "    WHERE r.id = p_id AND r.owner_token = p_token AND r.state = 'claimed';\n",
        "    WHERE r.id = p_id AND r.state = 'claimed';\n",
        tests=("tests/store/test_state_machine.py", "tests/store/test_record_store.py"),
        backends=(PG,),
        what="completion not fenced by the owner token (django_idempotency_complete)",
    ),
    m(
        "S10r",
        "store/schema/functions.py",
        "    IF v_updated <> 1 THEN\n",
        "    IF false THEN\n",
        tests=(
            "tests/store/test_claim_commit.py",
            f"{GUARDS}::test_a_fenced_completion_rolls_back_the_views_writes",
        ),
        backends=(PG,),
        what="a completion that matched no row does not raise: the view's writes commit "
        "without their record",
    ),
    m(
        "S14f",
        "store/schema/functions.py",
        "        lease_until = v_now,\n"
        "        expires_at = GREATEST(r.expires_at, v_now + p_grace * interval '1 second')\n",
        "        lease_until = v_now\n",
        tests=(f"{EDGES}::test_a_completion_after_the_window_stays_replayable",),
        backends=(PG,),
        what="a completion late in the window not kept a lease longer "
        "(django_idempotency_complete)",
    ),
    m(
        "X15",
        "retention/partitions.py",
        "        tables.lock_table(cursor, lock_timeout)\n        if holds_live_records(",
        "        if holds_live_records(",
        tests=("tests/retention/test_late_completions.py",),
        backends=(PG,),
        what="a day is probed and dropped without the table's lock: a late completion in "
        "flight is dropped with its day",
    ),
    m(
        "X16",
        "store/schema/tables.py",
        "    if default is not None:\n",
        "    if False:\n",
        tests=(
            "tests/retention/test_partitions.py::"
            "test_a_claim_of_a_day_without_a_partition_lands_in_the_default_partition",
            "tests/retention/test_partitions.py::"
            "test_the_sweeper_moves_the_default_partitions_records_into_the_days_it_creates",
        ),
        backends=(PG,),
        what="a day is created without moving the default partition's records of it: its "
        "attach fails, and the day is never created",
    ),
    m(
        "X17",
        "store/isolation.py",
        "    if connection.alias in strict_databases:  # the server's default, seen by a claim\n"
        "        return True\n",
        "",
        tests=("tests/store/test_heartbeat_isolation.py",),
        backends=(PG,),
        what="heartbeats ignore a server default above READ COMMITTED found by a claim",
    ),
    m(
        "E6",
        "protocol/execute.py",
        "                        doomed = transactions.doomed(claim.using)\n"
        "                        if doomed:\n",
        "                        if doomed:\n",
        tests=(
            f"{VIEW_TX}::test_a_streaming_body_that_dooms_the_transaction_is_the_views_outcome",
        ),
        backends=(PG,),
        what="a streaming body that dooms the transaction answered 503, not the view's response",
    ),
    m(
        "S14s",
        "store/records/portable.py",
        '            expires_at=Greatest(F("expires_at"), now_value(self.using, claim.lease)),\n',
        "",
        tests=(f"{EDGES}::test_a_completion_after_the_window_stays_replayable",),
        backends=(SQLITE,),
        what="a completion late in the window not kept a lease longer (ORM, SQLite)",
    ),
    m(
        "S15",
        "store/sql.py",
        "UPDATE {TABLE} SET lease_until = {_NOW} + %(seconds)s * interval '1 second',\n"
        "    expires_at = GREATEST(expires_at, {_NOW} + %(seconds)s * interval '1 second')\n",
        "UPDATE {TABLE} SET lease_until = {_NOW} + %(seconds)s * interval '1 second'\n",
        tests=(
            f"{EDGES}::test_a_live_lease_holds_its_partition_past_its_day",
            f"{RETENTION}::test_sweep_never_forgets_a_record_whose_lease_is_live",
        ),
        backends=(PG,),
        what="a heartbeat past the window does not push the window (PG_EXTEND_SQL)",
    ),
    m(
        "S15s",
        "store/records/portable.py",
        'fenced(claim).update(lease_until=until, expires_at=Greatest(F("expires_at"), until))',
        "fenced(claim).update(lease_until=until)",
        tests=(
            f"{EDGES}::test_a_live_lease_holds_its_partition_past_its_day",
            f"{RETENTION}::test_sweep_never_forgets_a_record_whose_lease_is_live",
        ),
        backends=(SQLITE,),
        what="a heartbeat past the window does not push the window (ORM, SQLite)",
        equivalent=(
            "on the plain table every reader (the claim, peek, the batched sweep) also "
            "checks the lease, so a window ending before the lease changes nothing; on "
            "the partitioned table (S15, killed) the sweeper probes `expires_at` alone. "
            "Together with the claim's lease check (S5x), it is killed."
        ),
    ),
    m(
        "S16",
        "store/sql.py",
        "    lease_until = {_NOW} + %(lease)s * interval '1 second',\n"
        "    expires_at = GREATEST(r.expires_at, {_NOW} + %(lease)s * interval '1 second'),\n",
        "    lease_until = {_NOW} + %(lease)s * interval '1 second',\n",
        tests=(
            f"{EDGES}::test_a_takeover_near_the_end_of_the_window_survives_the_sweep",
            f"{EDGES}::test_a_completion_after_the_window_stays_replayable",
        ),
        backends=(PG,),
        what="a takeover near the window's end does not push the window (PG_TAKEOVER_SQL)",
    ),
    m(
        "S16s",
        "store/records/portable.py",
        '                expires_at=Greatest(F("expires_at"), new_lease_until),\n',
        "",
        tests=(
            f"{EDGES}::test_a_takeover_near_the_end_of_the_window_survives_the_sweep",
            f"{EDGES}::test_a_completion_after_the_window_stays_replayable",
        ),
        backends=(SQLITE,),
        what="a takeover near the window's end does not push the window (ORM, SQLite)",
        equivalent=(
            "as for S15s: on the plain table the claim and the batched sweep also check "
            "the lease. Together with the sweep's lease check (S16sx), it is killed."
        ),
    ),
    m(
        "S16sx",
        "store/records/portable.py",
        '                expires_at=Greatest(F("expires_at"), new_lease_until),\n',
        "",
        also=(_SWEEP_LEASE,),
        tests=(f"{EDGES}::test_a_takeover_near_the_end_of_the_window_survives_the_sweep",),
        backends=(SQLITE,),
        what="S16s and a batched sweep that ignores the lease: a taken-over record swept",
    ),
    m(
        "S17",
        "store/records/base.py",
        "        if sqlstate == SERIALIZATION_FAILURE:\n            raise LeaseLost(\n",
        "        if False:\n            raise LeaseLost(\n",
        tests=(f"{EDGES}::test_a_takeover_fences_the_original_with_409_at_stricter_levels",),
        backends=(PG,),
        what="a serialization failure (40001) of a fenced write not taken as LeaseLost",
    ),
    m(
        "S18",
        "store/isolation.py",
        "        return False\n"
        "    if connection.alias in strict_databases:  # the server's default, seen by a claim\n",
        "        return False\n"
        "    return False\n"
        "    if connection.alias in strict_databases:  # the server's default, seen by a claim\n",
        tests=(
            f"{EDGES}::test_a_heartbeat_is_refused_clearly_at_stricter_levels",
            f"{EDGES}::test_claims_work_at_stricter_isolation_levels",
        ),
        backends=(PG,),
        what="stricter_than_read_committed() always False",
    ),
    # context.py
    m(
        "C1",
        "protocol/context.py",
        '["outbox", claim.record_id, str(claim.owner_token), self.open_phase, topic, n]',
        '["outbox", claim.record_id, self.open_phase, topic, n]',
        tests=(f"{EDGES}::test_a_takeover_enqueues_without_waiting_for_the_stalled_original",),
        backends=(PG,),
        what="the default outbox dedup key without the owner token: a takeover's insert "
        "waits on the stalled attempt's",
    ),
    # store/schema/functions.py: the claim function (installed by the initial migration)
    m(
        "P4",
        "store/schema/functions.py",
        '    PERFORM {_SCOPE_LOCK.format(p="p_")};\n    v_now := clock_timestamp()',
        "    v_now := clock_timestamp()",
        tests=("tests/retention/test_partitions.py",),
        backends=(PG,),
        what="claim function without the scope lock: two first claims both insert",
    ),
    m(
        "P5",
        "store/schema/functions.py",
        '    PERFORM {_SCOPE_LOCK.format(p="p_")};\n'
        "    v_now := clock_timestamp() + p_clock_offset",
        '    PERFORM {_SCOPE_LOCK.format(p="p_")};\n'
        "    v_now := statement_timestamp() + p_clock_offset",
        tests=(f"{EDGES}::test_a_claim_that_waited_gets_its_whole_lease[partitioned]",),
        backends=(PG,),
        what="claim function: now read when the statement started, not after the lock",
    ),
    # protocol.py
    m(
        "PR1",
        "protocol/decide.py",
        "        if verdict is store.Verdict.MISMATCH:\n",
        "        if False:\n",
        tests=("tests/protocol/test_wire.py", "tests/protocol/test_decorators.py"),
        what="a key reused with another request is not answered 422 (it waits, then 409)",
    ),
    m(
        "PR1b",
        "protocol/decide.py",
        "            return _reused(options, differing_parts(result.fingerprint, fp.value))\n",
        "            return _reused(options, ())\n",
        tests=("tests/protocol/test_key_reused_parts.py",),
        what="a key reused with another request: the 422 names no differing part",
    ),
    m(
        "PR2",
        "protocol/decide.py",
        "            if not stored.replayable:\n",
        "            if False:\n",
        tests=("tests/protocol/test_hostile_input.py", "tests/protocol/test_wire.py"),
        backends=(SQLITE,),
        what="a response too large to keep is replayed as an empty body",
    ),
    m(
        "PR3",
        "protocol/begin.py",
        '    if (http.method or "").upper() in SAFE_METHODS:\n',
        "    if False:\n",
        tests=("tests/protocol/test_wire.py", "tests/protocol/test_decorators.py"),
        backends=(SQLITE,),
        what="safe methods recorded",
    ),
    # execution.py
    m(
        "E1",
        "protocol/execute.py",
        (
            (
                '            store.complete(claim, stored)\n            stage = "commit"\n',
                '            stage = "commit"\n',
            ),
            (
                "    except _Release as release:\n",
                "        store.complete(claim, stored)\n    except _Release as release:\n",
            ),
        ),
        tests=(f"{GUARDS}::test_a_fenced_completion_rolls_back_the_views_writes",),
        what="completion outside the view's atomic block",
    ),
    m(
        "E2",
        "protocol/execute.py",
        '        if stage == "view" or (stage == "commit" and isinstance(exc, IntegrityError)):\n',
        '        if stage == "commit" and isinstance(exc, IntegrityError):\n',
        tests=(f"{GUARDS}::test_the_views_own_database_error_is_its_500_not_a_store_failure",),
        what="the view's own database error counted as a store failure (503)",
    ),
    m(
        "E3",
        "protocol/execute.py",
        "                release = options.should_release(response.status_code)\n",
        "                release = False\n",
        tests=("tests/protocol/test_decorators.py", "tests/protocol/test_wire.py"),
        backends=(SQLITE,),
        what="a 5xx stored and replayed instead of released",
    ),
    m(
        "E4",
        "protocol/execute.py",
        '(stage == "commit" and isinstance(exc, IntegrityError))',
        '(stage == "commit" and not isinstance(exc, IntegrityError))',
        tests=(
            f"{VIEW_TX}::test_deferred_constraint_violated_at_commit_is_the_views_exception",
            "tests/store/test_database_faults.py::test_connection_killed_at_commit",
        ),
        what="the IntegrityError-at-COMMIT rule inverted: the view's data refused is a 503, "
        "a connection lost at COMMIT a 500",
    ),
    m(
        "E5",
        "transactions/state.py",
        "    if transaction.get_rollback(using):\n",
        '    return ""\n    if transaction.get_rollback(using):\n',
        tests=(VIEW_TX,),
        what='transactions.doomed() always "": a doomed view\'s response stored, or a 503',
    ),
    # phases: IdempotencyContext.phase (context.py) and the phased execution (phases.py)
    m(
        "PH1",
        "protocol/context.py",
        "                else:\n"
        "                    store.advance(self._claim, name)\n"
        "        finally:\n"
        '            self.open_phase = ""\n',
        "        finally:\n"
        '            self.open_phase = ""\n'
        "        if not doomed:\n"
        "            store.advance(self._claim, name)\n",
        tests=("tests/protocol/test_phases.py",),
        what="recovery point advanced outside the phase's transaction",
    ),
    m(
        "PH2",
        "protocol/context.py",
        "        if position(phases, name) <= position(phases, self.recovery_point):\n",
        "        if position(phases, name) < position(phases, self.recovery_point):\n",
        tests=("tests/protocol/test_phases.py",),
        backends=(SQLITE,),
        what="the phase of the recovery point may run again",
    ),
    m(
        "PH3",
        "protocol/phases.py",
        "    if not context.recovery_point:\n"
        "        release_claim(context.claim, status)\n        return\n",
        "    release_claim(context.claim, status)\n    return\n",
        tests=("tests/protocol/test_phases.py",),
        what="a failed phased request keeps its lease: the retry waits instead of resuming",
    ),
    # relay.py
    m(
        "R1",
        "store/outbox/postgresql.py",
        "     AS c(id, attempts, until)\n"
        "WHERE m.id = c.id AND m.attempts = c.attempts AND m.available_at >= c.until\n"
        "  AND m.state = 'pending'\n"
        "  AND m.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the table's size\n"
        "RETURNING m.id\n",
        "     AS c(id, attempts, until)\n"
        "WHERE m.id = c.id\n"
        "  AND m.state = 'pending'\n"
        "  AND m.id = ANY(%(ids)s::bigint[])  -- by primary key, whatever the table's size\n"
        "RETURNING m.id\n",
        tests=(
            f"{GUARDS}::test_a_relay_whose_lease_ran_out_cannot_mark_the_message_sent",
            f"{OUTBOX_STORE}::test_a_mark_is_written_while_the_claim_holds_and_refused_after_a_takeover",
        ),
        backends=(PG,),
        what="mark sent without the claim's fence",
    ),
    m(
        "R1s",
        "store/outbox/portable.py",
        '                "attempts": attempts,\n'
        '                "available_at__gte": clock.to_db(end, connection),\n',
        "",
        tests=(
            f"{GUARDS}::test_a_relay_whose_lease_ran_out_cannot_mark_the_message_sent",
            f"{OUTBOX_STORE}::test_a_mark_is_written_while_the_claim_holds_and_refused_after_a_takeover",
        ),
        backends=(SQLITE,),
        what="mark sent (SQLite) without the claim's fence",
    ),
    m(
        "R2",
        "outbox/failures.py",
        "        attempts=message.attempts,\n"
        "        available_at__gte=clock.to_db(message.available_at, connections[using]),\n"
        "    )\n",
        "    )\n",
        tests=(f"{GUARDS}::test_a_relay_whose_lease_ran_out_cannot_reschedule_the_message",),
        what="mark failed (retry or dead) without the claim's fence",
    ),
    m(
        "R3",
        "store/outbox/postgresql.py",
        "    FOR UPDATE SKIP LOCKED\n",
        "",
        tests=("tests/outbox/test_relay_concurrency.py",),
        backends=(PG,),
        what="relay claim without row locks: concurrent relays claim the same message",
    ),
    m(
        "R4",
        "store/outbox/portable.py",
        "                pk=pk, state=OutboxState.PENDING, attempts=attempts, "
        "available_at__lte=due\n",
        "                pk=pk\n",
        tests=("tests/outbox/test_relay_concurrency.py", "tests/outbox/test_relay.py"),
        backends=(SQLITE,),
        what="relay claim (SQLite) unconditional: a message claimed twice",
    ),
    m(
        "R5",
        "store/outbox/portable.py",
        "            available_at__lte=self.now(),\n            attempts__gte=max_attempts,\n",
        "            attempts__gte=max_attempts,\n",
        tests=(
            f"{GUARDS}::test_a_message_on_its_last_attempt_is_not_buried_while_it_is_delivered",
        ),
        backends=(SQLITE,),
        what="a message on its last attempt buried while its relay still delivers it",
    ),
    m(
        "R6",
        "store/outbox/postgresql.py",
        "        state = CASE WHEN m.attempts >= %(max)s THEN 'dead' ELSE m.state END,\n",
        "        state = CASE WHEN m.attempts + 1 >= %(max)s THEN 'dead' ELSE m.state END,\n",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_a_message_that_kills_its_relay_is_dead_lettered_after_max_attempts",
        ),
        backends=(PG,),
        what="the claim buries a message before its last allowed attempt",
    ),
    m(
        "R7",
        "outbox/relay.py",
        "            self._keeper = Keeper(self._holding, self.schema)\n",
        "            pass\n",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_a_handler_slower_than_the_lease_runs_once_and_its_batch_is_delivered_meanwhile",
        ),
        backends=(PG,),
        what="no lease keeper while a handler blocks: its lease is not renewed",
    ),
    # retention.py
    m(
        "T1",
        "retention/sweeper.py",
        "        if partition.day >= report.cutoff.date():\n",
        "        if partition.day > report.cutoff.date():\n",
        tests=("tests/retention/test_sweeper.py",),
        backends=(PG,),
        what="the sweeper drops the partition of the cutoff day itself",
    ),
    m(
        "T2",
        "retention/sweeper.py",
        "                state=OutboxState.SENT,\n                sent_at__lt=",
        "                sent_at__lt=",
        tests=("tests/retention/test_sweeper.py",),
        what="the sweeper deletes outbox messages in any state",
        equivalent=(
            "only the relay's mark-sent writes sent_at, together with state = 'sent', and "
            "nothing moves a message out of 'sent': a pending or dead message has no "
            "sent_at, so `sent_at < cutoff` selects sent messages only. The state filter "
            "keeps the query on its partial index."
        ),
    ),
    m(
        "T3",
        "retention/sweeper.py",
        "        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now), expires_at__lte=now\n",
        "        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now),\n"
        "        expires_at__lte=now + dt.timedelta(days=1),\n",
        tests=(RETENTION,),
        backends=(SQLITE,),
        what="the batched sweep deletes records up to a day before their window ends",
    ),
    m(
        "T4",
        "retention/sweeper.py",
        "                    now - dt.timedelta(seconds=conf.outbox_retention), connection\n",
        "                    now, connection\n",
        tests=(RETENTION,),
        backends=(SQLITE,),
        what="sent outbox messages swept at once, not after OUTBOX_RETENTION",
    ),
    m(
        "T5",
        "retention/sweeper.py",
        "    for offset in range(days_ahead() + 1):\n",
        "    for offset in range(days_ahead()):\n",
        tests=(
            f"{GUARDS}::test_the_sweeper_creates_the_partitions_of_today_and_the_days_ahead",
            f"{EDGES}::test_the_sweeper_creates_every_partition_a_claim_needs[partitioned]",
        ),
        backends=(PG,),
        what="the sweeper creates one partition fewer ahead",
    ),
    m(
        "T6",
        "retention/sweeper.py",
        "        Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now), expires_at__lte=now\n",
        "        expires_at__lte=now\n",
        tests=(
            f"{RETENTION}::test_sweep_never_forgets_a_record_whose_lease_is_live",
            f"{EDGES}::test_a_live_lease_holds_its_partition_past_its_day",
            f"{EDGES}::test_a_takeover_near_the_end_of_the_window_survives_the_sweep",
        ),
        backends=(SQLITE,),
        what="the batched sweep forgets a record past its window while its lease is live",
        equivalent=_INVARIANT.format(what="batched sweep", pair="S16sx"),
    ),
    m(
        "T7",
        "store/schema/tables.py",
        "    window = max(conf.max_retention, conf.retention, conf.lease, 0.0)\n",
        "    window = 0.0\n",
        tests=(f"{EDGES}::test_the_sweeper_creates_every_partition_a_claim_needs[partitioned]",),
        backends=(PG,),
        what="days_ahead() ignores MAX_RETENTION: claims of the later days land in the "
        "default partition",
    ),
    m(
        "T8",
        "retention/partitions.py",
        "        if holds_live_records(connection, partition, clock.store_now(connection)):\n",
        "        if False:\n",
        tests=(
            f"{EDGES}::test_a_live_lease_holds_its_partition_past_its_day[partitioned]",
            f"{EDGES}::test_a_takeover_near_the_end_of_the_window_survives_the_sweep[partitioned]",
            f"{EDGES}::test_a_view_window_longer_than_max_retention_is_honoured[partitioned]",
            RETENTION,
        ),
        backends=(PG,),
        what="a drop removes a past day's partition that holds a live record (held skipped)",
    ),
    # partitions.py
    m(
        "PT1",
        "store/schema/tables.py",
        '            "ORDER BY created_at DESC ON CONFLICT DO NOTHING"\n',
        '            "ORDER BY created_at ASC ON CONFLICT DO NOTHING"\n',
        tests=(
            "tests/store/test_schema.py::"
            "test_back_to_the_plain_table_keeps_the_newer_of_two_rows_of_one_scope",
        ),
        backends=(PG,),
        what="back to the plain table: the older of two rows of one scope kept",
    ),
    m(
        "PT2",
        "retention/partitions.py",
        "    condition = \"expires_at <= %s AND (state = 'completed' OR lease_until <= %s)\"\n",
        "    condition = \"%s IS NOT NULL AND (state = 'completed' OR lease_until <= %s)\"\n",
        tests=(
            "tests/retention/test_partitions.py::"
            "test_the_sweeper_deletes_the_default_partitions_records_past_their_window",
        ),
        backends=(PG,),
        what="the default partition's completed records deleted inside their window",
    ),
    m(
        "K1",
        "protocol/drf.py",
        "        super().__init_subclass__(**kwargs)\n        _refuse_misplaced_mixin(cls)\n",
        "        super().__init_subclass__(**kwargs)\n",
        tests=(
            "tests/protocol/test_decorators.py::"
            "test_the_mixin_after_the_view_class_is_refused_when_the_class_is_defined",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="IdempotentMixin after the view class in the bases is accepted (protection off)",
    ),
    m(
        "K2",
        "protocol/drf.py",
        '    return code is None or "super" in code.co_names\n',
        "    return True\n",
        tests=(
            "tests/protocol/test_decorators.py::"
            "test_each_method_the_mixin_overrides_is_checked_when_the_class_is_defined",
            "tests/checks/test_checks.py::test_e010_protection_that_cannot_work_as_stacked",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="a method that does not call super() is taken to pass the call on",
    ),
    m(
        "K3",
        "protocol/drf.py",
        "    if issubclass(cls, View) and not issubclass(cls, APIView):\n",
        "    if False:\n",
        tests=(
            "tests/protocol/test_decorators.py::test_the_mixin_on_a_django_class_based_view_is_refused",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="IdempotentMixin on a Django class-based view is accepted (never runs)",
    ),
    m(
        "K4",
        "protocol/decorators.py",
        '    if hasattr(func, "_idempotency_options"):\n        raise TypeError(\n',
        "    if False:\n        raise TypeError(\n",
        tests=("tests/protocol/test_decorators.py::test_idempotent_over_idempotent_is_refused",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="@idempotent over a view already @idempotent (every key claimed twice)",
    ),
    m(
        "K5",
        "protocol/decorators.py",
        "        if handler is not None and closure_options(handler) is not None:\n",
        "        if False:\n",
        tests=("tests/protocol/test_decorators.py::test_idempotent_over_idempotent_is_refused",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="@idempotent above @api_view over @idempotent accepted",
    ),
    m(
        "K6",
        "protocol/decorators.py",
        "    if isinstance(func, (staticmethod, classmethod)):\n",
        "    if False:\n",
        tests=(
            "tests/protocol/test_decorators.py::"
            "test_idempotent_above_staticmethod_or_classmethod_is_refused",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="@idempotent above @staticmethod accepted (wrong arguments at every request)",
    ),
    m(
        "K7",
        "protocol/decorators.py",
        "    if isinstance(func, type):\n",
        "    if False:\n",
        tests=("tests/protocol/test_decorators.py::test_idempotent_on_a_class_is_refused",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="@idempotent on a class statement accepted",
    ),
    m(
        "K8",
        "checks/stacking.py",
        '        if not hasattr(getattr(view_class, name, None), "_idempotency_options"):\n'
        "            continue\n        drf =",
        "        continue\n        drf =",
        tests=("tests/checks/test_checks.py::test_e010_protection_that_cannot_work_as_stacked",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="E010 silent on @idempotent on a DRF view's dispatch (claim before auth)",
    ),
    m(
        "K9",
        "checks/stacking.py",
        "        if _idempotent_layers(getattr(view_class, name, None)) > 1:\n",
        "        if _idempotent_layers(getattr(view_class, name, None)) > 2:\n",
        tests=("tests/checks/test_checks.py::test_e010_protection_that_cannot_work_as_stacked",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="E010 silent on two @idempotent on one handler through method_decorator",
    ),
    m(
        "K10",
        "checks/stacking.py",
        "    for name, klass in shadowing(view_class):\n",
        "    for name, klass in []:\n",
        tests=("tests/checks/test_checks.py::test_e010_protection_that_cannot_work_as_stacked",),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="E010 silent on a subclass's initial() without super()",
    ),
    m(
        "K11",
        "checks/urls.py",
        '    if urlconf is None and not getattr(settings, "ROOT_URLCONF", None):\n'
        "        return [], None\n",
        "",
        tests=(
            "tests/checks/test_checks.py::test_check_runs_without_a_root_urlconf",
            "tests/checks/test_checks.py::"
            "test_manage_py_check_passes_with_a_settings_module_without_root_urlconf",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="the view checks read a missing ROOT_URLCONF (manage.py check crashes)",
    ),
    m(
        "K12",
        "checks/urls.py",
        "    except Exception as exc:  # a system check reports, it never crashes the command\n",
        "    except ImportError as exc:\n",
        tests=(
            "tests/checks/test_checks.py::test_w009_names_the_error_a_urlconf_raises_while_importing",
        ),
        backends=(SQLITE,),  # decided when the class or the URLconf is built
        what="a URLconf raising (not ImportError) while importing crashes the checks",
    ),
    # retention.py: what the sweeper reports and keeps
    m(
        "K13",
        "retention/sweeper.py",
        "        else:\n            report.held.append(partition.name)\n",
        "        else:\n            report.dropped.append(partition)\n",
        tests=(
            "tests/retention/test_sweep_command.py::"
            "test_a_past_day_kept_for_a_late_completion_is_reported_as_held",
        ),
        backends=(PG,),
        what="a day kept for a live record is reported as dropped",
    ),
    m(
        "K14",
        "retention/sweeper.py",
        "        deleted = int(ordered.filter(pk__in=chunk)._raw_delete(using))\n",
        "        deleted = int(\n"
        "            queryset.model._default_manager.using(using)\n"
        "            .filter(pk__in=chunk)._raw_delete(using)\n"
        "        )\n",
        tests=(
            "tests/retention/test_batched_delete.py::"
            "test_a_late_completion_committed_while_the_delete_waits_for_it_is_kept",
        ),
        backends=(PG,),
        what="the batched DELETE trusts the batch's ids: a record made live meanwhile deleted",
    ),
    # example_project/storm: the storm's verdict
    m(
        "K15",
        "../example_project/storm/verdict.py",
        "    return Verdict(held=not broken, broken=broken, notes=notes)\n",
        "    return Verdict(held=not broken and not result.clients_gave_up, broken=broken, "
        "notes=notes)\n",
        tests=(
            "tests/integration/test_storm.py::"
            "test_clients_that_gave_up_are_reported_not_called_a_broken_promise",
        ),
        backends=(SQLITE,),
        what="the storm calls clients that gave up a broken promise",
    ),
    m(
        "K16",
        "../example_project/storm/verdict.py",
        "            if not ids <= self.stored.get(str(number), set()):\n",
        "            if False:\n",
        tests=(
            "tests/integration/test_storm.py::test_a_duplicate_or_a_wrong_answer_is_a_broken_promise",
        ),
        backends=(SQLITE,),
        what="the storm accepts an answer that is not the stored worker",
    ),
    # --- claims: delegating views, claimed receivers, once() rules, presence locks,
    # takeover causes, and guards no test noticed (heartbeat, blank keys, 422s) -------
    m(
        "CL1",
        "protocol/context.py",
        "        if claim.scope == scope and claim.using == using:\n",
        "        if False:\n",
        tests=(NESTED, "tests/inbox/test_calls.py"),
        what="a view or block called with the running execution's scope claims again (409)",
    ),
    m(
        "CL2",
        "protocol/context.py",
        '            return None if getattr(http, "resolver_match", None) is not None '
        "else context\n",
        "            return context\n",
        tests=(f"{NESTED}::test_a_request_routed_while_the_view_runs_is_a_request_of_its_own",),
        what="a request routed while the view runs (an in-process client's) joins it",
    ),
    m(
        "CL3",
        "protocol/context.py",
        "            if http is None or http is context._request:\n",
        "            if http is None:\n",
        tests=(NESTED,),
        what="a view handed the running view's own request claims again (409)",
    ),
    m(
        "CL4",
        "protocol/release.py",
        "        store.abandon(claim)  # nothing ran: the key is free for a retry at once\n",
        "        pass  # the claim kept\n",
        tests=("tests/test_signals.py",),
        what="a view or once() block whose claimed receiver raised keeps its claim "
        "(409 or InFlight for the lease)",
    ),
    m(
        "CL6",
        "store/settle.py",
        "        if claim.recovery_point:\n            suspend(claim)\n        else:\n"
        "            release(claim)\n",
        "        release(claim)\n",
        tests=(
            "tests/test_signals.py::"
            "test_a_phased_takeover_whose_claimed_receiver_raises_keeps_its_recovery_point",
        ),
        what="a given-up phased takeover keeps its live lease (no resume until it ends)",
    ),
    m(
        "CL7",
        "inbox/calls.py",
        "                if doomed:  # the block's own choice: nothing of it can commit\n"
        "                    raise _Doomed(doomed)\n",
        "",
        tests=("tests/inbox/test_calls.py",),
        what="once(): a block that doomed its transaction is completed anyway",
    ),
    m(
        "CL8",
        "store/presence.py",
        "        release_leftovers(entry, what)\n",
        "        pass\n",
        tests=(
            "tests/store/test_presence.py::test_presence_locks_never_pile_up_on_a_persistent_connection",
            "tests/store/test_presence.py::test_presence_locks_never_pile_up_after_once_blocks_and_tasks",
        ),
        backends=(PG,),
        what="presence locks left over when an entry point ends stay with the connection",
    ),
    m(
        "CL9",
        "store/presence.py",
        "            elif held.entry is entry:\n",
        "            elif True:\n",
        tests=(
            "tests/store/test_presence.py::test_an_entry_point_leaves_claims_it_did_not_make_alone",
        ),
        backends=(PG,),
        what="an entry point's end releases locks of claims made outside it",
    ),
    m(
        "CL10",
        "store/operators.py",
        '        ).update(lease_until=F("created_at"))\n',
        "        ).update(lease_until=now_value(using))\n",
        tests=(
            "tests/test_logs.py::"
            "test_a_takeover_says_whether_the_lease_expired_or_an_operator_ended_it",
        ),
        what="a lease ended by an operator is logged as expired when taken over",
    ),
    m(
        "CL11",
        "store/sql.py",
        "       owner_pid, false, {owner_gone()}, lease_until = created_at, {_AGE}, {_WINDOW}\n",
        "       owner_pid, false, {owner_gone()}, false, {_AGE}, {_WINDOW}\n",
        tests=(
            "tests/test_logs.py::"
            "test_a_lease_an_operator_ended_is_taken_over_for_the_operator_on_every_table",
        ),
        backends=(PG,),
        what="PostgreSQL's takeover (plain table) never says an operator ended the lease",
    ),
    m(
        "CL11f",
        "store/schema/functions.py",
        "            v_row.lease_until = v_row.created_at,\n",
        "            false,\n",
        tests=(
            "tests/test_logs.py::"
            "test_a_takeover_says_whether_the_lease_expired_or_an_operator_ended_it",
            "tests/test_logs.py::"
            "test_a_lease_an_operator_ended_is_taken_over_for_the_operator_on_every_table",
        ),
        backends=(PG,),
        what="PostgreSQL's takeover (partitioned table, the claim function) never says an "
        "operator ended the lease",
    ),
    m(
        "CL12",
        "store/rows.py",
        '    values["ended_by_operator"] = values["lease_until"] == values["created_at"]\n',
        '    values["ended_by_operator"] = False\n',
        tests=(
            "tests/test_logs.py::"
            "test_a_takeover_says_whether_the_lease_expired_or_an_operator_ended_it",
        ),
        backends=(SQLITE,),
        what="the ORM's takeover never says an operator ended the lease",
    ),
    m(
        "CL13",
        "store/claims.py",
        "    if not same_request(record.fingerprint, fingerprint):\n",
        "    if not record.completed and (not live or record.owner_gone):\n"
        "        return Verdict.TAKE_OVER\n"
        "    if not same_request(record.fingerprint, fingerprint):\n",
        tests=(
            "tests/store/test_presence.py::test_a_presence_takeover_refuses_a_request_with_another_body",
            "tests/store/test_judge.py",
        ),
        what="a takeover (owner gone, or lease over) by a request with another body",
    ),
    m(
        "CL15",
        "store/heartbeat.py",
        '                    logger.warning("heartbeat found the claim taken over; stopped", '
        "extra=kwargs)\n                    return\n",
        '                    logger.warning("heartbeat found the claim taken over; stopped", '
        "extra=kwargs)\n",
        tests=(
            "tests/store/test_heartbeat.py::test_the_heartbeat_stops_once_its_claim_was_taken_over",
        ),
        backends=(PG,),
        what="the heartbeat keeps beating for a claim taken over",
    ),
    m(
        "CL16",
        "store/heartbeat.py",
        "                    connections[self.claim.using].close()\n                    continue\n",
        "                    continue\n",
        tests=(
            "tests/store/test_heartbeat.py::test_the_heartbeat_reconnects_after_its_connection_dropped",
        ),
        backends=(PG,),
        what="the heartbeat keeps its dropped connection (every later beat fails)",
    ),
    m(
        "CL17",
        "store/heartbeat.py",
        "                    connections[self.claim.using].close()\n                    continue\n",
        "                    return\n",
        tests=(
            "tests/store/test_heartbeat.py::test_the_heartbeat_reconnects_after_its_connection_dropped",
        ),
        backends=(PG,),
        what="the heartbeat stops after one failed beat (the lease runs out under the view)",
    ),
    m(
        "CL18",
        "inbox/calls.py",
        "                guard.check()  "
        "# a refused write the body caught still fails the attempt\n",
        "",
        tests=(
            "tests/store/test_routing.py::"
            "test_a_block_that_catches_the_refused_write_still_does_not_complete",
        ),
        what="once(): a block that caught CrossDatabaseWrite completes",
    ),
    m(
        "CL19",
        "inbox/calls.py",
        "        except BaseException:\n            release_claim(claim, None)\n",
        "        except Exception:\n            release_claim(claim, None)\n",
        tests=(
            "tests/inbox/test_calls.py::"
            "test_a_block_stopped_by_systemexit_or_keyboardinterrupt_releases_its_key",
        ),
        what="once(): SystemExit or KeyboardInterrupt in the block keeps the claim",
    ),
    m(
        "CL20",
        "extractors.py",
        '        if value is None or not value.strip(" \\t"):\n',
        "        if value is None:\n",
        tests=("tests/inbox/test_receivers.py::test_a_blank_key_header_is_no_key",),
        what="a blank key header is a key (combined: the other parts alone)",
    ),
    m(
        "CL21",
        "store/operators.py",
        "judge(existing, fingerprint) in (Verdict.REUSE, Verdict.TAKE_OVER)",
        "judge(existing, existing.fingerprint) in (Verdict.REUSE, Verdict.TAKE_OVER)",
        tests=(
            "tests/protocol/test_replay_negotiation.py::"
            "test_after_a_crashed_claim_no_renderer_fits_and_another_body_is_still_422",
        ),
        what="after a crashed claim, another body with an unrenderable Accept gets 406",
    ),
    m(
        "CL21p",
        "store/operators.py",
        "fetch(scope, using=using, test_presence=presence.tests(connections[using]))",
        "fetch(scope, using=using, test_presence=False)",
        tests=(
            "tests/protocol/test_replay_negotiation.py::"
            "test_no_renderer_fits_after_the_owner_is_gone_is_406_and_takes_nothing_over",
        ),
        backends=(PG,),
        what="a retry that cannot run the view gets 409 for a claim whose owner is gone",
    ),
    m(
        "CL22",
        "protocol/execute.py",
        "        if isinstance(caller, IdempotencyContext):  # the caller's own again\n"
        "            attach(request, caller)\n",
        "",
        tests=(
            f"{NESTED}::test_a_delegated_view_of_another_scope_commits_its_record_with_the_outer",
        ),
        what="the caller's request.idempotency stays the inner view's (another scope)",
    ),
    # principals.py (signatures): every malformed header a refusal, an empty secret never verifies
    m(
        "W1",
        "principals.py",
        "        if not key:\n",
        "        if False:\n",
        tests=(
            f"{RECEIVERS}::test_a_secret_setting_left_empty_refuses_every_delivery_and_says_so",
        ),
        what="a callable secret returning nothing verifies signatures made with the empty key",
    ),
    m(
        "W2",
        "principals.py",
        "if not sent.startswith(self.prefix) or not self.hex_digest",
        "if not self.hex_digest",
        tests=(f"{RECEIVERS}::test_a_malformed_signature_is_refused_never_an_error",),
        what="the prefix unchecked: `sha512=<sha256 digest>` accepted",
    ),
    m(
        "W3",
        "principals.py",
        "    if not secret:\n        raise ValueError(",
        "    if False:\n        raise ValueError(",
        tests=(f"{RECEIVERS}::test_an_empty_secret_is_refused_where_the_receiver_is_defined",),
        what="an empty secret value accepted where the receiver is defined",
    ),
    m(
        "W4",
        "principals.py",
        " or not self.hex_digest.fullmatch(hex_value):",
        ":",
        tests=(f"{RECEIVERS}::test_a_malformed_signature_is_refused_never_an_error",),
        what="the header's form unchecked: a non-ASCII or odd-length digest is a 500",
    ),
    # write_guard.py: judged by kind, every write still refused
    m(
        "W5",
        "transactions/write_guard.py",
        "        if _kind_writes(words[index + 1 : end]):\n            return True\n",
        "",
        tests=(
            f"{DATABASES}::test_statements_that_write",
            f"{DATABASES}::test_a_write_is_refused_however_it_is_spelled",
        ),
        what="a data-modifying WITH part not seen",
    ),
    m(
        "W6",
        "transactions/write_guard.py",
        "    return analyzed and _kind_writes(words[start:])\n",
        "    return _kind_writes(words[start:])\n",
        tests=(
            f"{DATABASES}::test_statements_that_do_not_write",
            f"{DATABASES}::test_a_postgres_read_elsewhere_with_write_keywords_passes",
        ),
        what="EXPLAIN without ANALYZE (the statement is not run) refused as a write",
    ),
    m(
        "W7",
        "transactions/write_guard.py",
        '        "NOTIFY", "REASSIGN", "LOAD",\n',
        '        "REASSIGN", "LOAD",\n',
        tests=(
            f"{DATABASES}::test_statements_that_write",
            f"{DATABASES}::test_a_notify_elsewhere_is_refused_and_never_delivered",
        ),
        what="NOTIFY on another database passes the guard and is delivered",
    ),
    m(
        "W8",
        "transactions/write_guard.py",
        "            texts.append(nested)\n",
        "            pass\n",
        tests=(f"{DATABASES}::test_statements_that_write",),
        what="a nested block comment read only as SQLite reads it: a write behind it passes",
    ),
    m(
        "W9",
        "transactions/write_guard.py",
        '        return "INTO" in rest  # SELECT ... INTO creates a table; INTO is reserved\n',
        "        return False\n",
        tests=(f"{DATABASES}::test_statements_that_write",),
        what="SELECT ... INTO (creates a table) passes the guard",
    ),
    # fingerprint.py: the media type, per-render form tokens
    m(
        "W10",
        "protocol/fingerprint.py",
        "                *_media_type_parts(body, media_type),\n",
        "",
        tests=(
            f"{FINGERPRINT}::test_a_key_replays_only_to_the_media_type_it_was_first_used_with",
            f"{FINGERPRINT}::test_the_same_bytes_under_another_media_type_are_another_request",
        ),
        what="the media type out of the fingerprint: a key replays to a type the view refuses",
    ),
    m(
        "W11",
        "protocol/fingerprint.py",
        "    if tuple(body) == _EMPTY:\n        return []\n",
        "",
        tests=(f"{FINGERPRINT}::test_an_empty_body_has_no_media_type",),
        what="an empty body's Content-Type counts: a retry sending none is a 422",
    ),
    m(
        "W12",
        "protocol/fingerprint.py",
        "            skip = {*exclude, *form_exclude}\n",
        "            skip = set(exclude)\n",
        tests=(
            f"{FINGERPRINT}::test_a_form_retried_with_a_re_rendered_csrf_token_is_replayed",
            f"{FINGERPRINT}::test_form_tokens_leave_json_bodies_alone",
        ),
        what="per-render form tokens fingerprinted: a re-rendered CSRF token is a 422",
    ),
    m(
        "W13",
        "protocol/begin.py",
        "            form_exclude=conf.fingerprint_form_tokens,\n",
        "",
        tests=(
            f"{FINGERPRINT}::test_a_form_retried_with_a_re_rendered_csrf_token_is_replayed",
            f"{FINGERPRINT}::test_a_form_retried_after_a_new_login_is_replayed",
        ),
        what="FINGERPRINT_FORM_TOKENS not applied: a form retried after a new login is a 422",
    ),
    # responses.py: the language label stored with the body
    m(
        "W14",
        "protocol/responses.py",
        "    label_language(response)\n",
        "",
        tests=(f"{REPLAY_HEADERS}::test_a_replay_keeps_the_language_of_the_body_it_replays",),
        what="Content-Language left to the retry's LocaleMiddleware: a German body labelled en",
    ),
    m(
        "W17",
        "transactions/write_guard.py",
        "        return not all(part in _BEGIN_WORDS for word in rest for part in word.split())\n",
        "        return False\n",
        tests=(f"{DATABASES}::test_statements_that_write",),
        what="a procedural block (`BEGIN INSERT ...; END`, Oracle) read as transaction control",
    ),
    # relay.py, marks.py, jobs.py, the commands, tasks.py: how the relay stops and
    # outlives the database
    m(
        "RL2",
        "outbox/claim.py",
        "                # still this claim: its attempt, its lease end or a renewal's later one\n"
        "                attempts=attempts,\n"
        "                available_at__gte=clock.to_db(end, connections[using]),\n",
        "",
        tests=(
            f"{GUARDS}::"
            "test_a_hand_back_after_the_lease_ran_out_leaves_the_next_relays_claim_alone",
        ),
        what="a hand-back after the relay's lease ended undoes another relay's claim",
    ),
    m(
        "RL3",
        "outbox/lease.py",
        "                        connections[using].close()  # the next try connects afresh\n",
        "                        pass\n",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_the_lease_is_renewed_after_the_keepers_connection_dies",
        ),
        backends=(PG,),
        what="the lease keeper keeps retrying on its dead connection",
    ),
    m(
        "RL4",
        "outbox/relay.py",
        "                try:\n                    self._record(item, error)\n",
        "                try:\n                    pass\n",
        tests=(
            f"{_STOPS}::test_ctrl_c_while_the_relay_waits_on_its_pool_marks_what_the_pool_delivered",
            f"{_STOPS}::"
            "test_a_pool_handler_raising_system_exit_leaves_no_delivered_message_unmarked",
        ),
        what="a stopped pooled relay drops the outcomes of the handlers that finished",
    ),
    m(
        "RL5",
        "outbox/relay.py",
        "            holding.give_back_quietly(pool.cancel())\n",
        "            pool.cancel()\n",
        tests=(
            f"{_STOPS}::test_ctrl_c_while_the_relay_waits_on_its_pool_marks_what_the_pool_delivered",
            f"{_STOPS}::"
            "test_a_pool_handler_raising_system_exit_leaves_no_delivered_message_unmarked",
        ),
        what="a stopped pooled relay keeps what it did not start leased until the lease ends",
    ),
    m(
        "RL6",
        "outbox/relay.py",
        "            holding.give_back_quietly()\n",
        "",
        tests=(
            f"{_STOPS}::test_a_second_sigterm_stops_the_relay_at_once",
            f"{_STOPS}::test_a_soft_time_limit_inside_a_handler_stops_the_batch",
        ),
        what="a stopped inline relay keeps what it did not start leased until the lease ends",
    ),
    m(
        "RL7",
        "outbox/relay.py",
        "                holding.tend()  # between handlers; the keeper while one blocks\n"
        "                item = holding.take(self._stopping)\n",
        "                holding.tend()  # between handlers; the keeper while one blocks\n"
        "                item = holding.take(False)\n",
        tests=(
            f"{_STOPS}::test_sigterm_stops_the_relay_after_its_running_handlers_and_marks_them",
            f"{_STOPS}::test_stop_from_another_thread_ends_the_batch_after_the_running_handler",
        ),
        what="Relay.stop() (SIGTERM) ignored by the inline relay: the batch goes on",
    ),
    m(
        "RL8",
        "outbox/relay.py",
        "                    if self._stopping:\n"
        "                        more = more and holding.take(True) is not None\n",
        "",
        tests=(
            f"{_STOPS}::test_sigterm_stops_the_relay_after_its_running_handlers_and_marks_them",
        ),
        what="Relay.stop() (SIGTERM) ignored by the pooled relay: the batch goes on",
    ),
    m(
        "RL9",
        "outbox/relay.py",
        "            pool.wake()  # the relay's thread may be waiting for a handler's outcome\n",
        "            pass\n",
        tests=(
            f"{_STOPS}::test_sigterm_stops_the_relay_after_its_running_handlers_and_marks_them",
        ),
        what="Relay.stop() does not wake a pooled relay: the rest is handed back only later",
    ),
    m(
        "RL10",
        "management/jobs.py",
        "            raise _Idle\n",
        "            pass\n",
        tests=(
            f"{_STOPS}::test_sigterm_ends_the_wait_between_polls_at_once",
            "tests/retention/test_sweep_command.py::test_the_sweeper_loop_stops_on_sigterm_between_sweeps",
        ),
        what="SIGTERM waits for the end of the poll interval (a container stop times out)",
    ),
    m(
        "RL11",
        "management/commands/idempotency_relay.py",
        "                        except UNAVAILABLE as exc:\n"
        "                            if once:\n",
        "                        except () as exc:\n                            if once:\n",
        tests=(
            f"{_OUTAGES}::test_the_relay_command_rides_out_a_database_outage",
            f"{_OUTAGES}::test_the_relay_command_starts_before_the_database_is_up",
        ),
        backends=(PG,),
        what="the relay command exits on the first database outage",
    ),
    m(
        "RL12",
        "management/jobs.py",
        "        if self.failures == 1:\n",
        "        if True:\n",
        tests=(
            f"{_OUTAGES}::test_the_relay_command_rides_out_a_database_outage",
            "tests/retention/test_sweep_command.py::test_the_sweeper_loop_rides_out_a_database_outage",
        ),
        backends=(PG,),
        what="an outage logged as an error at every retry",
    ),
    m(
        "RL13",
        "tasks.py",
        "        except jobs.UNAVAILABLE as exc:\n"
        "            outage.failed(exc)\n            continue\n"
        "        outage.recovered()\n    return total\n",
        "        except () as exc:\n            outage.failed(exc)\n            continue\n"
        "        outage.recovered()\n    return total\n",
        tests=(f"{_OUTAGES}::test_the_relay_task_logs_an_outage_once_and_the_next_run_delivers",),
        backends=(PG,),
        what="the relay task raises a traceback on every run during an outage",
    ),
    m(
        "RL14",
        "management/commands/idempotency_sweep.py",
        "                        except UNAVAILABLE as exc:\n",
        "                        except () as exc:\n",
        tests=(
            "tests/retention/test_sweep_command.py::test_the_sweeper_loop_rides_out_a_database_outage",
        ),
        backends=(PG,),
        what="the sweeper loop exits on the first database outage",
    ),
    m(
        "RL15",
        "outbox/deliver.py",
        "                if error is not None:\n                    discard_broken_connections()\n",
        "",
        tests=(f"{_OUTAGES}::test_a_handler_whose_session_dies_fails_alone[2]",),
        backends=(PG,),
        what="a pool thread hands a dead connection to every later handler",
    ),
    m(
        "RL16",
        "outbox/relay.py",
        "                if error is not None or connections[self.using].errors_occurred:\n"
        "                    discard_broken_connections()\n",
        "",
        tests=(f"{_OUTAGES}::test_a_handler_whose_session_dies_fails_alone[1]",),
        backends=(PG,),
        what="an inline handler's dead session fails the relay's own writes after it",
    ),
    m(
        "RL17",
        "tasks.py",
        "                stop_on=(SoftTimeLimitExceeded,),\n",
        "",
        tests=(
            "tests/integration/test_celery_relay.py::"
            "test_the_soft_time_limit_stops_the_relay_task_with_nothing_left_unmarked",
        ),
        what="the relay task goes on delivering past its soft time limit",
    ),
    # conformance/: the check of a live endpoint stays within its URLs and bounds, and
    # each check catches the fault it names
    m(
        "CF1",
        "conformance/traffic.py",
        "        if url not in self.allowed:\n",
        "        if False:\n",
        tests=("tests/conformance/test_cli.py::test_a_request_to_another_url_is_never_sent",),
        backends=(SQLITE,),
        what="the conformance check sends to a URL it was not given",
    ),
    m(
        "CF2",
        "conformance/traffic.py",
        "            if self.sent >= self.config.max_requests:\n",
        "            if False:\n",
        tests=("tests/conformance/test_cli.py::test_no_request_is_sent_past_the_cap",),
        backends=(SQLITE,),
        what="the conformance check sends past its request cap",
    ),
    m(
        "CF3",
        "conformance/traffic.py",
        "            if timeout <= 0:\n",
        "            if False:\n",
        tests=("tests/conformance/test_cli.py::test_a_run_past_its_time_budget_stops_and_exits_2",),
        backends=(SQLITE,),
        what="the conformance check sends past its time budget",
    ),
    m(
        "CF4",
        "conformance/duplicates.py",
        "    if len(firsts) > 1:\n",
        "    if False:\n",
        tests=(
            "tests/conformance/test_broken_servers.py::"
            "test_a_cache_then_execute_middleware_is_caught_running_duplicates_twice",
        ),
        backends=(SQLITE,),
        what="concurrent duplicates that all ran pass the conformance check",
    ),
    m(
        "CF5",
        "conformance/replay.py",
        "    if answer.replayed or (executed and same_body):\n",
        "    if False:\n",
        tests=(
            "tests/conformance/test_broken_servers.py::"
            "test_replaying_another_principals_answer_is_caught",
        ),
        backends=(SQLITE,),
        what="a replay to another principal passes the conformance check",
    ),
    m(
        "CF6",
        "conformance/keys.py",
        "        elif status is None or status >= 500:\n",
        "        elif False:\n",
        tests=("tests/conformance/test_broken_servers.py::test_a_500_for_a_bad_key_is_caught",),
        backends=(SQLITE,),
        what="a 500 for a bad key passes the conformance check",
    ),
    m(
        "CF7",
        "conformance/replay.py",
        "        if a != b:\n",
        "        if False:\n",
        tests=(
            "tests/conformance/test_broken_servers.py::"
            "test_a_replay_without_the_bodys_media_type_is_caught",
        ),
        backends=(SQLITE,),
        what="a replay without its Content-Type passes the conformance check",
    ),
    # fingerprint.py: a blank query parameter is part of the query
    m(
        "FP1",
        "protocol/fingerprint.py",
        'parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=True, encoding=',
        'parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=False, encoding=',
        tests=(
            "tests/protocol/test_key_reused_parts.py::"
            "test_a_blank_query_parameter_is_another_request_than_no_query",
        ),
        what="?flag= and no query fingerprint alike: a key replays across them",
    ),
    # store/fingerprints.py: a record stored under other fingerprint settings
    m(
        "FP2",
        "store/fingerprints.py",
        "        or (first[3] != second[3] and first[1] == second[1])\n",
        "",
        tests=(
            "tests/protocol/test_fingerprint_settings_change.py::"
            "test_a_byte_identical_retry_replays_a_record_stored_under_other_settings",
        ),
        what="a record stored before a header was fingerprinted answers its retry 422",
    ),
    m(
        "FP3",
        "store/fingerprints.py",
        "        or first[2] == second[2]\n",
        "",
        tests=(
            "tests/store/test_presence.py::"
            "test_a_presence_takeover_of_a_claim_stored_under_other_settings",
            "tests/store/test_judge.py",
        ),
        what="a byte-identical retry after an exclusion was added is refused (422) instead "
        "of taking over its crashed claim or replaying",
    ),
    # client: headers it reads, a caller's key, its log lines
    m(
        "HX1",
        "client/responses.py",
        "    if _DELAY_SECONDS.fullmatch(value):\n",
        "    if value.isdigit():\n",
        tests=("tests/client/test_retry_after.py",),
        backends=(SQLITE,),
        what="Retry-After: \u00b2 raises ValueError out of post()",
    ),
    m(
        "HX2",
        "client/policy.py",
        "        own = caller_key(headers)\n",
        "        own = None\n",
        tests=("tests/client/test_caller_key.py",),
        backends=(SQLITE,),
        what="a key in headers= is replaced by the client's own",
    ),
    m(
        "HX3",
        "client/logs.py",
        "        if isinstance(details.caused_by, RetryAfter):\n            return None\n",
        "",
        tests=("tests/client/test_retry_logging.py",),
        backends=(SQLITE,),
        what="stamina prints a bare retry_scheduled line for each client retry",
    ),
    # Django Ninja: an operation's own options, its temporal response, uploads of PUT
    # and PATCH, the principal a refreshed credential keeps, the checks' listing, the 422
    m(
        "NJ1",
        "contrib/ninja.py",
        "    if opts.principal is None:\n",
        "    if True:\n",
        tests=(
            "tests/contrib/test_ninja_operations.py::"
            "test_an_operations_own_principal_scopes_its_keys",
        ),
        what="a Ninja operation's own principal= is replaced by auth_principal",
    ),
    m(
        "NJ2",
        "contrib/ninja.py",
        "    temporal = values.get(response_arg) if response_arg else None\n",
        "    temporal = None\n",
        tests=(
            "tests/contrib/test_ninja_operations.py::"
            "test_headers_set_on_the_temporal_response_are_sent_and_replayed",
        ),
        what="headers a Ninja operation sets on its response parameter are dropped",
    ),
    m(
        "NJ3",
        "protocol/fingerprint.py",
        "    return (post, files) if post or files else None\n",
        "    return None\n",
        tests=("tests/contrib/test_ninja_uploads.py",),
        what="a PUT/PATCH form a middleware parsed is refused as an unreadable body",
    ),
    m(
        "NJ4",
        "contrib/ninja.py",
        'for candidate in (auth, getattr(auth, "user", None), getattr(request, "user", None)):',
        'for candidate in (auth, getattr(request, "user", None)):',
        tests=(
            "tests/contrib/test_ninja_principals.py::"
            "test_a_refreshed_access_token_replays_the_operation_of_the_old_one",
        ),
        what="a Ninja credential row is not scoped by its user (a refresh runs again)",
    ),
    m(
        "NJ5",
        "contrib/ninja.py",
        'endpoints.register("ninja", _protected_operations)\n',
        "",
        tests=("tests/checks/test_ninja_checks.py",),
        what="the system checks do not list Ninja operations",
    ),
    m(
        "NJ6",
        "contrib/ninja_openapi.py",
        "    return bool(operation.models) and 422 not in operation.response_models\n",
        "    return bool(operation.models)\n",
        tests=(
            "tests/contrib/test_ninja.py::"
            "test_openapi_a_declared_422_keeps_its_schema_beside_the_problem",
        ),
        what="Ninja's schema of a declared 422 is replaced by the validation error's",
    ),
    # IdempotentMixin: an action left unprotected is exempted by name, the rest reported
    m(
        "UA1",
        "protocol/drf.py",
        "        if action in self.idempotency_exempt_actions:\n            return None\n",
        "",
        tests=(
            "tests/checks/test_unlisted_actions.py::"
            "test_an_exempt_action_runs_unprotected_beside_the_protected_ones",
        ),
        what="an action in idempotency_exempt_actions is protected anyway",
    ),
    m(
        "UA2",
        "checks/actions.py",
        "            if action not in exempt and not _protected(view_class, action)\n",
        "            if not _protected(view_class, action)\n",
        tests=(
            "tests/checks/test_unlisted_actions.py::"
            "test_w011_names_each_mutating_action_neither_protected_nor_exempt",
        ),
        what="W011 names actions the view exempts by name",
    ),
    m(
        "UA3",
        "checks/actions.py",
        "            if action not in exempt and not _protected(view_class, action)\n",
        "            if action not in exempt\n",
        tests=(
            "tests/checks/test_unlisted_actions.py::"
            "test_w011_names_each_mutating_action_neither_protected_nor_exempt",
        ),
        what="W011 names protected actions",
    ),
    # outbox/lease.py: a relay keeps its lease while handlers run, and attempts count
    # handler runs
    m(
        "OL1",
        "outbox/lease.py",
        "        if self._held and now >= self._renew_at:\n            self._renew()\n",
        "",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_a_handler_slower_than_the_lease_runs_once_and_its_batch_is_delivered_meanwhile",
        ),
        backends=(PG,),
        what="no renewal: another relay runs a handler slower than the lease again",
    ),
    m(
        "OL2",
        "outbox/lease.py",
        "        if self._rest and now >= self._hand_back_at:\n            self._give_back()\n",
        "",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_a_handler_slower_than_the_lease_runs_once_and_its_batch_is_delivered_meanwhile",
        ),
        backends=(PG,),
        what="the rest of a batch waits for its slow handler instead of being handed back",
    ),
    # outbox/failures.py, conf.py: the retry schedule rides out a day of outage
    m(
        "OB1",
        "outbox/failures.py",
        "    return ceiling / 2 + float(rand()) * ceiling / 2\n",
        "    return float(rand()) * ceiling\n",
        tests=("tests/outbox/test_retry_schedule.py",),
        backends=(SQLITE,),
        what="full jitter: the schedule has no floor, a short outage dead-letters messages",
    ),
    # outbox/kick.py: a broker outage never slows a request
    m(
        "OK1",
        "outbox/kick.py",
        "    _kicker.submit(current_app.send_task, using)\n",
        "    _kicker._send(current_app.send_task, using)\n",
        tests=("tests/outbox/test_kick.py",),
        backends=(SQLITE,),
        what="the kick is sent from the request's thread: a silent broker holds the request",
    ),
    m(
        "OK2",
        "outbox/kick.py",
        "            if failures == 1:\n",
        "            if True:\n",
        tests=("tests/outbox/test_kick.py",),
        backends=(SQLITE,),
        what="a broker outage logs a warning per kick, not one per outage",
    ),
    # outbox/relay.py, management/jobs.py: the relay's keeper after close, backoff, SIGTERM
    m(
        "OR1",
        "outbox/relay.py",
        "                    keeper, self._keeper = self._keeper, None\n",
        "                    keeper = self._keeper\n",
        tests=(
            "tests/outbox/test_relay_leases.py::"
            "test_a_relay_used_again_after_close_renews_its_lease_while_a_handler_blocks",
        ),
        backends=(PG,),
        what="a relay used again after close() has no lease keeper: a blocking handler's "
        "lease is not renewed",
    ),
    m(
        "OR2",
        "management/jobs.py",
        "        self.retry_at = now + delay\n",
        "        self.retry_at = now\n",
        tests=(f"{_OUTAGES}::test_the_relay_command_backs_off_while_the_database_is_down",),
        backends=(PG,),
        what="the relay command retries a database that is down in a tight loop",
    ),
    m(
        "OR3",
        "management/jobs.py",
        "            signal.signal(signal.SIGTERM, self._previous)\n",
        "            pass\n",
        tests=(
            "tests/outbox/test_relay.py::"
            "test_the_relay_command_gives_back_the_previous_sigterm_handler",
        ),
        backends=(SQLITE,),
        what="the relay command leaves its SIGTERM handler installed after it returns",
    ),
    # Operators' tools and the guards around them
    m(
        "OP1",
        "management/commands/idempotency_records.py",
        "        ids = [record.pk for record in found]  # only those printed (--limit)\n",
        "        ids = list(records.values_list('pk', flat=True))\n",
        tests=(
            "tests/test_operator_command.py::"
            "test_end_lease_and_forget_act_only_on_the_records_printed_by_limit",
        ),
        what="idempotency_records --limit N --end-lease ends every match, not the N printed",
    ),
    m(
        "OP2",
        "protocol/decide.py",
        "        if result.owner_pid is not None and presence.can_wait(using):\n",
        "        if presence.can_wait(using):\n",
        tests=(
            "tests/protocol/test_bounded_wait.py::"
            "test_a_duplicate_waiting_on_an_owner_without_presence_pauses_between_claims",
        ),
        backends=(PG,),
        what="a duplicate waiting on an owner without a presence lock claims in a busy loop",
    ),
    m(
        "OP3",
        "protocol/decide.py",
        "        time.sleep(min(delay, remaining))  # bounded in-flight wait (opt-in per view)\n",
        "",
        tests=(
            "tests/protocol/test_bounded_wait.py::"
            "test_a_duplicate_waiting_on_an_owner_without_presence_pauses_between_claims",
        ),
        what="a duplicate that cannot wait on a presence lock claims in a busy loop",
    ),
    m(
        "OP4",
        "contrib/celery_beat.py",
        "    alias = str(schema_editor.connection.alias)\n",
        '    alias = "default"\n',
        tests=(
            "tests/contrib/test_celery_beat.py::"
            "test_a_data_migration_run_on_another_database_writes_there",
        ),
        what="add_periodic_tasks in a migration on another database writes on 'default'",
    ),
    m(
        "OP5",
        "store/records/postgresql.py",
        "    if connection.queries_logged:\n        return connection.make_debug_cursor(raw)\n",
        "",
        tests=(
            "tests/store/test_large_body_completion.py::"
            "test_a_large_completion_appears_in_djangos_query_log",
        ),
        backends=(PG,),
        what="a large-body completion is missing from Django's query log",
    ),
    m(
        "OP6",
        "store/presence.py",
        "            if _gone(raw):\n                del _held[token]\n            elif",
        "            if False:\n                pass\n            elif",
        tests=(
            "tests/store/test_presence.py::test_the_presence_of_a_closed_connection_is_forgotten",
        ),
        backends=(PG,),
        what="the presence of claims whose connection closed is kept for ever",
    ),
    # Schema-per-tenant (django-tenants): each scenario runs in both layouts of the app.
    m(
        "TN1",
        "store/tenants.py",
        """    try:
        yield
    finally:
        put(connection, previous)


def enter_schema(""",
        """    yield


def enter_schema(""",
        tests=(
            f"{_TENANTS}[test_a_worker_is_back_in_its_tenant_after_sweeps_and_relay_passes-tenant]",
        ),
        backends=(PG,),
        what="a sweep or relay pass leaves the worker's connection in the last tenant's schema",
    ),
    m(
        "TN2",
        "retention/sweeper.py",
        "            if current_schema(holder) is None:\n",
        "            if True:\n",
        tests=(f"{_TENANTS}[test_sweeps_of_two_tenant_schemas_never_skip_each_other-tenant]",),
        backends=(PG,),
        what="a tenant schema's sweep takes the database-wide lock: other schemas' sweeps skip",
    ),
    m(
        "TN3",
        "store/heartbeat.py",
        "            tenants.enter(self.claim.using, self._place)",
        "            pass",
        tests=(f"{_TENANTS}[test_the_heartbeat_keeps_a_tenants_claim_past_its_lease-both]",),
        backends=(PG,),
        what="the heartbeat beats in public: a tenant's lease runs out under a live view",
    ),
    m(
        "TN4",
        "store/tenants.py",
        "    copy = connection.copy()\n    put(copy, place_of(connection))\n",
        "    copy = connection.copy()\n",
        tests=(f"{_TENANTS}[test_extend_lease_in_a_tenant_keeps_that_tenants_claim-both]",),
        backends=(PG,),
        what="extend_lease() extends from public: a tenant's claim looks taken over",
    ),
    m(
        "TN5",
        "store/schema/tables.py",
        "               WHERE c.relnamespace = p.relnamespace AND c.relname = %(name)s),\n",
        "               WHERE c.relname = %(name)s),\n",
        tests=(
            f"{_TENANTS}[test_a_tenants_claim_of_a_day_without_a_partition_stays_in_its_own_"
            "schema-tenant]",
        ),
        backends=(PG,),
        what="creating a tenant's day takes public's table of that day for the tenant's: the "
        "day is never created in the tenant's schema",
    ),
    m(
        "TN6",
        "store/tenants.py",
        "AND n.nspname = ANY(%s) ",
        "AND %s IS NOT NULL ",
        tests=(
            f"{_TENANTS}[test_a_schema_that_is_not_a_tenant_is_neither_swept_nor_relayed-tenant]",
        ),
        backends=(PG,),
        what="a schema that is not a tenant's (a backup) is swept and relayed",
    ),
    m(
        "TN7",
        "retention/sweeper.py",
        '            if not dropped_during(alias, name, exc, "idempotency sweep"):\n',
        "            if True:\n",
        tests=(
            f"{_TENANTS}[test_a_tenant_deleted_during_a_pass_is_skipped_and_the_others_done-tenant]",
        ),
        backends=(PG,),
        what="a tenant deleted during a sweep stops the sweep of every other tenant",
    ),
    m(
        "TN8",
        "testing/threads.py",
        "                tenants.enter(alias, place)\n",
        "                pass\n",
        tests=(f"{_TENANTS}[test_the_test_kit_works_in_a_tenant-tenant]",),
        backends=(PG,),
        what="the test kit's threads run in public, not in the test's tenant",
    ),
    m(
        "TN9",
        "outbox/relay.py",
        "schema if schema is not None else current_schema(connections[self.using])",
        "schema",
        tests=(
            f"{_TENANTS}[test_a_relay_run_from_a_tenant_delivers_there_with_its_threads-tenant]",
        ),
        backends=(PG,),
        what="a relay run from a tenant starts its handlers' threads and lease keeper in public",
    ),
    # Failure signatures: headroom to the lease, replay age, keys minted per attempt.
    m(
        "FS1",
        "signals.py",
        "    return not renewed and lease > 0 and duration >= conf.lease_warning_fraction * lease",
        "    return lease > 0 and duration >= conf.lease_warning_fraction * lease",
        tests=(
            "tests/test_failure_signatures.py::"
            "test_an_execution_that_extended_its_lease_is_not_near_it",
        ),
        what="an execution that renewed its lease counts as near it",
    ),
    m(
        "FS2",
        "signals.py",
        "    return age >= conf.retention_warning_fraction * window",
        "    return age >= window",
        tests=(
            "tests/test_failure_signatures.py::"
            "test_a_replay_near_the_end_of_the_retention_window_counts",
        ),
        what="a replay near the end of its record's window is not counted",
    ),
    m(
        "FS3",
        "management/audit.py",
        "    WHERE created_at >= %s\n",
        "    WHERE created_at >= %s OR true\n",
        tests=("tests/test_audit_command.py::test_the_audit_counts_only_claims_within_its_window",),
        what="the audit reads every record, not the window's",
    ),
    m(
        "FS4",
        "metrics.py",
        "    for endpoint in sorted(reported - set(groups)):\n"
        '        sink.observe(KEYS_MINTED, 0.0, {"endpoint": endpoint})\n',
        "",
        tests=(
            "tests/test_audit_command.py::"
            "test_the_audit_sets_the_gauge_and_zeroes_an_endpoint_no_longer_found",
        ),
        what="an endpoint no longer found by the audit keeps its last gauge value",
    ),
    m(
        "FS5",
        "tasks.py",
        '    if all("counts" in each for each in reports):\n',
        "    if True:\n",
        tests=(
            "tests/test_audit_command.py::"
            "test_an_audit_task_run_that_missed_a_database_leaves_the_gauges",
        ),
        what="an audit run that missed a database zeroes the keys-minted gauges",
    ),
    m(
        "FS6",
        "store/reports.py",
        "                cursor.execute(\"SELECT set_config('statement_timeout', %s, true)\", "
        "[previous])\n",
        "                pass\n",
        tests=(
            "tests/store/test_reports.py::"
            "test_a_bounded_read_leaves_the_callers_statement_timeout_as_it_was",
        ),
        backends=(PG,),
        what="a bounded read leaves its statement_timeout in force in the caller's transaction",
    ),
    m(
        "OP7",
        "store/operators.py",
        "_KEY_HASH_SQL = \"left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 12)\"\n",
        "_KEY_HASH_SQL = \"left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 16)\"\n",
        tests=(
            "tests/store/test_operators.py::"
            "test_with_key_hash_finds_exactly_the_records_whose_key_has_that_hash",
        ),
        backends=(PG,),
        what="--key-hash on PostgreSQL compares another digest than the logs' key_hash",
    ),
    # the relay command closes the connections it opened when it returns
    m(
        "RC1",
        "management/commands/idempotency_relay.py",
        "        with OwnConnections():\n",
        "        with contextlib.nullcontext():\n",
        tests=(
            "tests/outbox/test_relay_connections.py::"
            "test_the_relay_command_closes_the_connections_it_opened_when_it_returns",
        ),
        backends=(PG,),
        what="the relay command leaves the connections it opened on the calling thread open",
    ),
    m(
        "RC2",
        "outbox/lease.py",
        "        finally:\n            connections.close_all()\n",
        "        finally:\n            pass\n",
        tests=(
            "tests/outbox/test_relay_connections.py::"
            "test_the_relay_command_closes_the_connections_it_opened_when_it_returns",
        ),
        backends=(PG,),
        what="the lease keeper leaves its connections open when the relay closes",
    ),
    m(
        "RC4",
        "outbox/deliver.py",
        "        finally:\n            connections.close_all()\n",
        "        finally:\n            pass\n",
        tests=(
            "tests/outbox/test_relay_pool.py::test_pool_threads_close_their_connections",
            "tests/outbox/test_relay_connections.py::"
            "test_the_relay_command_closes_the_connections_it_opened_when_it_returns[pool]",
        ),
        backends=(PG,),
        what="the pool's threads leave their connections open when the pool closes",
    ),
    m(
        "RC5",
        "management/jobs.py",
        "            if conn.alias in self._open or conn.connection is None",
        "            if conn.connection is None",
        tests=(
            "tests/outbox/test_relay_connections.py::"
            "test_the_relay_command_leaves_the_callers_open_connection_open",
        ),
        backends=(PG,),
        what="the relay command closes the caller's connection, open before it ran",
    ),
    m(
        "RC6",
        "management/commands/idempotency_relay.py",
        'dropped_during(*target, exc, "outbox relay") and error is None:\n',
        'dropped_during(*target, exc, "outbox relay"):\n                    raise\n',
        tests=(
            "tests/outbox/test_relay_connections.py::"
            "test_a_relay_that_fails_to_close_does_not_keep_the_others_open",
        ),
        backends=(PG,),
        what="a relay that fails to close leaves the command's other relays and threads open",
    ),
    # the sweep command closes the connections it opened when it returns
    m(
        "RC7",
        "management/commands/idempotency_sweep.py",
        "        with OwnConnections():  # a process that calls the command keeps no "
        "session of it\n            self._handle(options)\n",
        "        self._handle(options)\n",
        tests=(
            "tests/retention/test_sweep_command.py::"
            "test_the_sweep_command_closes_the_connections_it_opened_and_keeps_the_callers",
        ),
        backends=(PG,),
        what="the sweep command leaves the connections it opened open when it returns",
    ),
    # the ORM store's claim looks before it writes: a duplicate of a held key only reads
    m(
        "CL30",
        "store/records/portable.py",
        "            if existing is not None:\n                return existing\n",
        "",
        tests=("tests/store/test_sqlite_threads.py",),
        backends=(SQLITE,),
        what="a duplicate of a held key writes (and waits for SQLite's write lock)",
    ),
]


# --- running ------------------------------------------------------------------------


def _copy_checkout(into: Path) -> None:
    # docs/ and the README too: some tests check the docs against the code.
    for name in ("django_idempotency", "tests", "example_project", "docs"):
        shutil.copytree(
            ROOT / name, into / name, ignore=shutil.ignore_patterns("__pycache__", "var")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, into / name)


def _env(backend: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for name in ("DATABASE_URL", "PG_TEST_NAME", "SQLITE_TEST_PATH"):
        env.pop(name, None)  # the copy's test databases are its own (tests/settings.py)
    if backend == PG:
        env["DATABASE_URL"] = PG_URL
    return env


def _pytest(work: Path, mutant: Mutant, backend: str, timeout: float) -> str:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=--strict-markers",
        *mutant.tests,
    ]
    try:
        done = subprocess.run(
            command,
            cwd=work,
            env=_env(backend),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    if done.returncode == 0:
        return "passed"
    if done.returncode == 1:
        return "killed"
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return f"error (exit {done.returncode}): {' | '.join(tail)}"


def run_one(work: Path, mutant: Mutant, backends: tuple[str, ...], timeout: float) -> Outcome:
    originals: dict[Path, str] = {}
    mutated: dict[Path, str] = {}
    for name, edits in mutant.all_edits().items():
        target = work / "django_idempotency" / name
        originals[target] = text = target.read_text()
        for snippet, replacement in edits:
            if text.count(snippet) != 1:
                return Outcome(mutant, "stale")
            text = text.replace(snippet, replacement)
        mutated[target] = text
    started = time.monotonic()
    outcome = Outcome(mutant, "survived")
    try:
        for target, text in mutated.items():
            target.write_text(text)
        # Every backend where the path runs: killed on one and not the other is a hole.
        for backend in (b for b in mutant.backends if b in backends):
            outcome.runs[backend] = _pytest(work, mutant, backend, timeout)
    finally:
        for target, text in originals.items():
            target.write_text(text)
    results = list(outcome.runs.values())
    if not results:
        outcome.status = "skipped"
    elif any(r.startswith("error") for r in results):
        outcome.status = "error"
    elif all(r.startswith("killed") for r in results):
        outcome.status = "killed"
    outcome.seconds = time.monotonic() - started
    return outcome


def _baseline(work: Path, backends: tuple[str, ...], timeout: float) -> bool:
    """The selected tests pass on the unmutated copy (else every mutant looks killed)."""
    tests = sorted({t.split("::")[0] for mutant in MUTANTS for t in mutant.tests})
    probe = Mutant("baseline", "", (), tuple(tests))
    ok = True
    for backend in backends:
        result = _pytest(work, probe, backend, timeout * 4)
        print(f"baseline on {backend}: {result}", flush=True)
        ok = ok and result == "passed"
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--backend", choices=[PG, SQLITE], action="append")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    args = parser.parse_args(argv)
    backends = tuple(args.backend or BOTH)
    chosen = [mu for mu in MUTANTS if not args.ids or mu.id in args.ids]
    if args.list:
        for mu in chosen:
            mark = " (equivalent)" if mu.equivalent else ""
            for name, edits in mu.all_edits().items():
                text = (ROOT / "django_idempotency" / name).read_text()
                if any(text.count(snippet) != 1 for snippet, _ in edits):
                    mark += " STALE"
                    break
            print(f"{mu.id:5} {mu.file:20} {','.join(mu.backends):10} {mu.what}{mark}")
        return 0
    with tempfile.TemporaryDirectory(prefix="idempotency-mutation-") as tmp:
        work = Path(tmp)
        _copy_checkout(work)
        if not args.no_baseline and not _baseline(work, backends, args.timeout):
            print("the unmutated tests fail: fix them first", file=sys.stderr)
            return 2
        outcomes = []
        for mutant in chosen:
            outcome = run_one(work, mutant, backends, args.timeout)
            outcomes.append(outcome)
            runs = ", ".join(f"{b}: {r}" for b, r in outcome.runs.items())
            print(
                f"{mutant.id:5} {outcome.status:8} {outcome.seconds:5.0f}s  {mutant.what}"
                + (f"  [{runs}]" if runs else ""),
                flush=True,
            )
    return _report(outcomes)


def _report(outcomes: list[Outcome]) -> int:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    print("\n" + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    bad = 0
    for outcome in outcomes:
        mutant = outcome.mutant
        if outcome.status == "survived" and mutant.equivalent:
            print(f"  {mutant.id} survived, known equivalent: {mutant.equivalent}")
        elif outcome.status == "killed" and mutant.equivalent:
            print(f"  {mutant.id} is now killed: drop its `equivalent=` note")
        elif outcome.status in ("survived", "stale", "error"):
            bad += 1
            print(f"  {mutant.id} {outcome.status.upper()}: {mutant.what} ({mutant.file})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
