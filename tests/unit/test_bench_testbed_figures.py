"""The benchmark's figures of the testbed itself: the API server's own time to serve each kind of
request between two scrapes of its metrics (bucket-interpolated percentiles), how busy the
machine was per phase, and the lines that print them. Inputs are built by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import compare, report
from bench.samples import Mark, api_metrics, host_cpu, latency_between, quantile

PUT_STATUS = (
    'group="workload.codeflare.dev",resource="appwrappers",scope="resource",subresource="status",'
    'verb="PUT",version="v1beta2"'
)
LIST_PODS = 'group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"'
WATCH_PODS = 'group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"'


def _buckets(labels: str, dry_run: str, counts: dict[str, int]) -> list[str]:
    series = f'apiserver_request_duration_seconds_bucket{{component="apiserver",dry_run="{dry_run}",{labels}'
    return [f'{series},le="{le}"}} {n}' for le, n in counts.items()]


METRICS = "\n".join(
    [
        "# TYPE apiserver_request_total counter",
        f'apiserver_request_total{{code="200",component="apiserver",{PUT_STATUS}}} 40',
        f'apiserver_request_total{{code="409",component="apiserver",{PUT_STATUS}}} 2',
        f'apiserver_request_total{{code="200",component="apiserver",{LIST_PODS}}} 7',
        "# TYPE apiserver_request_duration_seconds histogram",
        *_buckets(PUT_STATUS, "", {"0.005": 0, "0.025": 20, "0.05": 40, "+Inf": 42}),
        f'apiserver_request_duration_seconds_sum{{component="apiserver",dry_run="",{PUT_STATUS}}} 1.0',
        f'apiserver_request_duration_seconds_count{{component="apiserver",dry_run="",{PUT_STATUS}}} 42',
        *_buckets(PUT_STATUS, "All", {"0.005": 1, "0.025": 1, "0.05": 1, "+Inf": 1}),
        *_buckets(WATCH_PODS, "", {"0.005": 0, "+Inf": 9}),
        "",
    ]
)


def test_one_scrape_gives_request_counts_and_duration_buckets_per_verb_and_resource() -> None:
    requests, durations = api_metrics(METRICS)
    assert requests == {"PUT appwrappers/status": 42.0, "LIST pods": 7.0}
    # Series that differ in labels other than verb and resource are summed, bucket by bucket.
    assert durations == {"PUT appwrappers/status": {0.005: 1.0, 0.025: 21.0, 0.05: 41.0, math.inf: 43.0}}
    # A watch's "duration" is how long it stayed open: not a time to serve.
    assert not any(key.startswith("WATCH") for key in durations)


def test_quantiles_interpolate_within_their_bucket() -> None:
    buckets = {0.01: 50.0, 0.1: 90.0, 1.0: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.25, buckets) == pytest.approx(0.005)  # half-way into the first bucket
    assert quantile(0.7, buckets) == pytest.approx(0.01 + 0.09 * 20 / 40)
    assert quantile(0.99, buckets) == pytest.approx(0.1 + 0.9 * 9 / 10)


def test_a_quantile_in_the_open_bucket_is_the_largest_bound_and_none_without_observations() -> None:
    assert quantile(0.99, {0.05: 1.0, 0.1: 2.0, math.inf: 10.0}) == 0.1
    assert quantile(0.5, {0.05: 0.0, math.inf: 0.0}) is None
    assert quantile(0.5, {}) is None


@given(
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
    st.floats(min_value=0.01, max_value=1.0),
)
def test_a_quantile_lies_within_the_bucket_holding_its_rank(counts: list[int], q: float) -> None:
    bounds = [0.005 * 2**i for i in range(len(counts))]
    cumulative: dict[float, float] = {}
    total = 0
    for bound, n in zip(bounds, counts, strict=True):
        total += n
        cumulative[bound] = float(total)
    cumulative[math.inf] = float(total)
    value = quantile(q, cumulative)
    if total == 0:
        assert value is None
        return
    assert value is not None
    rank = q * total
    holding = next(b for b in bounds if cumulative[b] >= rank)
    below = max((b for b in bounds if b < holding), default=0.0)
    assert below <= value <= holding


def test_latency_between_two_scrapes_counts_only_what_was_served_in_between() -> None:
    before = {
        "PUT appwrappers/status": {0.025: 100.0, 0.05: 100.0, math.inf: 100.0},
        "DELETE pods": {0.025: 5.0, 0.05: 5.0, math.inf: 5.0},
    }
    after = {
        "PUT appwrappers/status": {0.025: 110.0, 0.05: 130.0, math.inf: 130.0},
        "DELETE pods": {0.025: 10.0, 0.05: 10.0, math.inf: 10.0},
        "POST events": {0.025: 40.0, 0.05: 40.0, math.inf: 40.0},
    }
    got = latency_between(before, after, min_count=20)
    # Most frequent first; DELETE pods (5 in between) is under the minimum.
    assert list(got) == ["POST events", "PUT appwrappers/status"]
    put = got["PUT appwrappers/status"]
    assert put["count"] == 30
    # 10 of the 30 within 25 ms, the other 20 between 25 and 50 ms.
    assert put["p50_ms"] == pytest.approx(25 + 25 * 5 / 20, abs=0.1)
    assert put["p99_ms"] == pytest.approx(25 + 25 * 19.7 / 20, abs=0.1)


def _mark(phase: str, busy: float, total: float) -> Mark:
    return Mark(phase, 0.0, {}, (busy, total))


def test_host_busy_is_the_share_of_all_cores_each_phase_kept_busy() -> None:
    marks = [_mark("start", 100, 1000), _mark("setup", 700, 1800), _mark("idle", 720, 2800)]
    assert report.host_busy(marks) == {"setup": 75.0, "idle": 2.0}
    # Marks without host readings (a result's marks made before these existed) give no figure.
    assert report.host_busy([_mark("start", 0, 0), _mark("setup", 0, 0)]) == {"setup": None}


def test_host_cpu_reads_this_machine() -> None:
    busy, total = host_cpu()
    assert 0 < busy < total


def _result() -> dict[str, Any]:
    return {
        "cost": {
            "host_busy_percent": {"setup": 96.4, "faults": 71.0},
            "testbed_cpu_phases_s": {"kube-apiserver": {"setup": 60.25, "faults": 30.0}},
        },
        "faults": {
            "api_server_latency": {
                "PUT appwrappers/status": {"count": 830.0, "p50_ms": 21.3, "p90_ms": 44.0, "p99_ms": 92.5}
            }
        },
    }


def test_testbed_lines_show_the_machine_the_testbed_and_the_api_servers_latency() -> None:
    lines = report.testbed_lines(_result())
    assert lines[0] == "machine busy per phase (% of all its cores): setup 96 %, faults 71 %"
    assert "kube-apiserver CPU per phase: setup 60.2 s, faults 30.0 s" in lines[1]
    assert lines[-1] == "  PUT appwrappers/status: 830: 21.3 / 44.0 / 92.5"
    # A result saved before these figures existed has none to show.
    assert report.testbed_lines({"cost": {}, "faults": {}}) == []


def test_compare_prints_each_controllers_testbed_lines() -> None:
    result = _result()
    text = compare.render({"respawn": result, "upstream": {"error": "not run"}})
    assert "  machine busy per phase (% of all its cores): setup 96 %, faults 71 %" in text
    assert "    PUT appwrappers/status: 830: 21.3 / 44.0 / 92.5" in text
