"""The step contract: atomic writes, fingerprints, skip on rerun, no marker on failure."""

from __future__ import annotations

import json
import os

import pytest

from stepkit import MARKER, Step, StepError, read_marker, storage
from stepkit.cli import main


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out" / "data.bin"
    with pytest.raises(RuntimeError), storage.atomic_write(str(target)) as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert not target.exists()
    assert os.listdir(target.parent) == []  # no temporary file left behind either


def test_atomic_write_keeps_previous_version_on_error(tmp_path):
    target = tmp_path / "data.bin"
    storage.write_bytes(str(target), b"old")
    with pytest.raises(RuntimeError), storage.atomic_write(f"file://{target}") as f:
        f.write(b"new but broken")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"


def _run_step(out, params, inp, fail=False):
    step = Step("demo", str(out), "1", params, inputs=[str(inp)])
    if step.skip():
        return "skipped"
    step.write_bytes("a.txt", b"A")
    if fail:
        raise RuntimeError("failed after writing a.txt")
    step.write_json("b.json", {"x": 1})
    step.commit(summary={"n": 1})
    return "ran"


def test_rerun_skips_and_changes_rerun(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    assert _run_step(out, {"k": 1}, inp) == "ran"
    marker = read_marker(str(out))
    assert marker["outputs"].keys() == {"a.txt", "b.json"}
    assert _run_step(out, {"k": 1}, inp) == "skipped"
    assert _run_step(out, {"k": 2}, inp) == "ran"  # parameters changed
    inp.write_text("changed")
    assert _run_step(out, {"k": 2}, inp) == "ran"  # input content changed
    (out / "b.json").unlink()
    assert _run_step(out, {"k": 2}, inp) == "ran"  # an output went missing


def test_failed_rerun_removes_stale_marker(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    _run_step(out, {"k": 1}, inp)
    with pytest.raises(RuntimeError):
        _run_step(out, {"k": 2}, inp, fail=True)
    assert not (out / MARKER).exists()  # readers no longer trust the half-replaced outputs


def test_upstream_marker_fingerprint_is_used(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("x")
    up = tmp_path / "up"
    _run_step(up, {"k": 1}, inp)
    down = Step("down", str(tmp_path / "down"), "1", {}, inputs=[str(up)])
    assert down.inputs[0]["fingerprint"] == "step:" + read_marker(str(up))["fingerprint"]


def test_missing_input_and_corrupt_marker_are_clear(tmp_path):
    with pytest.raises(StepError, match="input not found"):
        Step("s", str(tmp_path / "o"), "1", {}, inputs=[str(tmp_path / "nope")])
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / MARKER).write_text("{not json")
    with pytest.raises(StepError, match="corrupt success marker"):
        read_marker(str(tmp_path / "o"))


def test_cli_exit_codes(tmp_path, capsys):
    steps = {"ingest": ("mirage_tasks.steps.ingest", "x")}
    assert main("mirage_tasks", steps, ["nope"]) == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("hello world\n")
    assert main("mirage_tasks", steps, ["ingest", "--trace", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown trace format" in err and str(bad) in err
    assert not (tmp_path / "o" / MARKER).exists()


def test_write_json_roundtrip(tmp_path):
    storage.write_json(str(tmp_path / "x.json"), {"b": 2, "a": [1]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": [1], "b": 2}
    assert storage.list_files(str(tmp_path)) == ["x.json"]


def test_failure_before_writing_keeps_previous_results(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    _run_step(out, {"k": 1}, inp)
    step = Step("demo", str(out), "1", {"k": 3}, inputs=[str(inp)])
    assert not step.skip()
    # The run fails validating its input, before any write: the old results stay committed.
    assert read_marker(str(out))["params"] == {"k": 1}


def test_rerun_recomputes_a_truncated_output(tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    assert _run_step(out, {"k": 1}, inp) == "ran"
    data = (out / "b.json").read_bytes()
    (out / "b.json").write_bytes(data[:-3])  # truncated after the commit
    capsys.readouterr()
    assert _run_step(out, {"k": 1}, inp) == "ran"
    assert "b.json: " in capsys.readouterr().out
    assert (out / "b.json").read_bytes() == data
    assert _run_step(out, {"k": 1}, inp) == "skipped"


def test_rerun_recomputes_an_output_changed_in_place(tmp_path):
    """Same size, other bytes: only the checksum can tell."""
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    _run_step(out, {"k": 1}, inp)
    (out / "a.txt").write_bytes(b"Z")
    step = Step("demo", str(out), "1", {"k": 1}, inputs=[str(inp)])
    assert not step.skip()
    assert step._changed_outputs(read_marker(str(out))["outputs"]) == ["a.txt: content changed (SHA-256)"]


def test_marker_without_checksums_is_not_trusted(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"
    _run_step(out, {"k": 1}, inp)
    marker = read_marker(str(out))
    marker["outputs"] = dict.fromkeys(marker["outputs"], {})
    storage.write_json(str(out / MARKER), marker)
    assert _run_step(out, {"k": 1}, inp) == "ran"


def test_argparse_errors_return_2_in_process(capsys):
    steps = {"ingest": ("mirage_tasks.steps.ingest", "x")}
    assert main("mirage_tasks", steps, ["ingest", "--no-such-flag"]) == 2
    assert "error: the following arguments are required: --trace, --out" in capsys.readouterr().err


def _untimed(marker: bytes) -> dict:
    """A marker's content less the times of the commit that wrote it."""
    return {k: v for k, v in json.loads(marker).items() if k not in ("started", "finished")}


def _tree(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_refuse_keeps_a_committed_output_of_other_inputs_untouched(tmp_path):
    """An output under a name a user gave (``on_change="refuse"``): a rerun with other parameters or
    another input is refused naming both, and the committed files, marker included, stay byte for
    byte; the same inputs skip; a damaged output of the same inputs is still repaired."""
    inp = tmp_path / "in.txt"
    inp.write_text("hello")
    out = tmp_path / "out"

    def run(params, fail=False):
        step = Step("demo", str(out), "1", params, inputs=[str(inp)], on_change="refuse")
        try:
            if step.skip():
                return "skipped"
            step.write_bytes("a.txt", b"A" if not fail else b"other")
            step.commit()
            return "ran"
        finally:
            step.release()

    assert run({"k": 1}) == "ran"
    before = _tree(out)
    with pytest.raises(StepError) as e:
        run({"k": 2})
    msg = str(e.value)
    assert "parameter k: committed 1, this run 2" in msg and str(out) in msg and "--on-change replace" in msg
    assert _tree(out) == before
    inp.write_text("changed")
    with pytest.raises(StepError, match=r"inputs: committed .*in\.txt \(sha256:.*; this run .*in\.txt \(sha256:"):
        run({"k": 1})
    assert _tree(out) == before
    inp.write_text("hello")
    assert run({"k": 1}) == "skipped"
    (out / "a.txt").write_bytes(b"damaged")
    assert run({"k": 1}) == "ran"  # the same inputs: repaired, not replaced
    after = _tree(out)  # the repair's marker is a new commit: its times are this run's, the rest the same
    assert after.keys() == before.keys() and {k: v for k, v in after.items() if k != MARKER} == {
        k: v for k, v in before.items() if k != MARKER
    }
    assert _untimed(after[MARKER]) == _untimed(before[MARKER])


def test_a_refusing_marker_binds_later_runs_that_name_no_policy(tmp_path, monkeypatch, capsys):
    """The policy travels with the output: a run through the CLI without ``--on-change`` (a manual
    rerun of the evaluation's calibrate with other flags) is refused by the marker a refusing run
    committed, exit 2; ``--on-change replace`` replaces it; a content-keyed output (no policy
    anywhere) is replaced on a change as before."""
    (tmp_path / "onchangestep.py").write_text(
        "from stepkit import Step\n"
        "def add_arguments(p):\n    p.add_argument('--out'); p.add_argument('--k', type=int)\n"
        "def run(a):\n    s = Step('demo', a.out, '1', {'k': a.k})\n    if s.skip():\n        return 0\n"
        "    s.write_bytes('a.txt', str(a.k).encode())\n    s.commit()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = {"demo": ("onchangestep", "")}
    out = tmp_path / "named"
    assert main("t", steps, ["demo", "--out", str(out), "--k", "1", "--on-change", "refuse"]) == 0
    assert read_marker(str(out))["on_change"] == "refuse"
    before = _tree(out)
    capsys.readouterr()
    assert main("t", steps, ["demo", "--out", str(out), "--k", "2"]) == 2
    err = capsys.readouterr().err
    assert "never replaced by other inputs" in err and "parameter k: committed 1, this run 2" in err
    assert _tree(out) == before and not (out / "_LEASE.json").exists()
    assert main("t", steps, ["demo", "--out", str(out), "--k", "2", "--on-change", "replace"]) == 0
    assert (out / "a.txt").read_text() == "2" and "on_change" not in read_marker(str(out))
    keyed = tmp_path / "keyed"
    assert main("t", steps, ["demo", "--out", str(keyed), "--k", "1"]) == 0
    assert main("t", steps, ["demo", "--out", str(keyed), "--k", "2"]) == 0
    assert (keyed / "a.txt").read_text() == "2"
    assert Step.default_on_change is None  # the CLI's setting ends with its step
