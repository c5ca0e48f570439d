"""``JsonClient``: the blocking driver of the client's operations, and what ``rc`` calls;
results are the controller's JSON as plain dicts, which ``-o json`` prints verbatim."""

from __future__ import annotations

import time

from resource_controller import errors
from resource_controller.client import calls, config, waits
from resource_controller.client.calls import Call, JoinRelay, Json, Note, Out, PolledJob

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator, Sequence
    from typing import Any, TypeVar

    # Imported when a JsonClient first needs it: h11 pulls in typing and dataclasses,
    # and every command's --help would pay for it otherwise.
    from resource_controller.client import transport
    from resource_controller.client.calls import Op

    R = TypeVar("R")

__all__ = ["Json", "JsonClient", "PolledJob"]


def _view_id(view: Json) -> str:
    device = view.get("device")
    return str(device.get("id") or "") if isinstance(device, dict) else ""


class JsonClient:
    """Talk to one controller (or a fail-over list) with one token, as the current user."""

    def __init__(
        self,
        controller: str | None = None,
        token: str | None = None,
        *,
        submitter: str | None = None,
        settings: config.ClientSettings | None = None,
        http: transport.Transport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings or config.settings()
        if http is None:
            from resource_controller.client import transport

            url, tok, origin, hint = self._settings.connection(controller, token)
            http = transport.Transport(url, tok, origin=origin, missing_token=hint)
        self._http = http
        self._submitter = submitter
        self._sleep = sleep
        self.monotonic = monotonic
        #: The Python API holds SIGINT back while a submit's answer is on its way.
        self.hold_interrupts = False
        self._pending: BaseException | None = None

    @property
    def submitter(self) -> str:
        if self._submitter is None:
            self._submitter = self._settings.submitter()
        return self._submitter

    def close(self) -> None:
        self._http.close()

    def relay_target(self) -> tuple[str, str]:
        return self._http.base_url, self._http.token

    def __enter__(self) -> JsonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drive(
        self,
        op: Op[R] | Call,
        *,
        out: Callable[[bytes], object] | None = None,
        say: Callable[[str], object] | None = None,
        relay: Callable[[str, str], object] | None = None,
    ) -> R:
        """Carry ``op`` out and return what it returns."""
        steps = self._steps(op, out or _refuse_output, say, relay)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def iterate(self, op: Op[Any]) -> Iterator[bytes]:
        steps = self._steps(op, None, None, None)
        for step in steps:
            yield step.chunk

    def _steps(
        self,
        op: Op[R] | Call,
        out: Callable[[bytes], object] | None,
        say: Callable[[str], object] | None,
        relay: Callable[[str, str], object] | None,
    ) -> Generator[Out, None, R]:
        streams: list[transport.Stream] = []
        value: Any = None
        thrown: BaseException | None = None
        if isinstance(op, Call):
            result: R = self._do(op, streams, out, say, relay)
            return result
        try:
            while True:
                try:
                    step = op.send(value) if thrown is None else op.throw(thrown)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                value = thrown = None
                if self._pending is not None:  # held back during the last step: lands here
                    thrown, self._pending = self._pending, None
                    continue
                try:
                    if isinstance(step, Out) and out is None:
                        yield step
                    else:
                        value = self._do(step, streams, out, say, relay)
                except GeneratorExit:
                    raise
                except BaseException as e:  # errors and interrupts: the operation decides
                    thrown = e
        finally:
            for stream in streams:
                stream.close()

    def _do(
        self,
        step: Any,
        streams: list[transport.Stream],
        out: Callable[[bytes], object] | None,
        say: Callable[[str], object] | None,
        relay: Callable[[str, str], object] | None,
    ) -> Any:
        if isinstance(step, Call):
            try:
                if step.shield and self.hold_interrupts:
                    return self._held_back(step)
                return self._http.request(step)
            except errors.ApiError as e:
                raise e if step.refuse is None else step.refuse(e) from e
        if isinstance(step, calls.Sleep):
            self._sleep(step.seconds)
        elif isinstance(step, calls.Read):
            return step.stream.read(step.idle)
        elif isinstance(step, calls.Open):
            streams.append(self._http.stream(step.call))
            return streams[-1]
        elif isinstance(step, calls.Close):
            step.stream.close()
        elif isinstance(step, calls.Where):
            return self._http.base_url
        elif isinstance(step, Out):
            assert out is not None
            out(step.chunk)
        elif isinstance(step, Note):
            if say is not None:
                say(step.text)
        elif isinstance(step, JoinRelay):
            if relay is None:
                raise errors.ClientError(f"job {step.job_id}: stdio {step.stdio!r} needs rc")
            relay(step.job_id, step.stdio)
        else:  # pragma: no cover - every step is one of the above
            raise TypeError(f"not a step: {step!r}")
        return None

    def _held_back(self, call: Call) -> Any:
        """SIGINT held back until the submit's answer is in, so the job it created is known
        and can be cancelled."""
        import signal
        import threading

        if (
            threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        ):
            return self._http.request(call)
        seen: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
        try:
            answer = self._http.request(call)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if seen:
            self._pending = KeyboardInterrupt()
        return answer

    def submit(self, command: Sequence[str] | None, **fields: Any) -> Json:
        """Submit once, with no waiting out an outage (``rc cp``)."""
        from resource_controller.client.submit import Submit

        wanted = Submit(command, **fields)
        after = self.drive(calls.resolve_all(wanted.after))
        job: Json = self.drive(calls.submit(wanted, self.submitter, after))
        return job

    def get_job(self, job_id: str, *, timeout: float | None = None) -> PolledJob:
        view: PolledJob = self.drive(calls.get_job(job_id, timeout))
        return view

    def kill(
        self, job_id: str, *, submitter: str | None = None, timeout: float | None = None
    ) -> None:
        self.drive(calls.kill(job_id, self.submitter if submitter is None else submitter, timeout))

    def jobs(
        self, *, device: str = "", limit: int = 0, state: str = "", submitter: str = ""
    ) -> list[Json]:
        found: list[Json] = self.drive(
            calls.jobs(device=device, limit=limit, state=state, submitter=submitter)
        )
        return found

    def get_array(self, array_id: str, *, timeout: float | None = None) -> Json:
        """EXT-ARRAY-3: the array's counts and its tasks in index order."""
        found: Json = self.drive(calls.get_array(array_id, timeout))
        return found

    def resolve_job_id(self, given: str) -> str:
        found: str = self.drive(calls.resolve(given))
        return found

    def follow_logs(
        self, job_id: str, *, follow: bool | None = None, offset: int = 0
    ) -> transport.Stream:
        return self._http.stream(calls.logs(job_id, follow=follow, offset=offset))

    def output(self, job_id: str) -> Iterator[bytes]:
        return self.iterate(waits.follow(job_id, self.monotonic, waits.QUIET))

    def wait_until_scheduled(self, job_id: str, *, deadline: float | None = None) -> Json:
        """Poll until the job leaves the queue (CLI-077); it may have ended without starting."""
        wait = waits.Wait(job_id, now=self.monotonic(), deadline=deadline)
        view: PolledJob = self.drive(waits.until(wait, self.monotonic))
        return view.job

    def wait_until_terminal(self, job_id: str, *, bound: float | None = None) -> Json:
        now = self.monotonic()
        deadline = None if bound is None else now + bound
        wait = waits.Wait(job_id, terminal=True, now=now, deadline=deadline, bound=bound)
        view: PolledJob = self.drive(waits.until(wait, self.monotonic))
        return view.job

    def state(self, *, timeout: float | None = None) -> Json:
        found: Json = self.drive(calls.state(timeout))
        return found

    def explain(self, selector: str) -> Json:
        found: Json = self.drive(calls.explain(selector, self.submitter))
        return found

    def describe(self, device_id: str) -> Json:
        found: Json = self.drive(calls.describe(device_id))
        return found

    def usage(self, since: str = "", by: str = "", limit: int = 0) -> Json:
        found: Json = self.drive(calls.usage(since, by, limit))
        return found

    def whoami(self) -> Json:
        found: Json = self.drive(calls.whoami())
        return found

    def device_action(self, device_id: str, action: str, body: Any = None) -> Any:
        return self.drive(calls.device_action(device_id, action, body))

    def wait_idle(
        self, device_ids: Sequence[str], *, on_wait: Callable[[list[Json]], None] | None = None
    ) -> None:
        """Return once none of ``device_ids`` has a live lease (``rc drain --wait``);
        ``on_wait`` hears the views still held whenever that set changes."""
        wanted = set(device_ids)
        failures = 0
        last: set[tuple[str, str]] | None = None
        while True:
            try:
                views = self.state(timeout=waits.SCHEDULED_POLL_TIMEOUT).get("devices") or []
                failures = 0
            except errors.TransportError as e:  # a refusal (ApiError) is final at once
                failures += 1
                if failures >= waits.SCHEDULED_GIVE_UP:
                    raise waits.PollGiveUp(f"gave up waiting for devices to go idle: {e}") from e
                self._sleep(waits.POLL_INTERVAL)
                continue
            held = [
                v for v in views if _view_id(v) in wanted and (v.get("holder") or v.get("job_id"))
            ]
            if not held:
                return
            now = {(_view_id(v), str(v.get("job_id") or v.get("holder") or "")) for v in held}
            if now != last and on_wait is not None:
                on_wait(held)
            last = now
            self._sleep(waits.POLL_INTERVAL)


def _refuse_output(chunk: bytes) -> None:
    raise errors.ClientError("this operation's output has nowhere to go")
