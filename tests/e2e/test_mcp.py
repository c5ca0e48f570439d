"""``rc mcp`` driven over stdio by the MCP SDK's own client (EXT-MCP-1).

A real ``rc serve`` and ``rc worker``; ``rc mcp`` started by ``mcp.client.stdio``
with the same environment an agent's host would give it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from resource_controller.version import installed_version

from .cluster import RC, Cluster, free_port, stop, wait_for

TOOLS = {
    "devices",
    "describe",
    "explain",
    "run",
    "submit",
    "logs",
    "kill",
    "hold",
    "release",
    "usage",  # EXT-ACCT-2
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path_factory.mktemp("mcp"), port=free_port())
    try:
        c.start_controller()
        c.start_worker("box", ["gpu0", "gpu1"])
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)


def structured(result: Any) -> Any:
    """A tool result's JSON: the structured content, else the text block parsed."""
    assert not result.is_error, result.content
    if result.structured_content is not None:
        data = result.structured_content
        return data.get("result", data) if set(data) == {"result"} else data
    return json.loads(text_of(result))


def text_of(result: Any) -> str:
    """The first text block of a tool result."""
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


def session(fleet: Cluster, **env: str) -> StdioServerParameters:
    base = {k: v for k, v in fleet.env(**env).items() if k.startswith(("RC_", "PATH", "HOME"))}
    return StdioServerParameters(command=RC, args=["mcp"], env=base)


def test_an_agent_lists_the_tools_and_runs_a_command(fleet: Cluster, tmp_path: Path) -> None:
    transcript: dict[str, Any] = {}

    async def main() -> None:
        async with (
            stdio_client(session(fleet)) as (read, write),
            ClientSession(read, write) as s,
        ):
            init = await s.initialize()
            assert init.server_info.name == "resource-controller"
            listed = await s.list_tools()
            names = {t.name for t in listed.tools}
            assert names == TOOLS
            run_tool = next(t for t in listed.tools if t.name == "run")
            assert "argv" in run_tool.input_schema["properties"]
            transcript["tools"] = [
                {"name": t.name, "arguments": sorted(t.input_schema.get("properties", {}))}
                for t in listed.tools
            ]

            ok = await s.call_tool("run", {"argv": ["sh", "-c", "echo hello from $RC_DEVICE"]})
            done = structured(ok)
            transcript["run"] = {"arguments": {"argv": ["sh", "-c", "echo hello from $RC_DEVICE"]}}
            transcript["run"]["result"] = done
            assert done["exit_code"] == 0 and done["state"] == "succeeded"
            assert done["output"] == f"hello from {done['device_id']}\n"
            assert done["device_id"] in ("box:gpu0", "box:gpu1")

            failed = structured(
                await s.call_tool(
                    "run", {"argv": ["sh", "-c", "seq 1 2000; exit 5"], "tail_bytes": 10}
                )
            )
            assert failed["exit_code"] == 5 and failed["state"] == "failed"
            assert failed["output"] == "1999\n2000\n" and failed["truncated"] is True
            assert failed["output_bytes"] > 8000

            devices = structured(await s.call_tool("devices", {}))
            assert [d["id"] for d in devices] == ["box:gpu0", "box:gpu1"]
            assert structured(await s.call_tool("describe", {"device_id": "box:gpu0"}))["id"]
            assert (
                structured(await s.call_tool("explain", {"selector": "host=box"}))["queue_depth"]
                == 0
            )

            started = structured(
                await s.call_tool("submit", {"argv": ["sh", "-c", "echo bg; sleep 300"]})
            )
            job_id = started["job_id"]
            await asyncio.to_thread(
                wait_for, lambda: b"bg" in fleet_log(fleet, job_id), 20, "the job's output"
            )
            seen = structured(await s.call_tool("logs", {"job_id": job_id}))
            assert seen["output"] == "bg\n" and seen["done"] is False

            # The ownership rule of the CLI: another identity may not end it (CLI-131).
            async with (
                stdio_client(session(fleet, RC_SUBMITTER="someone-else")) as (r2, w2),
                ClientSession(r2, w2) as other,
            ):
                await other.initialize()
                refused = await other.call_tool("kill", {"job_id": job_id})
                assert refused.is_error
                assert "not_job_owner: " in text_of(refused)

            assert structured(await s.call_tool("kill", {"job_id": job_id}))["kill_requested"]
            ended = structured(await s.call_tool("logs", {"job_id": job_id, "wait_seconds": 30}))
            assert ended["done"] is True and ended["state"] == "killed"

            granted = structured(
                await s.call_tool(
                    "hold", {"ttl_seconds": 600, "reason": "agent test", "device": "box:gpu1"}
                )
            )
            assert granted["device_ids"] == ["box:gpu1"]
            assert granted["cuda_visible_devices"] == "1" and granted["epoch"] > 0
            gone = structured(await s.call_tool("release", {"job_id": granted["job_id"]}))
            assert gone["released"] is True

            bad = await s.call_tool("run", {"argv": ["true"], "device": "box:gpu9"})
            assert bad.is_error and "unknown_device: " in text_of(bad)

            # EXT-ACCT-2: the jobs above that ended (the released hold may still be
            # ending), by submitter; a bad window names itself.
            used = structured(await s.call_tool("usage", {"since": "1d"}))
            assert used["by"] == "submitter" and used["total"]["jobs"] >= 3
            assert [g["group"] for g in used["groups"]] == ["tester"]
            wrong = await s.call_tool("usage", {"since": "a week"})
            assert wrong.is_error and "since: " in text_of(wrong)

    asyncio.run(main())
    (tmp_path / "transcript.json").write_text(json.dumps(transcript, indent=2))
    if os.environ.get("RC_MCP_TRANSCRIPT"):
        Path(os.environ["RC_MCP_TRANSCRIPT"]).write_text(json.dumps(transcript, indent=2))
    wait_for(lambda: all_free(fleet), 20, "every device to be free again")


def fleet_log(fleet: Cluster, job_id: str) -> bytes:
    out = subprocess.run(
        [RC, "logs", job_id], env=fleet.env(), capture_output=True, timeout=20, check=False
    )
    return out.stdout


def all_free(fleet: Cluster) -> bool:
    status, state = fleet.api("GET", "/v1/state")
    return status == 200 and not any(v.get("job_id") for v in state["devices"])


def test_without_the_sdk_rc_mcp_says_what_to_install(fleet: Cluster, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "mcp.py").write_text("raise ImportError(\"No module named 'mcp'\")\n")
    out = fleet.rc("mcp", PYTHONPATH=str(shadow))
    assert out.returncode == 1, out
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    # The ways that work before the package is on an index come first: this checkout
    # (rc runs from it, editable) and a wheel built from it, each with rc's own Python.
    checkout = Path(__file__).resolve().parents[2]
    wheel = f"dist/resource_controller-{installed_version()}-py3-none-any.whl"
    python = Path(RC).read_text().splitlines()[0].removeprefix("#!")  # what runs rc
    pip = f"{python} -m pip install"
    assert f"{pip} -e '{checkout}[mcp]'" in out.stderr, out.stderr
    assert f"{pip} '{wheel}[mcp]'" in out.stderr, out.stderr
    assert f"{pip} 'resource-controller[mcp]'" in out.stderr, out.stderr
