"""``rc run`` (CLI §4): parsed here without click, since importing click dominates start-up."""

from __future__ import annotations

import os

from resource_controller import errors, heap
from resource_controller.cli import basics, exits, render, signals
from resource_controller.client import machine
from resource_controller.client import submit as spec

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

    from resource_controller.client import api

#: Exit codes (CLI-050): interrupted; and contact lost before the job's end was seen.
EXIT_INTERRUPTED = machine.EXIT_INTERRUPTED
EXIT_LOST = machine.EXIT_LOST

SUMMARY = "Lease a device, run a command on it, stream output."
DESCRIPTION = """\
Lease a device (by ID, selector, or any), run COMMAND there and stream its output.

With neither -d nor --select any device will do. rc run waits in the queue while \
nothing suitable is free (saying its position and what it waits for), prints \
"rc: job ID on DEVICE" on stderr once the job starts, streams its output to stdout and \
exits with the job's exit code. --timeout bounds only the wait in the queue; --no-wait \
refuses at once instead of queueing. Stdin is not read unless -i is given; --tty \
attaches this terminal to the job (a shell when no command is given).

--array SPEC submits one job per index at once (each sees RC_ARRAY_INDEX) and waits \
for them all, keeping one status line current; each output line is prefixed \
"[INDEX] ". It exits 0 when every task succeeded, else with the code of the failed \
task with the lowest index, after naming the failed indexes. Ctrl-C cancels the \
queued tasks and leaves the running ones running (rc kill ARRAY_ID stops them).

Ctrl-C while queued cancels the job; Ctrl-C once it runs only detaches: the job keeps \
running and keeps its device (watch it with rc ps). Both exit 130. An outage of the \
controllers is waited out (a submit for 30s, the rest for 5m0s without an answer)."""
EXAMPLES = """\
Examples:
  rc run -- python train.py                      (any device)
  rc run --select 'vram>=40G' -- python train.py
  rc run --select 'model~H100' -- ./train        (model containing H100)
  rc run -d box:gpu1 --timeout 10m -- ./bench
  rc run --after 1b2c3d4e -- python eval.py      (once that job succeeded)
  rc run --select 'vram>=40G' --explain          (what matches; submits nothing)
  rc run --tty -d box:gpu0                       (a shell on that device)
  echo data | rc run -i -- cat                   (stdin forwarded)
  rc run --array 0-99%8 -- python sweep.py       (100 tasks, 8 at once)

Exit status: the job's own code (N mod 256; a multiple of 256 gives 1);
0 when it succeeded; 130 on Ctrl-C or SIGTERM; 75 when rc lost contact with the
controllers before it saw the job end (it says where the result will be: rc jobs,
rc logs ID); 1 for every other failure of rc itself (usage, controller or network
errors, a --no-wait refusal, --timeout) and for --explain when no device matches."""

