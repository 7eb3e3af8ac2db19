"""What a storm run proves: the promise held or broke, and the clients that gave up.

The promise of idempotency is about what the server did and said: each operation ran
at most once (no phantom worker), and every answer a client got is the stored one (the
worker the operation created). A client that gave up (its retries exhausted on a
loaded machine or a faulty network) broke nothing: the operation is resumed afterwards
with its key, which must give the stored answer or run it once. Only a duplicate or a
wrong answer is a broken promise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .clients import Mode, Tally


@dataclass
class RunResult:
    """One storm run: what the clients saw and what the database holds afterwards."""

    mode: Mode
    operations: int
    jobs: int
    tally: Tally
    faults: dict[str, int]
    #: Worker ids in the database per operation number (as a string).
    stored: dict[str, set[str]]
    seconds: float

    @property
    def workers(self) -> dict[str, int]:
        return {op: len(ids) for op, ids in self.stored.items()}

    @property
    def created(self) -> int:
        return sum(self.workers.values())

    @property
    def phantom(self) -> int:
        """Workers beyond one per operation: an operation that ran more than once."""
        return sum(n - 1 for n in self.workers.values() if n > 1)

    @property
    def missing(self) -> int:
        return self.operations - len(self.stored)

    @property
    def split_answers(self) -> int:
        """Operations whose clients were told of different workers."""
        return sum(1 for ids in self.tally.answers.values() if len(ids) > 1)

    @property
    def wrong_answers(self) -> list[int]:
        """Operations for which a client was told of a worker the database does not
        hold for that operation (an answer that is not the stored one)."""
        wrong = []
        answers = {n: set(ids) for n, ids in self.tally.answers.items()}
        for number, worker_id in self.tally.resumed.items():
            answers.setdefault(number, set()).add(worker_id)
        for number, ids in sorted(answers.items()):
            if not ids <= self.stored.get(str(number), set()):
                wrong.append(number)
        return wrong

    @property
    def clients_gave_up(self) -> int:
        return sum(self.tally.gave_up.values())

    @property
    def unresumed(self) -> list[int]:
        """Operations every client of which gave up and that no resumed client finished."""
        return [n for n in self.tally.abandoned() if n not in self.tally.resumed]


@dataclass
class Verdict:
    """``held``: no broken promise; ``broken`` says what broke; ``notes`` what else."""

    held: bool
    broken: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self, result: RunResult) -> str:
        """The verdict line the storm prints."""
        head = (
            f"idempotency {result.mode}: {result.created} workers for "
            f"{result.operations} operations"
        )
        if not self.held:
            return f"{head} -> BROKEN: {'; '.join(self.broken)}"
        return f"{head} -> held" + (f" ({'; '.join(self.notes)})" if self.notes else "")


def judge(result: RunResult) -> Verdict:
    """The verdict of a run with idempotency on.

    Broken: a phantom worker (an operation ran twice), an operation told of two
    different workers, an answer that is not the stored worker, or an answered
    operation without a worker. Not broken, reported: clients that gave up, and
    whether their operations, resumed with their keys, finished.
    """
    broken = []
    if result.phantom:
        broken.append(f"{result.phantom} phantom workers (an operation ran more than once)")
    if result.split_answers:
        broken.append(f"{result.split_answers} operations told of two different workers")
    if result.wrong_answers:
        broken.append(
            f"{len(result.wrong_answers)} operations answered with a worker that is not "
            f"the stored one (operations {', '.join(map(str, result.wrong_answers[:5]))})"
        )
    notes = []
    if result.clients_gave_up:
        abandoned = result.tally.abandoned()
        resumed = [n for n in abandoned if n in result.tally.resumed]
        notes.append(
            f"{result.clients_gave_up} clients gave up after their retries, not a broken "
            f"promise; {len(abandoned)} operations had no answer, {len(resumed)} of them "
            "resumed with their keys and finished"
        )
    if result.unresumed:
        notes.append(
            f"{len(result.unresumed)} operations not finished even when resumed "
            "(unverified, the machine may be overloaded)"
        )
    return Verdict(held=not broken, broken=broken, notes=notes)
