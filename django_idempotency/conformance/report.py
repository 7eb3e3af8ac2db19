"""The outcome of a run: one row per check, as a table for people and JSON for CI."""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["pass", "fail", "warn", "skip"]

#: What each verdict means, for the table's legend and the JSON.
VERDICTS: dict[str, str] = {
    "pass": "the endpoint keeps the promise",
    "fail": "the endpoint breaks it (the detail says how)",
    "warn": "kept, but not as the IETF draft recommends, or the check was inconclusive",
    "skip": "not run (skipped, or its input was not given)",
}


@dataclass(frozen=True)
class CheckResult:
    """One row of the report.

    Attributes:
        name: the check (``"replay-body"``).
        expected: what a conforming endpoint answers.
        observed: what this one answered.
        verdict: ``"pass"``, ``"fail"``, ``"warn"`` or ``"skip"``.
        detail: for a fail or a warn, what is wrong and what it means; else ``""``.
    """

    name: str
    expected: str
    observed: str
    verdict: Verdict
    detail: str = ""


@dataclass
class Report:
    """Every check's result, and what the run sent.

    Attributes:
        url: the endpoint checked.
        method: its method.
        results: one per check, in the order they ran.
        requests_sent: requests sent, effect reads included.
        seconds: how long the run took.
        error: why the run stopped early (the cap, the deadline, an unreachable
            endpoint), or ``""``.
    """

    url: str
    method: str
    results: list[CheckResult] = field(default_factory=list)
    requests_sent: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def failures(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if r.verdict == "fail"]

    @property
    def passed(self) -> bool:
        """No check failed and the run was not cut short."""
        return not self.failures and not self.error

    def result(self, name: str) -> CheckResult:
        """The result of the check ``name``.

        Raises:
            KeyError: no such check in this report.
        """
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def exit_code(self) -> int:
        """0: every check passed (or warned, or was skipped); 1: a check failed; 2: stopped."""
        if self.error:
            return 2
        return 1 if self.failures else 0

    def as_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (the ``--json`` file)."""
        return {
            "url": self.url,
            "method": self.method,
            "passed": self.passed,
            "exit_code": self.exit_code(),
            "requests_sent": self.requests_sent,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "checks": [asdict(r) for r in self.results],
        }

    def write_json(self, path: str) -> None:
        """Write :meth:`as_json` to ``path`` (UTF-8, indented)."""
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.as_json(), file, indent=2)
            file.write("\n")

    def table(self, width: int = 100) -> str:
        """The report as a text table (check, expected, observed, verdict), then details."""
        rows = [("check", "expected", "observed", "verdict")]
        rows += [(r.name, r.expected, r.observed, r.verdict.upper()) for r in self.results]
        name_w = max(len(r[0]) for r in rows)
        verdict_w = 7
        rest = max(30, width - name_w - verdict_w - 6)
        exp_w, obs_w = rest // 2, rest - rest // 2
        lines: list[str] = []
        for number, (name, expected, observed, verdict) in enumerate(rows):
            exp = textwrap.wrap(expected, exp_w) or [""]
            obs = textwrap.wrap(observed, obs_w) or [""]
            for i in range(max(len(exp), len(obs))):
                cells = (
                    name if i == 0 else "",
                    exp[i] if i < len(exp) else "",
                    obs[i] if i < len(obs) else "",
                    verdict if i == 0 else "",
                )
                lines.append(
                    f"{cells[0]:<{name_w}}  {cells[1]:<{exp_w}}  {cells[2]:<{obs_w}}  "
                    f"{cells[3]}".rstrip()
                )
            if number == 0:
                lines.append("-" * min(width, name_w + exp_w + obs_w + verdict_w + 6))
        explained = [r for r in self.results if r.detail and r.verdict in ("fail", "warn")]
        if explained:
            lines.append("")
        for result in explained:
            lines.extend(
                textwrap.wrap(
                    f"{result.verdict.upper()} {result.name}: {result.detail}",
                    width,
                    subsequent_indent="    ",
                )
            )
        lines.append("")
        counts = {v: sum(r.verdict == v for r in self.results) for v in VERDICTS}
        summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        lines.append(
            f"{self.method} {self.url}: {summary}; {self.requests_sent} requests in "
            f"{self.seconds:.1f} s"
        )
        if self.error:
            lines.append(f"STOPPED: {self.error}")
        return "\n".join(lines)