#: (flags, parameter, kind, metavar, help): every flag of ``rc run``. Kinds: ``flag``
#: (``--x``, ``--x=false``), ``negatable`` (``--x``/``--no-x``, unset by default),
#: ``text``, ``int``, ``duration``, ``list`` (repeatable).
OPTIONS: tuple[tuple[tuple[str, ...], str, str, str, str], ...] = (
    (("-d", "--device"), "device", "text", "DEVICE",
     "Exact device ID (host:name), or a comma list of IDs on one host."),
    (("--select",), "select", "text", "SELECTOR", "Label selector."),
    (("--count",), "count", "int", "N",
     "Devices wanted on one host, all at once (every one must match --select)."),
    (("--explain",), "explain", "flag", "",
     "With --select (and --count): show what matches; submit nothing; exit 1 if nothing does."),
    (("--tty",), "tty", "flag", "",
     "Run under a pseudo-terminal and attach this terminal (no command: a shell)."),
    (("-i", "--interactive"), "interactive", "flag", "",
     "Forward stdin to the job (stdout comes back raw; the job's stderr is kept, not shown)."
     " Without -i (or --tty) stdin is not read: the job's stdin is /dev/null."),
    (("--cwd",), "cwd", "text", "DIR", "Working directory on the device host."),
    (("--here",), "here", "negatable", "",
     "Run in this directory with this shell's PATH, virtualenv and library paths"
     " (default: run.here in the config file)."),
    (("--as",), "as_", "text", "ID", "Submitter identity (default: derived)."),
    (("--priority",), "priority", "int", "INTEGER", "Queue priority (-10..10)."),
    (("--max-runtime",), "max_runtime", "duration", "DURATION", "Wall-clock ceiling."),
    (("--idle-timeout",), "idle_timeout", "duration", "DURATION", "Kill after silence."),
    (("--timeout",), "timeout", "duration", "DURATION", "Give up queueing after."),
    (("--no-wait",), "no_wait", "flag", "", "Refuse at once if the device is not free."),
    (("--env",), "env", "list", "KEY=VALUE", "Job variable."),
    (("--after",), "after", "text", "JOB[,JOB...]",
     "Start only once these jobs (IDs or prefixes) have all succeeded; if one ends"
     " otherwise, this one ends killed (dependency_failed)."),
    (("--after-any",), "after_any", "flag", "", "With --after: once they have ended, however."),
    (("--retries",), "retries", "int", "N",
     "Run again, as the same job, up to N times (0..10) when an attempt ends as --retry-on says."),
    (("--retry-on",), "retry_on", "text", "lost|failed|any",
     "What an attempt's end must be to retry: lost (its host or worker gone; the default),"
     " failed (a non-zero exit), any (either, or killed by anything but a person)."),
    (("--preemptible",), "preemptible", "flag", "",
     "May be stopped (SIGTERM, then SIGKILL after its grace) to make room for a waiting job;"
     " it then queues again."),
    (("--no-requeue",), "no_requeue", "flag", "",
     "With --preemptible: end killed when preempted instead of queueing again."),
    (("--preempt-grace",), "preempt_grace", "duration", "DURATION",
     "With --preemptible: SIGTERM to SIGKILL when preempted (shortens rc serve's)."),
    (("--array",), "array", "text", "SPEC",
     "Run COMMAND once per index, each a job of its own (RC_ARRAY_INDEX): 0-99, 0-99:5"
     " (step), 1,4,9; %N caps how many run at once (0-99%8). Output lines are prefixed"
     " [INDEX]; exits with the lowest failed index's code."),
    (("--output-dir",), "output_dir", "text", "DIR",
     "With --array: write each task's output to DIR/INDEX.log instead of stdout."),
    (("--detach",), "detach", "flag", "",
     "With --array: print the array's ID and return; the tasks run on."),
    (("-o", "--output"), "output", "text", "text|json",
     "With --array: json prints the array (its ID, counts and tasks) and returns."),
)  # fmt: skip
_DEFAULTS: dict[str, Any] = {"text": "", "int": 0, "duration": 0.0, "flag": False}
#: EXT-HERE-2: nothing else is sent, since a job's ``env`` is readable by every client.
HERE_VARIABLES = (
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
)


class _Help(Exception):
    """``-h``/``--help`` on the line: the page, not a run."""


def _lookup(name: str) -> tuple[str, str, bool]:
    """(parameter, kind, negated) of the flag ``name``; a usage error when none has it."""
    for flags, dest, kind, _metavar, _help in OPTIONS:
        if name in flags:
            return dest, kind, False
        if kind == "negatable" and name == "--no-" + flags[0][2:]:
            return dest, kind, True
    raise basics.Failure(f"no such option: {name} (see rc help run)")


