"""``GET /metrics``: state gauges read at scrape time, never a tally that could drift."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from resource_controller.core.states import DeviceState, JobState
from resource_controller.store.usage import PairTotals
from resource_controller.store.views import PREEMPTIONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400)
_PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

Counts = tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]

#: EXT-ACCT-3's series cover the pairs that held a device in the last seven days.
PAIRS_WITHIN = 7 * 86_400


class _State(Collector):
    """Yields the gauges of the last store read (set just before each scrape renders)."""

    def __init__(self) -> None:
        self.counts: Counts = ({}, {}, {}, {})
        self.now = 0.0
        self.pairs: Sequence[PairTotals] = ()

    def collect(self) -> Iterator[Metric]:
        devices, jobs, beats, held = self.counts
        d = GaugeMetricFamily("rc_devices", "Devices by state.", labels=["state"])
        for state in DeviceState:
            d.add_metric([state.value], devices.get(state.value, 0))
        yield d
        j = GaugeMetricFamily("rc_jobs", "Jobs in the store by state.", labels=["state"])
        for js in JobState:
            j.add_metric([js.value], jobs.get(js.value, 0))
        yield j
        yield GaugeMetricFamily(
            "rc_queue_depth", "Jobs waiting in the queue.", value=jobs.get(JobState.QUEUED, 0)
        )
        yield CounterMetricFamily(
            "rc_preemptions",
            "Attempts preemption ended (EXT-PREEMPT-3), as the job rows count them.",
            value=jobs.get(PREEMPTIONS, 0),
        )
        h = GaugeMetricFamily(
            "rc_heartbeat_age_seconds",
            "Seconds since each worker host was last heard from.",
            labels=["host"],
        )
        for host, at in sorted(beats.items()):
            h.add_metric([host], self.now - at)
        yield h
        s = GaugeMetricFamily(
            "rc_submitter_devices_held",
            "Devices each submitter holds now, holds and every device of a gang counted,"
            " under the name its submitter limit counts them.",
            labels=["submitter"],
        )
        for name, n in sorted(held.items()):
            s.add_metric([name], n)
        yield s
        held_seconds = CounterMetricFamily(
            "rc_device_held_seconds",
            "Seconds a device was held by a submitter's ended leases (EXT-ACCT-3).",
            labels=["device", "submitter"],
        )
        util = GaugeMetricFamily(
            "rc_job_gpu_util",
            "Mean GPU utilisation (percent) of the latest job on a device by a submitter"
            " that measured one (EXT-ACCT-1, EXT-ACCT-3).",
            labels=["device", "submitter"],
        )
        for p in self.pairs:
            held_seconds.add_metric([p.device_id, p.submitter], p.held_seconds)
            if p.last_util is not None:
                util.add_metric([p.device_id, p.submitter], p.last_util)
        yield held_seconds
        yield util


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.state = _State()
        r.register(self.state)
        self.submit_to_start = Histogram(
            "rc_submit_to_start_seconds",
            "From submit to the job's hand-out to its worker.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.schedule_pass = Histogram(
            "rc_scheduling_pass_seconds", "One scheduling pass.", buckets=_PASS_BUCKETS, registry=r
        )
        self.sweep = Histogram(
            "rc_sweep_seconds", "One reaper sweep.", buckets=_PASS_BUCKETS, registry=r
        )
        self.webhook_delivered = Counter(
            "rc_webhook_deliveries", "Webhook events delivered.", ["event"], registry=r
        )
        self.webhook_dropped = Counter(
            "rc_webhook_drops",
            "Webhook events dropped (queue_full, failed, shutdown).",
            ["event", "reason"],
            registry=r,
        )
        #: Observed by dispatch for every request under its route's template (``unmatched`` for
        #: none).
        self.http = Histogram(
            "rc_http_request_duration_seconds",
            "HTTP request durations by route template.",
            ["method", "route"],
            registry=r,
        )

    def render(self, counts: Counts, now: float, pairs: Sequence[PairTotals] = ()) -> bytes:
        self.state.counts = counts
        self.state.now = now
        self.state.pairs = pairs
        return generate_latest(self.registry)
