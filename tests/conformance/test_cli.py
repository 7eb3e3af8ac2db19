"""The command line, the test assertion, the report files, and the run's bounds.

What the check promises its user: it sends only to the URLs it was given, no more
requests than it plans and says, within its time budget; it exits 0, 1 or 2; it writes
JSON for CI; it imports no Django.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from django_idempotency.conformance import (
    CHECK_NAMES,
    Config,
    ConfigError,
    NonConformance,
    assert_conforms,
    run,
)
from django_idempotency.conformance.cli import main
from django_idempotency.conformance.traffic import BudgetExhausted, ForbiddenURL, Sender
from tests.support.conformance_servers import Environ, KeyedOrders, StartResponse, serve

ROOT = Path(__file__).resolve().parents[2]
BODY = '{"item": "widget"}'
PREFIX = "conformance-"


@contextmanager
def orders(*broken: str) -> Iterator[tuple[str, list[tuple[str, str, str | None]]]]:
    """A served :class:`KeyedOrders`; yields its base URL and the requests it got."""
    app = KeyedOrders(*broken)
    seen: list[tuple[str, str, str | None]] = []

    def recording(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        seen.append(
            (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("HTTP_IDEMPOTENCY_KEY"))
        )
        return app(environ, start_response)

    with serve(recording) as base:
        yield base, seen


def cli(*args: str) -> list[str]:
    return [*args, "--replay-delay", "0", "-n", "4", "-H", "Authorization: Token a"]


def test_a_passing_run_exits_0_and_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    with orders() as (base, _):
        code = main(cli(f"{base}/orders", "--json", BODY))

    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"checking POST {base}/orders: at most ")
    assert out.splitlines()[1].split() == ["check", "expected", "observed", "verdict"]
    assert "concurrent-duplicates  1 first answer; the other 3" in out


def test_a_failing_run_exits_1_and_writes_the_json_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_file = tmp_path / "conformance.json"
    with orders("replay_drops_media_type") as (base, _):
        code = main(cli(f"{base}/orders", "--json", BODY, "--json-report", str(report_file)))

    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL replay-headers: the replay does not describe its body" in out
    report = json.loads(report_file.read_text())
    assert report["passed"] is False and report["exit_code"] == 1
    assert [c["name"] for c in report["checks"]] == list(CHECK_NAMES)
    headers = next(c for c in report["checks"] if c["name"] == "replay-headers")
    assert headers["verdict"] == "fail"
    assert headers["observed"] == "Content-Type: 'application/json' then '(absent)'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://127.0.0.1:9/x", "-H", "Authorization"], "a header is written 'Name: value'"),
        (["http://127.0.0.1:9/x", "-X", "GET"], "GET is a safe method"),
        (["ftp://127.0.0.1/x"], "must be an absolute http(s) URL"),
        (["http://127.0.0.1:9/x", "-n", "1"], "N must be 2 to 200"),
        (["http://127.0.0.1:9/x", "-n", "150", "--max-requests", "100"], "above the cap of 100"),
        (["http://127.0.0.1:9/x", "--json", "{not json"], "--json is not JSON"),
        ([], "the endpoint's URL is required"),
    ],
)
def test_bad_options_exit_2_before_anything_is_sent(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_an_endpoint_that_never_answers_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(KeyedOrders()) as base:
        pass  # the port is closed again

    assert main(cli(f"{base}/orders", "--timeout", "2")) == 2
    assert "STOPPED: the endpoint never answered: ConnectError" in capsys.readouterr().out


def test_list_checks_runs_as_a_module_without_django() -> None:
    code = (
        "import sys; sys.modules['django'] = None\n"
        "sys.argv = ['idempotency-conformance', '--list-checks']\n"
        "import runpy; runpy.run_module('django_idempotency.conformance', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == list(CHECK_NAMES)


def test_the_console_script_runs_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["idempotency-conformance"].split(":")

    entry_point = getattr(importlib.import_module(module), function)

    assert entry_point(["--list-checks"]) == 0
    assert capsys.readouterr().out.split() == list(CHECK_NAMES)


def test_importing_the_check_loads_no_django() -> None:
    code = (
        "import sys, django_idempotency.conformance\n"
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_check_says_what_to_install_without_httpx() -> None:
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "try:\n"
        "    import django_idempotency.conformance\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )

    assert "pip install 'django-idempotency[client]'" in done.stdout, done.stderr


def test_the_run_sends_exactly_the_documented_requests() -> None:
    with orders() as (base, seen):
        report = run(
            Config(
                url=f"{base}/orders",
                headers=(("Authorization", "Token a"),),
                concurrency=4,
                replay_delay=0.0,
            )
        )

    assert report.passed, report.table()
    assert report.requests_sent == len(seen) == 4 + 4 + 2 + 1 + 5
    assert {path for _, path, _ in seen} == {"/orders"}
    gets = [key for method, _, key in seen if method == "GET"]
    assert gets[:2] == [None, "a,b"] and gets[2] == gets[3]
    posts = [key for method, _, key in seen if method == "POST"]
    duplicates, replay_and_reuse, bad = posts[:4], posts[4:7], posts[7:]
    assert len(set(duplicates)) == 1 and len(set(replay_and_reuse)) == 1
    assert {*duplicates, *replay_and_reuse} <= {k for k in posts if k and k.startswith(PREFIX)}
    missing, empty, too_long, non_ascii, two_lines = bad
    assert (missing, empty) == (None, "")
    assert too_long is not None and len(too_long) == 256
    assert non_ascii is not None and non_ascii.endswith("-\xc3\xa9")  # UTF-8 read as Latin-1
    assert two_lines is not None and two_lines.count(PREFIX) == 2 and "," in two_lines


def test_a_request_to_another_url_is_never_sent() -> None:
    sent: list[httpx.Request] = []
    config = Config(url="http://api.test/orders", effect_url="http://api.test/count")
    sender = Sender(
        config, transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(200))
    )

    with pytest.raises(ForbiddenURL):
        sender.send("elsewhere", url="http://api.test/admin")

    sender.send("allowed", url="http://api.test/count", method="GET", body=b"")
    assert [str(r.url) for r in sent] == ["http://api.test/count"]


def test_no_request_is_sent_past_the_cap() -> None:
    config = Config(url="http://api.test/orders", concurrency=2, max_requests=20)
    sender = Sender(config, transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    sender.sent = 20

    with pytest.raises(BudgetExhausted, match="stopped after 20 requests: the cap of 20"):
        sender.send("one too many")


def test_a_run_past_its_time_budget_stops_and_exits_2() -> None:
    config = Config(url="http://api.test/orders", concurrency=2, time_budget=30, timeout=5)
    now = [0.0]

    def endpoint(request: httpx.Request) -> httpx.Response:
        if len(answered) == 4:  # the fifth request takes the rest of the budget
            now[0] += 30
        answered.append(request)
        return httpx.Response(200, json={})

    answered: list[httpx.Request] = []
    report = run(config, transport=httpx.MockTransport(endpoint), clock=lambda: now[0])

    assert len(answered) == report.requests_sent == 5
    assert report.exit_code() == 2
    assert report.error == "stopped after 5 requests: the time budget of 30 s ran out"
    assert "STOPPED: stopped after 5 requests" in report.table()
    assert report.result("key-missing").observed == "not run: the run stopped"


def test_effects_counted_by_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = KeyedOrders("cache_then_execute")
    counter = tmp_path / "orders.count"
    counter.write_text("0")

    lock = threading.Lock()

    def counting(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        answer = app(environ, start_response)
        with lock:  # the current count, as a database reads it (never an older one)
            counter.write_text(str(app.executions))
        return answer

    with serve(counting) as base:
        reader = f"cat {counter}"
        code = main(
            cli(f"{base}/orders", "--json", BODY, "--effect-command", reader, "--skip", "in-flight")
        )

    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL concurrent-effects: 4 concurrent duplicates with one key took effect" in out
    assert "replay-effects         the effect counter moves by 1      moved by 1" in out


def test_assert_conforms_raises_with_the_table_for_a_broken_endpoint() -> None:
    with serve(KeyedOrders("crash_on_bad_key")) as base, pytest.raises(NonConformance) as caught:
        assert_conforms(
            f"{base}/orders",
            headers={"Authorization": "Token a"},
            concurrency=3,
            replay_delay=0.0,
            skip=["safe-method"],
        )

    message = str(caught.value)
    assert "key-empty" in message and "FAIL key-empty: an empty Idempotency-Key got 500" in message
    assert caught.value.report.result("safe-method").observed == "skipped (--skip)"


def test_assert_conforms_refuses_an_unbounded_run() -> None:
    with pytest.raises(ConfigError, match="N must be 2 to 200"):
        assert_conforms("http://127.0.0.1:9/orders", concurrency=10_000)


def test_an_effect_counter_that_gives_no_number_stops_the_run() -> None:
    with serve(KeyedOrders()) as base:
        report = run(
            Config(
                url=f"{base}/orders",
                headers=(("Authorization", "Token a"),),
                effect_url=f"{base}/nowhere",
                concurrency=2,
            )
        )

    assert report.exit_code() == 2
    assert report.error == (
        "the effect counter failed: the effect URL answered 404, not 200 and a number"
    )
    assert report.result("concurrent-duplicates").observed == "not run: the run stopped"
