"""``idempotency-conformance`` (and ``python -m django_idempotency.conformance``).

Exit codes: 0 every check passed (warnings and skips allowed), 1 a check failed,
2 the run could not be made or was cut short (bad options, the request cap or the time
budget reached, the endpoint or the effect counter unreachable).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from django_idempotency.conformance.config import (
    CHECK_NAMES,
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_SECONDS,
    Config,
    ConfigError,
    parse_header,
)
from django_idempotency.conformance.runner import run

DESCRIPTION = (
    "Check that a deployed endpoint keeps the Idempotency-Key promise: one execution per "
    "key, faithful replays, refused bad keys. Sends requests to URL (and --effect-url) "
    "only, at most --max-requests of them, within --time-budget seconds. "
    "See docs/conformance.md for every request it sends."
)


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    p = argparse.ArgumentParser(prog="idempotency-conformance", description=DESCRIPTION)
    p.add_argument("url", nargs="?", help="the endpoint's absolute URL")
    p.add_argument("-X", "--method", default="POST", help="its unsafe method (default POST)")
    body = p.add_mutually_exclusive_group()
    body.add_argument(
        "--json", dest="json_body", metavar="JSON", help="a JSON request body (sent as given)"
    )
    body.add_argument(
        "--body-file", type=Path, metavar="PATH", help="a file whose bytes are the body"
    )
    p.add_argument("--content-type", help="the body's Content-Type (default with --json: JSON)")
    p.add_argument(
        "--other-body-file",
        type=Path,
        help="the body of key-reused (default: the JSON body with one member added)",
    )
    p.add_argument(
        "-H", "--header", action="append", default=[], help="'Name: value', on every request"
    )
    p.add_argument(
        "--other-principal-header",
        action="append",
        default=[],
        metavar="HEADER",
        help="'Name: value' of a second principal (e.g. its Authorization): principal-scoping",
    )
    counter = p.add_mutually_exclusive_group()
    counter.add_argument("--effect-url", help="a URL answering the number of effects (GET)")
    counter.add_argument("--effect-command", help="a shell command printing the number")
    p.add_argument(
        "--effect-field", help="dotted path to the number in the effect URL's JSON (a list: len)"
    )
    p.add_argument(
        "-n",
        "--concurrency",
        type=int,
        default=20,
        help=f"concurrent duplicates (default 20, at most {MAX_CONCURRENCY})",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (10)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=120.0,
        help=f"seconds for the whole run (120, at most {MAX_SECONDS:.0f})",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=200,
        help=f"the most requests to send (200, at most {MAX_REQUESTS})",
    )
    p.add_argument("--max-key-length", type=int, default=255, help="the longest key (255)")
    p.add_argument("--key-optional", action="store_true", help="the endpoint runs unkeyed requests")
    p.add_argument(
        "--safe-method", default="GET", help="method of safe-method ('' skips it; default GET)"
    )
    slow = p.add_mutually_exclusive_group()
    slow.add_argument(
        "--slow-query", help="query added to URL that makes the handler slow: in-flight"
    )
    slow.add_argument("--slow", action="store_true", help="the handler is slow as it is: in-flight")
    p.add_argument(
        "--in-flight-delay", type=float, default=0.5, help="seconds before the duplicate (0.5)"
    )
    p.add_argument(
        "--quick", type=float, default=1.0, help="most seconds for the in-flight 409 (1)"
    )
    p.add_argument("--replay-delay", type=float, default=1.0, help="seconds before the replay (1)")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=CHECK_NAMES,
        metavar="CHECK",
        help="a check not to run (see --list-checks)",
    )
    p.add_argument(
        "--json-report", type=Path, metavar="PATH", help="write the report as JSON to PATH"
    )
    p.add_argument("--list-checks", action="store_true", help="list the checks and exit")
    return p


def config_from(args: argparse.Namespace) -> Config:
    """The :class:`Config` the options describe.

    Raises:
        ConfigError: an option is invalid (a header without a colon, an unreadable file,
            a number out of range...).
    """
    if not args.url:
        raise ConfigError("the endpoint's URL is required")
    content_type = args.content_type
    body = b""
    if args.json_body is not None:
        try:
            json.loads(args.json_body)
        except ValueError as exc:
            raise ConfigError(f"--json is not JSON: {exc}") from None
        body, content_type = args.json_body.encode(), content_type or "application/json"
    elif args.body_file is not None:
        body = _read(args.body_file)
    return Config(
        url=args.url,
        method=args.method,
        body=body,
        content_type=content_type,
        headers=tuple(parse_header(h) for h in args.header),
        other_headers=tuple(parse_header(h) for h in args.other_principal_header),
        other_body=_read(args.other_body_file) if args.other_body_file else None,
        effect_url=args.effect_url,
        effect_field=args.effect_field,
        effect_command=args.effect_command,
        concurrency=args.concurrency,
        timeout=args.timeout,
        time_budget=args.time_budget,
        max_requests=args.max_requests,
        max_key_length=args.max_key_length,
        key_required=not args.key_optional,
        safe_method=args.safe_method,
        slow_query="" if args.slow else args.slow_query,
        in_flight_delay=args.in_flight_delay,
        in_flight_quick=args.quick,
        replay_delay=args.replay_delay,
        skip=frozenset(args.skip),
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0, 1 or 2)."""
    args = parser().parse_args(argv)
    if args.list_checks:
        print("\n".join(CHECK_NAMES))
        return 0
    try:
        config = config_from(args)
    except ConfigError as exc:
        print(f"idempotency-conformance: {exc}", file=sys.stderr)
        return 2
    print(f"checking {config.method} {config.url}: at most {config.planned_requests()} requests")
    report = run(config)
    print(report.table())
    if args.json_report:
        report.write_json(str(args.json_report))
    return report.exit_code()
