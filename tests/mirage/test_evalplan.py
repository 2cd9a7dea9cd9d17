"""Log descriptions (mirage_tasks.run.evalplan): every mistake named with its file and field, and the
command lines the bench and the mirage_evaluation DAG both run."""

from __future__ import annotations

import json

import pytest

from mirage_tasks.run import evalplan
from mirage_tasks.run.evalplan import LogSpec, SpecError

GOOD = {
    "name": "site",
    "trace": "/data/log.swf",
    "calibrate": ["2024-01-01", "2024-03-01"],
    "months": ["2024-04", "2024-03"],
    "nodes": [8, 1],
    "procs_per_node": 8,
    "machine_nodes": 240,
}


def test_a_good_description_round_trips_sorted():
    s = LogSpec.from_dict(GOOD, source="x.json")
    assert s.months == ("2024-03", "2024-04") and s.nodes == (1, 8)
    assert LogSpec.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"months": ["2024-02"]}, "field 'months': the first scored month 2024-02 begins before"),
        ({"months": ["2024-3"]}, "field 'months': '2024-3' not of the form YYYY-MM"),
        ({"calibrate": ["2024-03-01", "2024-01-01"]}, "field 'calibrate': the end"),
        ({"calibrate": "2024-01-01"}, "field 'calibrate': two dates"),
        ({"nodes": [0]}, "field 'nodes'"),
        ({"nodes": ["8"]}, "field 'nodes'"),
        ({"procs_per_node": -1}, "field 'procs_per_node'"),
        ({"machine_nodes": 2.5}, "field 'machine_nodes'"),
        ({"timezone": "Mars/Olympus"}, "field 'timezone'"),
        ({"name": "../x"}, "field 'name'"),
        ({"sizes": [1]}, "unknown field(s) sizes"),
        ({"trace": None}, "field 'trace' is required"),
        (
            {"months": [f"2025-{m:02d}" for m in range(1, 13)] + [f"2026-{m:02d}" for m in range(1, 13)] + ["2027-01"]},
            "at most 24",
        ),
    ],
)
def test_every_mistake_names_the_file_and_the_field(change, needle):
    with pytest.raises(SpecError) as e:
        LogSpec.from_dict({**GOOD, **change}, source="mysite.json")
    assert str(e.value).startswith("mysite.json: ") and needle in str(e.value)


def test_files_json_and_yaml_relative_traces_and_bad_syntax(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({**GOOD, "trace": "log.swf"}))
    assert evalplan.load(str(tmp_path / "a.json")).trace == str(tmp_path / "log.swf")
    (tmp_path / "b.yaml").write_text(
        "name: b\ntrace: log.swf\ncalibrate: [2024-01-01, 2024-03-01]\nmonths: [2024-03]\n"
    )
    assert evalplan.load(str(tmp_path / "b.yaml")).calibrate == ("2024-01-01", "2024-03-01")
    (tmp_path / "c.json").write_text('{"name": "c",\n "trace": }')
    with pytest.raises(SpecError, match=r"c.json: not valid JSON \(line 2 column"):
        evalplan.load(str(tmp_path / "c.json"))
    with pytest.raises(SpecError, match="cannot read"):
        evalplan.load(str(tmp_path / "missing.json"))


