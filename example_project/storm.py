#!/usr/bin/env python
"""The retry storm: django-idempotency's promise end to end, over real HTTP.

leasebroker runs on gunicorn (several worker processes) on a throwaway PostgreSQL
database. Many client threads create workers through a fault-injecting proxy on
127.0.0.1 that drops answers after the view committed, stalls requests and answers
past the clients' timeout, and sends duplicates at once; some clients "crash" after
their first attempt and a new client picks the operation up from the key store; some
jobs run twice at the same time. The same storm runs twice:

* idempotency on: ``django_idempotency.client.IdempotentClient``, one key per
  operation (kept in a SQLite key store), reused by every retry;
* idempotency off: the same client and retries, but a new key on every attempt,
  which is what the server sees from a client without idempotency keys.

Each run prints the operations, attempts, replays, 409s, workers created and phantom
workers (workers beyond one per operation: must be 0 with idempotency on). Then a
gunicorn worker is killed with SIGKILL in the middle of a create; the client's retry
takes the key over (at once: the dead worker's database session, and with it its presence
lock, is gone; docs/robustness.md#owner-presence) and gets exactly one worker.

Exit code: 0 if idempotency held (no phantom, every operation done, the crash
recovered), 1 if not, 2 if the database or server could not be set up.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import stamina.instrumentation

from storm.clients import Mode, Storm, plan, stored_workers
from storm.crash import CrashReport, crash_mid_flight
from storm.proxy import FaultProxy, FaultRates
from storm.server import Gunicorn, SetupError, ThrowawayDatabase, manage, shown_url
from storm.verdict import RunResult, judge
from workers.demo_principals import DEMO_TOKENS

DEFAULT_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("STORM_DATABASE_URL", DEFAULT_ADMIN_URL),
        help="a PostgreSQL server's admin URL; the storm creates its own database there "
        f"and drops it at the end (default: $STORM_DATABASE_URL or {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument("--operations", type=int, default=120, help="logical operations per run")
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--server-workers", type=int, default=4, help="gunicorn processes")
    parser.add_argument(
        "--timeout", type=float, default=1.0, help="seconds per attempt before a client retries"
    )
    parser.add_argument("--seed", type=int, default=7, help="seeds the proxy's fault draws")
    parser.add_argument("--no-crash", action="store_true", help="skip the SIGKILL scenario")
    parser.add_argument(
        "--boot-seconds", type=float, default=2.0, help="slow boot for the crash scenario"
    )
    parser.add_argument(
        "--lease", type=float, default=3.0, help="idempotency lease for the crash scenario"
    )
    return parser.parse_args(argv)


def server_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DJANGO_SETTINGS_MODULE="leasebroker.settings",
        DATABASE_URL=database_url,
        DEBUG="false",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def run_storm(
    mode: Mode,
    proxy: FaultProxy,
    db: ThrowawayDatabase,
    args: argparse.Namespace,
    tmp: Path,
    server_url: str,
) -> RunResult:
    jobs = plan(args.operations)
    run_id = f"storm-{mode}-{uuid.uuid4().hex[:8]}"
    proxy.reset_counts()
    storm = Storm(
        base_url=proxy.url,
        token=DEMO_TOKENS["alice"],
        run_id=run_id,
        mode=mode,
        key_store=tmp / f"keys-{mode}.sqlite3",
        timeout=args.timeout,
        threads=args.clients,
    )
    started = time.monotonic()
    tally = storm.run(jobs)
    if not proxy.drain(timeout=60):  # stalled originals still arriving: wait for them
        print("  (the proxy still had requests in flight after 60 s)")
    seconds = time.monotonic() - started
    faults = dict(proxy.counts)
    abandoned = tally.abandoned()
    if mode == "on" and abandoned:
        # Clients that gave up broke no promise; their operations are resumed with the
        # keys in the key store, straight to the server: the stored answer, or one run.
        print(f"  {len(abandoned)} operations had no answer (their clients gave up): resuming")
        for number in abandoned:
            try:
                storm.resume(number, server_url)
            except Exception as exc:  # reported by the verdict as unresumed
                print(f"  (operation {number} could not be resumed: {exc})")
    return RunResult(
        mode=mode,
        operations=args.operations,
        jobs=len(jobs),
        tally=tally,
        faults=faults,
        stored=stored_workers(db.connect, run_id),
        seconds=seconds,
    )


def print_table(on: RunResult, off: RunResult) -> None:
    def row(label: str, a: object, b: object, note: str = "") -> None:
        print(f"  {label:<46}{a!s:>9}{b!s:>12}  {note}".rstrip())

    print("")
    print("== The storm: results ".ljust(88, "="))
    row("", "idem. on", "idem. off")
    row("logical operations", on.operations, off.operations)
    row("  of which: client crashed and restarted", *_kinds(on, off, "restart"))
    row("  of which: run by two threads at once", *_kinds(on, off, "twin"))
    row("HTTP attempts sent by clients", on.tally.attempts, off.tally.attempts)
    row("  replays (Idempotent-Replayed: true)", on.tally.replays, off.tally.replays)
    row("  409 (request in flight / lease lost)", on.tally.conflicts, off.tally.conflicts)
    row(
        "  no answer (reset by the proxy, timeout)",
        on.tally.network_errors,
        off.tally.network_errors,
    )
    for fault, label in (
        ("drop", "proxy: answers dropped after commit"),
        ("stall-request", "proxy: requests stalled past the timeout"),
        ("stall-response", "proxy: answers stalled past the timeout"),
        ("duplicate", "proxy: requests sent twice at once"),
        ("upstream requests", "requests that reached the server"),
    ):
        row(label, on.faults.get(fault, 0), off.faults.get(fault, 0))
    row("clients that gave up (retries exhausted)", on.clients_gave_up, off.clients_gave_up)
    row(
        "  operations left without an answer",
        len(on.tally.abandoned()),
        len(off.tally.abandoned()),
    )
    row("  of those, resumed later with their key", len(on.tally.resumed), "-")
    row("workers created", on.created, off.created)
    row("PHANTOM WORKERS (beyond one per operation)", on.phantom, off.phantom, "<- must be 0 on")
    row("operations without a worker", on.missing, off.missing)
    row("operations told of two different workers", on.split_answers, off.split_answers)
    row("seconds", f"{on.seconds:.1f}", f"{off.seconds:.1f}")
    for result in (on, off):
        print(f"  answers seen with idempotency {result.mode}: {_statuses(result)}")
    for result in (on, off):
        for failure in result.tally.failed[:5]:
            print(f"  [{result.mode}] {failure}")


def _errors(on: RunResult, off: RunResult) -> tuple[int, int]:
    return on.tally.network_errors, off.tally.network_errors


def _kinds(on: RunResult, off: RunResult, kind: str) -> tuple[int, int]:
    count = sum(1 for job in plan(on.operations) if job.kind == kind)
    if kind == "twin":
        count //= 2
    return count, count


def _statuses(result: RunResult) -> str:
    return ", ".join(f"{name} x{n}" for name, n in result.tally.statuses.most_common())


def print_crash(report: CrashReport) -> None:
    print("")
    print("== Crash mid-flight: SIGKILL the gunicorn worker running a create ".ljust(88, "="))
    print(f"  gunicorn workers before: {report.workers_before}")
    if report.killed_pid is None:
        print("  the request was never seen inside its transaction: nothing was killed")
    else:
        print(f"  killed worker {report.killed_pid} with SIGKILL while it was inside the view")
    print(f"  gunicorn workers after:  {report.workers_after} (the master replaced it)")
    for event in report.events:
        what = (
            f"{event.status}{' (replay)' if event.replayed else ''}"
            if event.status is not None
            else f"no answer: {type(event.error).__name__}"
        )
        wait = f", retry in {event.wait:.2f} s" if event.wait is not None else ""
        print(f"    attempt {event.number:>2}: {what}{wait}")
    if report.error is not None:
        print(f"  the client failed: {report.error}")
    print(f"  the record's state: {report.record_state}")
    print(f"  workers created for this one operation: {report.workers_created}")
    if report.recovery is not None:
        print(f"  from the kill to the retry's 201: {report.recovery:.2f} s")
    print(f"  took {report.seconds:.1f} s  ->  {'ok' if report.ok else 'FAILED'}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks: clean up


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamina.instrumentation.set_on_retry_hooks([])  # we print our own account of retries
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    print("leasebroker retry storm: gunicorn + PostgreSQL + a faulty network, twice")
    try:
        db = ThrowawayDatabase(args.database_url)
    except SetupError as exc:
        print(f"STORM FAILED: {exc}")
        return 2
    servers: list[Gunicorn] = []
    proxy: FaultProxy | None = None
    ok = True
    try:
        db.create()
        print(f"  database: {shown_url(db.url)} (created now, dropped at the end)")
        env = server_env(db.url)
        manage(env, "migrate", "--noinput", "-v", "0")
        manage(env, "create_demo_principals")
        server = Gunicorn(env, workers=args.server_workers)
        servers.append(server)
        server.start(DEMO_TOKENS["alice"])
        print(f"  server:   gunicorn, {args.server_workers} sync workers, {server.url}")
        proxy = FaultProxy(
            server.port, rates=FaultRates(), stall=args.timeout + 0.5, seed=args.seed
        )
        proxy.start()
        print(
            f"  proxy:    {proxy.url} (faults: {FaultRates()}, stall {proxy.stall:.1f} s, "
            f"seed {args.seed})"
        )
        print(
            f"  clients:  {args.clients} threads, {args.operations} operations per run, "
            f"{args.timeout:.1f} s per attempt"
        )
        with tempfile.TemporaryDirectory(prefix="storm-keys-") as tmp:
            results = {}
            for mode in ("on", "off"):
                print(f"  running the storm with idempotency {mode} ...")
                results[mode] = run_storm(mode, proxy, db, args, Path(tmp), server.url)
        on, off = results["on"], results["off"]
        print_table(on, off)
        verdict = judge(on)
        held = verdict.held
        print("")
        print(f"  {verdict.line(on)}")
        print(
            f"  idempotency off: {off.phantom} phantom workers, VMs nobody asked for (a new "
            "key per attempt: the server cannot tell a retry from a new request)"
        )
        ok = held
        if not args.no_crash:
            server.stop()
            crash_env = server_env(
                db.url,
                LEASEBROKER_BOOT_SECONDS=str(args.boot_seconds),
                LEASEBROKER_IDEMPOTENCY_LEASE=str(args.lease),
            )
            crash_server = Gunicorn(crash_env, workers=2)
            servers.append(crash_server)
            crash_server.start(DEMO_TOKENS["alice"])
            print("")
            print(
                f"  restarted gunicorn with a {args.boot_seconds:.1f} s boot and a "
                f"{args.lease:.1f} s idempotency lease"
            )
            report = crash_mid_flight(
                crash_server,
                db,
                token=DEMO_TOKENS["alice"],
                run_id=f"storm-crash-{uuid.uuid4().hex[:8]}",
                boot_seconds=args.boot_seconds,
                lease=args.lease,
            )
            print_crash(report)
            ok = ok and report.ok
        print("")
        print("STORM PASSED: idempotency held" if ok else "STORM FAILED")
        if not ok:
            print(f"\nLast lines of the server log ({servers[-1].log}):\n{servers[-1].tail()}")
        return 0 if ok else 1
    except SetupError as exc:
        print(f"\nSTORM FAILED: {exc}")
        for server in servers:
            print(f"\nLast lines of the server log ({server.log}):\n{server.tail()}")
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    finally:
        if proxy is not None:
            proxy.stop()
        for server in servers:
            server.stop()
            if ok:
                server.log.unlink(missing_ok=True)
        try:
            db.drop()
        except Exception as exc:  # never hide the real outcome behind a cleanup error
            print(f"  (could not drop {db.name}: {exc})")


if __name__ == "__main__":
    sys.exit(main())