def _value(name: str, kind: str, text: str) -> Any:
    if kind == "int":
        number = basics.parse_int(text)
        if number is None:
            raise basics.Failure(f"invalid value for {name}: invalid integer {text!r}")
        return number
    if kind == "duration":
        try:
            return basics.parse_duration(text)
        except ValueError as e:
            raise basics.Failure(f"invalid value for {name}: {e}") from None
    return text


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The flags' values and the job's command, as click would read ``argv``."""
    values: dict[str, Any] = {dest: _DEFAULTS.get(kind) for _f, dest, kind, _m, _h in OPTIONS}
    values.update(count=1, env=[])
    command: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            command.extend(argv[i:])
            break
        if arg[:1] != "-" or arg == "-":
            command.append(arg)
            continue
        if arg in ("-h", "--help"):
            raise _Help
        if arg.startswith("--"):
            pieces = [arg.partition("=")]
        else:  # a cluster of short flags; one taking a value takes the rest
            pieces = []
            for at, letter in enumerate(arg[1:], 1):
                if _lookup("-" + letter)[1] != "flag":
                    rest = arg[at + 1 :]
                    pieces.append(("-" + letter, "=" if rest else "", rest))
                    break
                pieces.append(("-" + letter, "", ""))
        for name, eq, given in pieces:
            dest, kind, negated = _lookup(name)
            if kind in ("flag", "negatable"):
                if eq and given not in basics.TRUE | basics.FALSE:
                    raise basics.Failure(f"invalid boolean value {given!r} for {name}")
                values[dest] = (given not in basics.FALSE if eq else True) != negated
                continue
            if not eq:
                if i >= len(argv):
                    raise basics.Failure(f"option {name} requires an argument")
                given, i = argv[i], i + 1
            if kind == "list":
                values[dest].append(given)
            else:
                values[dest] = _value(name, kind, given)
    return values, command


def page() -> str:
    """``rc run --help``: usage, description, examples, then every flag."""
    import textwrap

    def para(text: str) -> str:
        return textwrap.fill(text, 78, initial_indent="  ", subsequent_indent="  ")

    rows = []
    for flags, _dest, kind, metavar, help_text in (
        *OPTIONS,
        (("-h", "--help"), "", "flag", "", "Show this message and exit."),
    ):
        if kind == "negatable":
            flags = (*flags, "/", "--no-" + flags[0][2:])
        rows.append(
            (
                ", ".join(flags).replace(", /, ", " / ") + (f" {metavar}" if metavar else ""),
                help_text,
            )
        )
    width = max(len(r[0]) for r in rows) + 4
    lines = []
    for left, help_text in rows:
        wrapped = textwrap.wrap(help_text, 78 - width)
        lines.append(f"  {left.ljust(width - 2)}{wrapped[0]}")
        lines.extend(" " * width + more for more in wrapped[1:])
    body = "\n\n".join(para(p) for p in DESCRIPTION.split("\n\n"))
    examples = textwrap.indent(EXAMPLES, "  ")
    return (
        f"Usage: rc run [OPTIONS] [--] COMMAND [ARGS]...\n\n{body}\n\n{examples}\n\n"
        "Options:\n" + "\n".join(lines) + "\n"
    )


def here_env(environ: Any) -> dict[str, str]:
    return {name: environ[name] for name in HERE_VARIABLES if name in environ}


def explain_refusal(device: str) -> str:
    """CLI-101 (3): a pinned device has nothing to match."""
    if device:
        return (
            "--explain previews what a --select selector matches, not -d/--device:"
            " rc describe DEVICE shows whether that device is free and who holds it"
        )
    return "--explain needs --select SELECTOR: it previews what the selector matches"


def build(values: dict[str, Any], command: list[str]) -> spec.Submit:
    """The rest of CLI-101, then the submit."""
    env = basics.parse_env(values["env"])
    here = values["here"]
    if here is None:
        from resource_controller.client import config

        here = config.settings().run_here()
    cwd = values["cwd"]
    if here:
        cwd = cwd or os.getcwd()
        env = {**here_env(os.environ), **env}  # --env wins
    if cwd and not os.path.isabs(cwd):
        # Relative to where rc runs; an absolute DIR is sent as written (EXT-HERE-1).
        cwd = os.path.normpath(os.path.join(os.getcwd(), cwd))
    if values["tty"] and not command:
        from resource_controller.cli.tty import DEFAULT_SHELL

        command = list(DEFAULT_SHELL)  # the job row always shows a command (CLI-103)
    try:
        return spec.Submit(
            command,
            device=values["device"],
            select=values["select"],
            count=values["count"],
            cwd=cwd,
            env=env,
            priority=values["priority"],
            max_runtime=values["max_runtime"],
            idle_timeout=values["idle_timeout"],
            no_wait=values["no_wait"],
            after=values["after"],
            after_any=values["after_any"],
            retries=values["retries"],
            retry_on=values["retry_on"],
            preemptible=values["preemptible"],
            no_requeue=values["no_requeue"],
            preempt_grace=values["preempt_grace"] or None,
            array=values["array"],
            stdio="tty" if values["tty"] else "pipe" if values["interactive"] else "",
            names=spec.CLI,
        )
    except spec.BadSubmit as e:
        raise basics.Failure(str(e)) from None


def run(argv: list[str]) -> int:
    """``rc run ARGV``: its exit code; failures raise ``basics.Failure``."""
    try:
        values, command = parse(argv)
    except _Help:
        render.out(page())
        return 0
    device, select, explain = values["device"], values["select"], values["explain"]
    if not explain and not values["tty"] and not command:
        raise basics.Failure("rc run needs a command (put it after --)")
    if device and select:
        raise basics.Failure("-d/--device and --select cannot be used together")
    try:
        spec.devices(device, select, values["count"], spec.CLI)
    except spec.BadSubmit as e:
        raise basics.Failure(str(e)) from None
    if explain:
        if not select:
            raise basics.Failure(explain_refusal(device))
        from resource_controller.cli import jobs

        jobs.explain(_client(), select, values["count"])
        return 0
    if values["tty"] and values["interactive"]:
        raise basics.Failure("-i and --tty cannot be used together (--tty forwards stdin)")
    if values["array"] or values["output_dir"] or values["detach"] or values["output"]:
        from resource_controller.cli import arrayrun

        arrayrun.check(values)
    wanted = build(values, command)
    client = _client(values["as_"])
    if values["as_"]:
        from resource_controller.cli.whoami import warn_if_replaced

        warn_if_replaced(client, values["as_"])  # EXT-WHO-4
    if values["array"]:
        from resource_controller.cli import arrayrun

        return arrayrun.run(client, wanted, values)
    _run_nested_if_held(client, wanted)
    heap.release()  # the client and its HTTP core are imported
    try:
        ran = client.drive(
            machine.run(
                wanted,
                client.submitter,
                client.monotonic,
                timeout=values["timeout"],
                sink=render.write_bytes,
            ),
            say=render.say,
            relay=lambda job_id, stdio: _relay(client, job_id, stdio),
        )
    except errors.NoDeviceError as e:
        # CLI-104, extended by EXT-WHY-2: name the holder the controller named.
        _, named, why = e.message.partition("the job was not queued: ")
        detail = f": {why}" if named and why else ""
        raise basics.Failure(f"{wanted.target} is busy and could not be queued{detail}") from e
    if ran.message:
        render.say(ran.message)
    return ran.code


def _client(as_flag: str = "") -> api.JsonClient:
    """A client for this invocation; its submitter is resolved once, on first use."""
    from resource_controller.client import api

    return api.JsonClient(submitter=as_flag or None)


def _run_nested_if_held(client: api.JsonClient, wanted: spec.Submit) -> None:
    """EXT-NEST-1; returns only when a new lease is needed."""
    from resource_controller.cli import nest

    held = nest.current_lease(os.environ)
    if held is None:
        return
    device = nest.chosen_device(
        held,
        ",".join(wanted.device_ids) or wanted.device_id,
        wanted.selector,
        lambda s: client.explain(s).get("matching") or [],
    )
    if device is None:
        return
    nest.refuse_limits(held, wanted.max_runtime_seconds, wanted.idle_timeout_seconds)
    nest.exec_command(held, device, wanted.command or [], wanted.cwd, wanted.env)


def _relay(client: api.JsonClient, job_id: str, stdio: str) -> None:
    """RELAY: ``--tty``'s terminal (CLI-117) or ``-i``'s pipes, until the job's output ends."""
    if stdio == "pipe":
        from resource_controller.cli import stdin

        stdin.forward(client, job_id)
        return
    from resource_controller.cli import tty

    try:
        tty.attach(client, job_id)
    except tty.NotATerminal as e:
        # Nobody will type into this shell: kill it rather than hold the device (CLI-116).
        render.say(f"log stream ended: {e}")
        try:
            client.kill(job_id, timeout=machine.CANCEL_BOUND)
        except errors.ClientError as kill_error:
            render.say(f"could not kill job {job_id}: {kill_error}")


