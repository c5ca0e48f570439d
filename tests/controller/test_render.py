"""The response builders skip validation (``render._new``, and the device views built as
plain objects); these tests hold each of them to what validation would accept and to
the JSON a validated model serializes.

The records come from a real store in every shape ``/v1/state`` shows: devices ready,
held, draining, quarantined and labelled; jobs queued pinned, for any device, several
devices, running with environment, ended with an exit code; and each queued job's
``waiting_for``.
"""

from __future__ import annotations

from typing import Any

import pydantic

from resource_controller import wire
from resource_controller.clock import FakeClock
from resource_controller.controller import render
from resource_controller.store.facade import Store
from support import store_helpers

#: The root conftest's ``make`` factory (``tests/conftest.py``; this directory's conftest
#: shadows that module name for the type checker).
Factory = Any


def _same_as_validated(model: pydantic.BaseModel) -> str:
    """Validate the built model's fields afresh and compare both serializations."""
    built = model.model_dump_json(exclude_none=True)
    again = type(model).model_validate(model.model_dump())
    assert again.model_dump_json(exclude_none=True) == built
    assert again == model
    return built


def _body_as_validated(body: dict[str, Any]) -> str:
    """A device view built as a plain object: the wire model validates it (no unknown
    field: ``extra`` is forbidden on responses) and serializes the very same JSON, so
    nothing it omits is a field the model would write, and nothing is out of order."""
    built = render.json_body(body).decode()
    model = wire.DeviceView.model_validate(body)
    assert model.model_dump_json(exclude_none=True) == built
    assert model.model_dump(mode="json", exclude_none=True) == body
    return built


def _fleet(store: Store, make: Factory, clock: FakeClock) -> None:
    [gpu0, gpu1, gpu2, gpu3] = make.worker(devices=4, max_runtime_seconds=3600)
    store.devices.apply_facts(
        "box", ["gpu0"], {"gpu0": {"vram": "80G"}}, {"gpu0": {"rack": "a"}}, None, None
    )
    make.start(device=gpu0, env={"A": "1"}, priority=3, max_runtime_seconds=60)
    make.start(device=gpu1)
    store.devices.drain(gpu2, "ops", "maintenance")
    store.devices.set_state(gpu3, "unhealthy", "probe failed: ecc")
    clock.advance(5)
    make.submit(device=gpu0, idempotency_key="k1")
    make.submit(selector="vram>=40G", priority=-2)
    make.submit()
    make.submit(device_ids=(gpu0, gpu1), count=2)
    store.queue.run_pass()


def test_every_builder_gives_what_validation_would(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    _fleet(store, make, clock)
    snaps, active, queued, waits = store.views.state_view()
    assert len(snaps) == 4 and len(active) == 2 and len(queued) == 4
    views = [_body_as_validated(render.device_view_body(s, store.now())) for s in snaps]
    assert any('"draining":true' in v for v in views)
    assert any('"holder":"alice","job_id":' in v and '"command":["train"]' in v for v in views)
    assert any('"quarantine_reason":"probe failed: ecc"' in v for v in views)
    assert any('"labels":[' in v for v in views)
    for job in [*active, *queued]:
        _same_as_validated(render.job(job))
    entries = [e for j in queued for e in render.waiting_for(waits.get(j.id, []))]
    assert entries, "the queued jobs wait for held devices"
    for entry in entries:
        _same_as_validated(entry)


def test_an_ended_job_renders_as_validated(store: Store, make: Factory) -> None:
    [dev, _] = make.worker()
    job = make.start(device=dev)
    store_helpers.release(store, job.id, "failed", 3, "exit status 3")
    _same_as_validated(render.job(store.views.job(job.id)))