def test_a_yaml_alias_bomb_or_a_huge_file_is_refused_while_read(tmp_path):
    """The description is read with the bounded loader (stepkit.safeload): aliases that expand a
    few hundred bytes into a million values are refused while read, naming the file and line (the
    plain safe_load returned the shared structure, and the months check then spelled it out in its
    message: minutes and gigabytes for a deeper bomb); a file over the bound is not read."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcde", "bcdef")]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "\n".join(["name: b", "trace: log.swf", "calibrate: [2024-01-01, 2024-03-01]", *levels, "months: *f"]) + "\n"
    )
    with pytest.raises(SpecError) as e:
        evalplan.load(str(bomb))
    assert str(e.value).startswith(f"{bomb}: line ") and "expands to more than" in str(e.value)
    assert len(str(e.value)) < 500
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**GOOD, "trace": "x" * evalplan.MAX_DESCRIPTION_BYTES}))
    with pytest.raises(
        SpecError,
        match=f"big.json: cannot read the log description \\(larger than {evalplan.MAX_DESCRIPTION_BYTES} bytes",
    ):
        evalplan.load(str(big))


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"nodes": [1] * 9}, "field 'nodes': 9 node sizes; at most 8"),
        ({"months": ["2024-03"] * 25}, "field 'months': 25 months; at most 24"),
        ({"months": ["2024-03", "2026-03"]}, "field 'months': 2024-03 .. 2026-03 spans 25 months; at most 24"),
        ({"months": ["0000-01"], "calibrate": ["1960-01-01", "1960-02-01"]}, "field 'calibrate'"),
        ({"months": ["9999-12"]}, "field 'months': '9999-12-01': the year must lie in 1970 .. 2261"),
        (
            {"calibrate": ["2022-01-01", "2024-03-01"]},
            ("field 'calibrate': 2022-01-01 .. 2024-03-01 is 790 days; at most 731"),
        ),
        (
            {"train_start": "2020-01-01"},
            ("field 'train_start': the training window 2020-01-01 .. 2024-03 is 1521 days; at most 1096"),
        ),
        ({"train_start": "2024-03-05"}, "field 'train_start': 2024-03-05 is not before the first scored month"),
        ({"timezone": "x" * 65}, "field 'timezone': an IANA time zone name (at most 64 characters)"),
    ],
)
def test_every_count_has_a_bound_named_in_its_error(change, needle):
    with pytest.raises(SpecError) as e:
        LogSpec.from_dict({**GOOD, **change}, source="mysite.json")
    assert str(e.value).startswith("mysite.json: ") and needle in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "change,needle",
    [
        # passed here, then calibrate refused its --score-from (scored from the first month's midnight)
        (
            {"calibrate": ["2024-01-01", "2024-03-01T12:00"]},
            (
                "field 'months': the first scored month 2024-03 "
                "begins before the calibration period ends (2024-03-01T12:00)"
            ),
        ),
        # passed here (read as its first ten characters), then calibrate refused its --calibrate-from
        ({"calibrate": ["2024-01-01 sharp", "2024-03-01"]}, "field 'calibrate': '2024-01-01 sharp' is not a date"),
        ({"calibrate": ["2024-01-01T00:00+02:00", "2024-03-01"]}, "without an offset"),
        # passed here, then calibrate refused it as "--cluster-config 'lonestar': neither a preset ... nor a file"
        (
            {"start_config": "lonestar"},
            "field 'start_config': 'lonestar' is neither a preset (ls6, reference) nor a file",
        ),
        # passed here, then every step refused "--trace s3:///x.log: an s3:// URI needs a bucket"
        ({"trace": "s3:///traces/x.log"}, "field 'trace': 's3:///traces/x.log': an s3:// URI needs a bucket"),
    ],
)
def test_what_a_step_would_refuse_is_refused_here_naming_the_field(change, needle):
    with pytest.raises(SpecError) as e:
        LogSpec.from_dict({**GOOD, **change}, source="mysite.json")
    assert str(e.value).startswith("mysite.json: ") and needle in str(e.value), str(e.value)


def test_the_description_as_a_whole_passes_its_steps_own_checks(tmp_path):
    """Every value the description accepts, at its bounds, parses with each step's own parser and
    passes the step CLI's flag checks (its BOUNDS): no step refuses a flag the user never wrote. A
    value a step would refuse is named by its field (a description made without from_dict's checks)."""
    import dataclasses

    cfg = tmp_path / "start.json"
    cfg.write_text(json.dumps({"nodes": 240}))
    edge = {
        **GOOD,
        "procs_per_node": 4096,
        "machine_nodes": 10_000_000,
        "nodes": [1, 100_000],
        "months": [f"2024-{m:02d}" for m in range(4, 13)]
        + [f"2025-{m:02d}" for m in range(1, 13)]
        + ["2026-01", "2026-02", "2026-03"],
        "timezone": "America/Chicago",
        "start_config": "start.json",
        "calibrate": ["2022-03-01", "2024-03-01T00:00"],
        "train_start": "2021-04-05",
    }
    spec = LogSpec.from_dict(edge, source=str(tmp_path / "edge.json"))
    assert spec.start_config == str(cfg) and len(spec.months) == evalplan.MAX_MONTHS
    evalplan.check_against_steps(spec, str(tmp_path / "r"))
    evalplan.check_against_steps(LogSpec.from_dict({**GOOD, "start_config": "ls6"}), str(tmp_path / "r"))
    with pytest.raises(SpecError, match="edge.json: field 'trace': the ingest step would refuse it: --trace s3:///x"):
        evalplan.check_against_steps(dataclasses.replace(spec, trace="s3:///x"), str(tmp_path / "r"))
    cfg.write_text(json.dumps({"nodes": "many"}))
    with pytest.raises(SpecError, match="edge.json: field 'start_config': "):
        evalplan.check_against_steps(spec, str(tmp_path / "r"))


def test_the_command_lines_carry_the_description():
    s = LogSpec.from_dict(GOOD)
    argvs = dict(evalplan.waitpred_argvs(s, "/r"))
    assert argvs["ingest"][:5] == ["ingest", "--trace", "/data/log.swf", "--out", "/r/site/trace"]
    cal = argvs["calibrate"]
    assert cal[cal.index("--machine-nodes") + 1] == "240" and cal[cal.index("--procs-per-node") + 1] == "8"
    assert cal[cal.index("--score-to") + 1] == "2024-05-01"
    wp = argvs["waitpred"]
    assert wp[wp.index("--months") + 1 : wp.index("--months") + 3] == ["2024-03", "2024-04"]
    assert evalplan.command(["probe-replay", "--x"])[:2] == ["-m", "lab.evaluation.probe_replay"]
    assert evalplan.command(["waitpred"])[:3] == ["-m", "mirage_tasks", "waitpred"]


def test_the_named_outputs_refuse_other_inputs():
    """The trace, calibration and wait predictor live under the log's name, not a key of what they
    depend on: every one of their command lines asks its step to refuse a committed output of other
    inputs (a second description under one name would otherwise replace the trace under the
    calibration and predictor computed from the first), and that flag parses with the step's parser."""
    from mirage_tasks.run.plan import step_parser

    for name, argv in evalplan.waitpred_argvs(LogSpec.from_dict(GOOD), "/r"):
        assert step_parser(name).parse_args(argv[1:]).on_change == "refuse", name


def test_declared_limits_reach_the_ingest_command_line():
    s = LogSpec.from_dict({**GOOD, "partition_max_limit": {"debug": 1800, "*": 86400}, "default_limit_s": 7200})
    ing = dict(evalplan.waitpred_argvs(s, "/r"))["ingest"]
    assert "debug=1800" in ing and "*=86400" in ing and ing[ing.index("--default-limit-s") + 1] == "7200"
    assert LogSpec.from_dict(s.to_dict()) == s
    with pytest.raises(SpecError, match="'partition_max_limit'"):
        LogSpec.from_dict({**GOOD, "partition_max_limit": {"debug": 0}})
