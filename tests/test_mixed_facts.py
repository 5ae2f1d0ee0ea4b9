"""A mixed run's facts per replica (components/training/mixed_step.py ``replica_rows``) feed three outputs: the
summary lines, the metrics and the report's section (pipelines/runs/mixed_section.py) read the same rows."""

from __future__ import annotations

from heteroflow.components.training.mixed_step import mixed_facts_lines, mixed_metrics, replica_rows
from heteroflow.pipelines.runs.mixed_section import mixed_section

FACTS = {
    "kinds": ["gpu", "gpu", "npu"], "shares": [22, 22, 20], "throughput": [410.4, 0, 198.6], "busy_fraction": [0.82, 0.8],
    "dropped": [{"kind": "npu", "step": 40, "reason": "DeviceUnavailable: gone", "resumed_from_step": 30}],
}


def test_replica_rows_pair_each_rank_with_its_values_and_none_where_missing() -> None:
    assert replica_rows(FACTS) == [
        {"rank": 0, "kind": "gpu", "share": 22, "samples_per_second": 410.4, "busy_fraction": 0.82},
        {"rank": 1, "kind": "gpu", "share": 22, "samples_per_second": 0, "busy_fraction": 0.8},
        {"rank": 2, "kind": "npu", "share": 20, "samples_per_second": 198.6, "busy_fraction": None},
    ]
    assert replica_rows({}) == [] and replica_rows({"shares": [3]}) == []


def test_lines_metrics_and_report_section_show_the_same_rows() -> None:
    lines = mixed_facts_lines(FACTS)
    assert lines[0] == ("train: mixed replicas: gpu[0] share 22, 410 samples/s, busy 82%; gpu[1] share 22, busy 80%; "
                        "npu[2] share 20, 199 samples/s")
    assert lines[1] == "train: kind npu dropped out after step 40 (DeviceUnavailable: gone); the others resumed from step 30"
    metrics = mixed_metrics(FACTS)
    assert metrics == {"share_gpu_0": 22.0, "share_gpu_1": 22.0, "share_npu_2": 20.0, "samples_per_second_gpu_0": 410.4,
                       "samples_per_second_gpu_1": 0.0, "samples_per_second_npu_2": 198.6, "busy_fraction_gpu_0": 0.82,
                       "busy_fraction_gpu_1": 0.8, "dropped_kinds": 1.0}
    html = mixed_section({"results": {"train": {"mixed": FACTS}, "plan": {}}})
    assert "<tr><td>0</td><td>gpu</td><td>22</td><td>410</td><td>82%</td></tr>" in html
    assert "<tr><td>1</td><td>gpu</td><td>22</td><td>-</td><td>80%</td></tr>" in html
    assert "<tr><td>2</td><td>npu</td><td>20</td><td>199</td><td>-</td></tr>" in html
    assert "kind <b>npu</b> dropped out after step 40" in html


def test_a_missing_value_inside_a_list_is_shown_as_missing() -> None:
    facts = {"kinds": ["gpu", "npu"], "shares": [3, None], "throughput": [None, 2.0], "busy_fraction": [None, 0.5]}
    assert mixed_facts_lines(facts) == ["train: mixed replicas: gpu[0] share 3; npu[1] share ?, 2 samples/s, busy 50%"]
    assert mixed_metrics(facts) == {"share_gpu_0": 3.0, "samples_per_second_npu_1": 2.0, "busy_fraction_npu_1": 0.5,
                                    "dropped_kinds": 0.0}
    assert "<tr><td>0</td><td>gpu</td><td>3</td><td>-</td><td>-</td></tr>" in mixed_section({"results": {"t": {"mixed": facts}}})


def test_a_replica_left_with_almost_no_samples_is_named_with_what_to_try() -> None:
    # the README's example on the default MLP: fixed costs per step dominate, the rebalancer leaves npu one sample
    facts = {"kinds": ["gpu", "npu"], "shares": [63, 1], "throughput": [117444.0, 1396.0], "busy_fraction": [0.43, 0.53]}
    lines = mixed_facts_lines(facts)
    assert lines[1] == ("train: npu[1] kept only 1 of 64 samples per step: its step time hardly shrinks with its share "
                        "(fixed costs dominate at this model's size), so the others wait for it each step; a candidate "
                        "without npu may train faster")
    assert len(lines) == 2
    assert len(mixed_facts_lines({**facts, "shares": [61, 3]})) == 1  # 3 of 64: more than 1/32 of the batch
    assert len(mixed_facts_lines({"kinds": ["gpu"], "shares": [1]})) == 1  # one replica: nothing to compare


def test_a_dropped_kind_is_worded_one_way_and_the_placement_line_says_what_the_candidate_was(tmp_path) -> None:
    """A new user's trial (gpu+npu, npu dropped after step 12): the live line said "dropped out after step 12", the
    summary "at step 12", and the placement line "candidate 0 -> gpu" with no word that candidate 0 was gpu+npu.
    One wording now (a drop record's step counts the steps the kind had done), and the placement line names the
    candidate's replicas and what it went on with; a fallback away from a mixed candidate names it too."""
    import json

    from heteroflow.components.training.mixed_step import drop_point
    from heteroflow.pipelines.cli.runs import summary_text
    from heteroflow.pipelines.runs.folders import load_run

    assert (drop_point(12), drop_point(0), drop_point(None)) == (" after step 12", " before its first step", "")
    resources = {"kind": "gpu", "count": 1, "replicas": [{"kind": "gpu", "count": 1}, {"kind": "npu", "count": 1}]}
    dropped = {"kind": "npu", "step": 12, "reason": "InjectedDeviceFault: gone", "resumed_from_step": 10}
    record = {
        "run_id": "r", "pipeline": "p", "status": "succeeded", "wall_seconds": 20.0, "fallbacks": [], "params": {},
        "steps": [{"name": "train", "status": "succeeded", "kind": "gpu", "accelerator": "nvidia-gpu", "simulated": True,
                   "candidate": 0, "attempts": 1, "seconds": 19.0, "details": {"device_kind": "gpu"}}],
        "placement": {"train": {"index": 0, "resources": resources, "device_kind": "gpu"}},
        "results": {"train": {"resumed_from_step": 10, "mixed": {"kinds": ["gpu"], "shares": [64], "dropped": [dropped]}}},
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    text = summary_text(load_run(tmp_path / "run"))
    assert ("placement of train: candidate 0 (gpu x1 + npu x1) -> gpu (nvidia-gpu, simulated, on cpu) once npu dropped "
            "out after step 12; resumed from step 10") in text, text
    assert " at step" not in text and " at step" not in mixed_section(record)
    assert "kind npu dropped out after step 12 (InjectedDeviceFault: gone)" in mixed_facts_lines(record["results"]["train"]["mixed"])[-1]
    assert "kind <b>npu</b> dropped out after step 12" in mixed_section(record)

    # every kind failed: the fallback to the cpu candidate names candidate 0 by its replicas, not its first kind
    record["steps"][0].update(kind="cpu", accelerator=None, simulated=False, candidate=1, details={})
    record["results"]["train"] = {}
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    assert ("placement of train: candidate 1 -> cpu (placed on candidate 0, gpu x1 + npu x1, then fell back)"
            in summary_text(load_run(tmp_path / "run")))