def main(argv: list[str]) -> None:
    """``rc run ARGV`` without click, and exit: at once, once the output is flushed."""
    try:
        code = run(argv)
    except (basics.Failure, signals.Interrupted, errors.RcError) as e:
        exits.failed(e)
    except (EOFError, KeyboardInterrupt):
        exits.say_blank_line()
        exits.fail("interrupted")
    except OSError as e:
        exits.os_error_in_command(e)
    exits.leave_now(code)


def __getattr__(name: str) -> Any:
    """``command``: the click command the group lists (built on first use, with click)."""
    if name != "command":
        raise AttributeError(name)
    import click

    class RunCommand(click.Command):
        """Options declared for completion and ``rc help`` only; ``run`` parses the line."""

        def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
            ctx.params = {"argv": list(args)}
            return []

        def get_help(self, ctx: click.Context) -> str:
            return page().rstrip("\n")

    params: list[click.Parameter] = []
    for flags, dest, kind, metavar, help_text in OPTIONS:
        names = [f"{flags[0]}/--no-{flags[0][2:]}", dest] if kind == "negatable" else [*flags, dest]
        flag = kind in ("flag", "negatable")
        params.append(
            click.Option(
                names,
                is_flag=flag,
                multiple=kind == "list",
                metavar=metavar or None,
                help=help_text,
            )
        )

    def invoke(argv: list[str]) -> None:
        code = run(argv)
        if code:
            raise SystemExit(code)

    return RunCommand("run", callback=invoke, params=params, short_help=SUMMARY, help=DESCRIPTION)
