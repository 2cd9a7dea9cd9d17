"""Files from outside are parsed bounded (stepkit.safeload) and unknown keys are refused.

Alias bomb, oversize, deep nesting -> exit 2 naming the file (through the real steps, as
subprocesses, so a hang shows as a timeout); unknown keys in a workload profile, a cluster
config, a catalogue entry and ``deploy --set`` -> exit 2 naming the key. Property tests
feed random documents to the profile, cluster-config and catalogue readers: they return
or raise :class:`StepError`, never anything else.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from faasm_tasks.catalogue import load_catalogue, resolve
from mirage_tasks.data.synth import load_profile
from mirage_tasks.sim.config import SimConfig, load_config
from stepkit import StepError
from stepkit.safeload import MAX_BYTES, MAX_DEPTH, parse_document, read_document

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ROOT / "faasm_tasks" / "experiments"
PROFILE = json.loads((ROOT / "mirage_tasks" / "data" / "profiles" / "ls6-a100.json").read_text())

#: "Billion laughs": 9 levels of 9 aliases each, 9**9 leaves once expanded (~400 bytes).
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefghi", "bcdefghij")
)

#: A hang is a timeout of the subprocess, not a timed assertion.
HANG_S = 120


def _step(pkg: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAASM_TASKS_STATE_DIR": str(cwd / "state"),
    }
    env.pop("FAASM_CATALOGUE_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", pkg, *argv, "--log-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


# --- the loader --------------------------------------------------------------------------


def test_alias_bomb_is_refused_naming_the_file():
    with pytest.raises(StepError, match=r"bomb\.yaml: line \d+: expands to more than"):
        parse_document(ALIAS_BOMB, "bomb.yaml")


def test_small_aliases_still_work():
    doc = parse_document("base: &b {x: 1, y: [1, 2]}\nother: *b\nmerged: {<<: *b, z: 3}\n", "ok.yaml")
    assert doc["other"] == {"x": 1, "y": [1, 2]} and doc["merged"] == {"x": 1, "y": [1, 2], "z": 3}


@pytest.mark.parametrize(
    "kind,text",
    [
        ("yaml", "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)),
        ("json", "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)),
        ("json", "[" * 100_000 + "]" * 100_000),
    ],
)
def test_deep_nesting_is_refused(kind, text):
    with pytest.raises(StepError, match=r"deep\.x: .*nested"):
        parse_document(text, "deep.x", kind)


def test_oversize_file_is_refused_without_reading_it_all(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * MAX_BYTES + "0]")
    with pytest.raises(StepError, match=rf"{big}: larger than {MAX_BYTES} bytes"):
        read_document(str(big))


def test_python_tags_are_refused():
    with pytest.raises(StepError, match="x.yaml: not valid YAML"):
        parse_document("a: !!python/object/apply:os.system [echo hi]\n", "x.yaml")


# --- through the steps -------------------------------------------------------------------


@pytest.mark.e2e  # runs the step as a process (a hang is its timeout)
def test_experiments_with_an_alias_bomb_exits_2_naming_the_file(tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "bomb.yaml").write_text(ALIAS_BOMB)
    proc = _step("faasm_tasks", "experiments", "--catalogue-dir", str(cat), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{cat / 'bomb.yaml'}: line" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e  # runs the step as a process (a hang is its timeout)
def test_oversize_catalogue_file_exits_2(tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "huge.yaml").write_text("name: x\ndescription: " + "y" * (MAX_BYTES + 10) + "\n")
    proc = _step("faasm_tasks", "experiments", "--catalogue-dir", str(cat), cwd=tmp_path)
    assert proc.returncode == 2 and f"{cat / 'huge.yaml'}: larger than" in proc.stderr, proc.stderr


@pytest.mark.e2e  # runs the step as a process (a hang is its timeout)
def test_unknown_catalogue_key_exits_2_naming_it(tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    doc = yaml.safe_load((PACKAGED / "sgd_reuters_svm.yaml").read_text())
    doc["name"], doc["repeets"] = "mine", 3
    (cat / "mine.yaml").write_text(yaml.safe_dump(doc))
    proc = _step("faasm_tasks", "experiments", "--catalogue-dir", str(cat), cwd=tmp_path)
    assert proc.returncode == 2 and "'repeets' was unexpected" in proc.stderr, proc.stderr


@pytest.mark.e2e  # runs the step as a process (a hang is its timeout)
def test_deploy_set_with_an_unknown_name_exits_2_naming_it(tmp_path):
    proc = _step(
        "faasm_tasks",
        "deploy",
        "--target",
        "local",
        "--run-id",
        "setcheck",
        "--results",
        str(tmp_path / "results"),
        "--experiment",
        "sgd_reuters_svm",
        "--set",
        "epochs=2",
        "--set",
        "epoch=3",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--set epoch: sgd_reuters_svm has no parameter 'epoch'" in proc.stderr
    assert "epochs" in proc.stderr  # the known names are listed


@pytest.mark.e2e  # runs the step as a process (a hang is its timeout)
def test_profile_with_an_unknown_key_exits_2_naming_it(tmp_path):
    prof = {**PROFILE, "load_scale": 2.0}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    proc = _step(
        "mirage_tasks",
        "synth",
        "--profile",
        str(path),
        "--from",
        "2023-01-01",
        "--to",
        "2023-01-02",
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: unknown key 'load_scale'" in proc.stderr


def test_oversize_profile_and_cluster_config_are_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**PROFILE, "pad": "x" * MAX_BYTES}))
    with pytest.raises(StepError, match=f"{path}: larger than"):
        load_profile(str(path))
    with pytest.raises(StepError, match=f"--cluster-config {path}: larger than"):
        load_config(str(path))


def test_cluster_config_unknown_key_names_it(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": 8, "nodez": 3}))
    with pytest.raises(StepError, match=r"unknown cluster-config keys \['nodez'\]"):
        SimConfig.from_dict(load_config(str(path)), dict.fromkeys(["nodes", "nodez"], str(path)))


# --- properties: random documents never get past the readers as anything but StepError ---

scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=12)
)
document = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=30,
)
PROPS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def _write(doc, suffix: str) -> str:
    fd, path = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, allow_nan=True) if suffix == ".json" else yaml.safe_dump(doc))
    return path


def _mutate(base: dict, data) -> dict:
    """``base`` with one random path set to a random document, deleted, or a key added."""
    doc = copy.deepcopy(base)
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            break
        k = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["descend", "set", "delete", "add"]))
        if action == "descend" and isinstance(node[k], (dict, list)) and node[k]:
            node = node[k]
            continue
        if action == "delete":
            del node[k]
        elif action == "add" and isinstance(node, dict):
            node[data.draw(st.text(max_size=8))] = data.draw(document)
        else:
            node[k] = data.draw(document)
        break
    return doc


def _only_step_errors(fn, *args):
    try:
        fn(*args)
    except StepError:
        pass


@PROPS
@given(doc=document, suffix=st.sampled_from([".json", ".yaml"]))
def test_random_documents_to_the_three_readers(doc, suffix):
    path = _write(doc, suffix)
    try:
        _only_step_errors(load_profile, path)
        _only_step_errors(lambda p: SimConfig.from_dict(load_config(p)), path)
        with tempfile.TemporaryDirectory() as d:
            os.replace(path, os.path.join(d, "exp" + suffix))
            _only_step_errors(load_catalogue, [d])
    finally:
        if os.path.exists(path):
            os.unlink(path)


@PROPS
@given(data=st.data())
def test_mutated_profiles_are_accepted_or_refused_cleanly(data):
    path = _write(_mutate(PROFILE, data), ".json")
    try:
        _only_step_errors(load_profile, path)
    finally:
        os.unlink(path)


@PROPS
@given(data=st.data())
def test_mutated_cluster_configs_are_accepted_or_refused_cleanly(data):
    base = SimConfig.from_dict(load_config("ls6")).to_dict()
    path = _write(_mutate(base, data), ".json")
    try:
        _only_step_errors(lambda p: SimConfig.from_dict(load_config(p)), path)
    finally:
        os.unlink(path)


@PROPS
@given(data=st.data(), name=st.sampled_from(sorted(p.name for p in PACKAGED.glob("*.yaml"))))
def test_mutated_catalogue_entries_are_accepted_or_refused_cleanly(data, name):
    base = yaml.safe_load((PACKAGED / name).read_text())
    doc = _mutate(base, data)
    with tempfile.TemporaryDirectory() as d:
        Path(d, name).write_text(yaml.safe_dump(doc))
        try:
            exp = load_catalogue([d]).get(doc.get("name") if isinstance(doc, dict) else None)
            for system in (exp or {}).get("systems", []):
                for target in ("local", "knative"):
                    resolve(exp, system, target)
        except StepError:
            pass
