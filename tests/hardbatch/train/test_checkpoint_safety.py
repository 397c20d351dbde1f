"""Training checkpoints are safe to load (issue 34): ``weights_only=True``, a checksum that
catches every flipped byte of tensor data, refuses a checkpoint without its checksum."""

import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import hardbatch as hb
from hardbatch._integrity import (
    digest,
    seal,
    span_offset,
    tensor_record_spans,
    verify,
)
from hardbatch.losses import InfoNCE
from hardbatch.train import TrainConfig, Trainer
from hardbatch.train.checkpoint import (
    CHECKPOINT_VERSION,
    numpy_rng_state,
    python_rng_state,
    read_checkpoint,
    set_numpy_rng_state,
    set_python_rng_state,
    write_checkpoint,
)

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("one_thread")


def trainer(path, **config):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((96, 8)).astype(np.float32))
    config = {"epochs": 2, "seed": 3, "progress": False, "probe_max_iter": 5,
              "checkpoint_path": None if path is None else str(path), **config}
    return Trainer(model, InfoNCE(0.5), lambda bank: hb.ProximityGraphSampler(
        bank, 16, candidates=30, neighbors=6, refresh_every=2, seed=1), x,
        augment=lambda v, generator=None: v + 0.05 * torch.randn(v.shape, generator=generator),
        config=TrainConfig(**config))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint written mid-epoch by a short run (and the final weights of the full run)."""
    folder = tmp_path_factory.mktemp("ck")
    full = trainer(None)
    full.fit()
    path = folder / "ck.pt"
    trainer(path, max_steps=4).fit()
    return path, {k: v.clone() for k, v in full.model.state_dict().items()}


def flipped(path: Path, out: Path, offset: int, rng: random.Random) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= rng.randrange(1, 256)
    out.write_bytes(bytes(data))
    return out


def test_checkpoint_is_weights_only_loadable_and_carries_checksum_and_version(checkpoint):
    path, _ = checkpoint
    state = torch.load(path, weights_only=True)
    assert state["version"] == CHECKPOINT_VERSION == 2
    assert state["integrity"]["library"] == hb.__version__
    assert re.fullmatch(r"[0-9a-f]{64}", state["integrity"]["sha256"])
    assert verify(state, "checkpoint")
    assert isinstance(state["rng"]["numpy"]["key"], torch.Tensor)
    assert isinstance(state["rng"]["python"]["internal"], torch.Tensor)
    assert state["sampler"]["kind"] == "ProximityGraphSampler"


def test_resume_from_checked_checkpoint_equals_the_uninterrupted_run(checkpoint, tmp_path):
    path, weights = checkpoint
    copy = tmp_path / "ck.pt"
    shutil.copy(path, copy)
    resumed = trainer(copy)
    resumed.fit()
    for key, value in resumed.model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_every_byte_flip_in_tensor_data_is_detected(checkpoint, tmp_path):
    path, _ = checkpoint
    spans = tensor_record_spans(path)
    total = sum(end - start for start, end in spans)
    assert len(spans) > 10 and total > 1000
    rng = random.Random(34)
    for i in range(60):
        bad = flipped(path, tmp_path / f"flip{i}.pt", span_offset(spans, rng.randrange(total)),
                      rng)
        with pytest.raises(ValueError, match=rf"{re.escape(str(bad))} is corrupted"):
            read_checkpoint(bad)


def test_a_flip_anywhere_never_loads_other_content(checkpoint, tmp_path):
    path, _ = checkpoint
    want = digest(torch.load(path, weights_only=True))
    rng = random.Random(7)
    size = path.stat().st_size
    for i in range(40):
        bad = flipped(path, tmp_path / f"any{i}.pt", rng.randrange(size), rng)
        try:
            state = read_checkpoint(bad)
        except ValueError as err:
            assert "corrupted" in str(err) and str(bad) in str(err)
        else:  # a byte that no content depends on (a zip CRC, padding): the same content
            assert digest(state) == want


def test_a_fit_refuses_a_corrupted_checkpoint(checkpoint, tmp_path):
    path, _ = checkpoint
    start, end = tensor_record_spans(path)[0]
    bad = flipped(path, tmp_path / "ck.pt", (start + end) // 2, random.Random(1))
    with pytest.raises(ValueError, match="is corrupted"):
        trainer(bad).fit()


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    ran = []

    class Payload:
        def __reduce__(self):
            return ran.append, ("code ran",)

    path = tmp_path / "evil.pt"
    torch.save({"progress": {}, "evil": Payload()}, path)
    with pytest.raises(ValueError, match="weights_only=True"):
        read_checkpoint(path)
    assert not ran


def test_a_checkpoint_without_its_checksum_or_of_another_version_is_refused(checkpoint,
                                                                               tmp_path):
    path, _ = checkpoint
    state = torch.load(path, weights_only=True)
    del state["integrity"]
    old = tmp_path / "unsealed.pt"
    torch.save(state, old)
    with pytest.raises(ValueError, match="is corrupted: a hardbatch checkpoint carries a "
                                         "checksum and this one has none"):
        read_checkpoint(old)
    state["version"] = 1
    with pytest.raises(ValueError, match="checkpoint version 1 is not supported"):
        trainer(old).load_state_dict(state)


def test_rng_states_round_trip_as_tensors_and_numbers():
    np.random.seed(1)
    np.random.standard_normal()  # odd count: has_gauss = 1
    random.seed(2)
    random.gauss(0, 1)  # gauss_next set
    saved_np, saved_py = numpy_rng_state(), python_rng_state()
    want = (np.random.standard_normal(4), random.gauss(0, 1), random.random())
    np.random.seed(9)
    random.seed(9)
    set_numpy_rng_state(saved_np)
    set_python_rng_state(saved_py)
    assert np.array_equal(np.random.standard_normal(4), want[0])
    assert (random.gauss(0, 1), random.random()) == want[1:]
    assert verify(seal({"numpy": saved_np, "python": saved_py}), "rng")


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    path = write_checkpoint({"progress": {"global_step": 1}}, tmp_path / "a" / "ck.pt")
    assert [p.name for p in path.parent.iterdir()] == ["ck.pt"]
    assert read_checkpoint(path)["progress"] == {"global_step": 1}


def test_no_weights_only_false_in_the_library_or_the_experiments():
    roots = [REPO / "src", REPO / "experiments" / "src", REPO / "scripts"]
    found = [f"{p}:{i}" for root in roots for p in sorted(root.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"weights_only\s*=\s*False", line)]
    assert not found, found


def test_tu_cache_loads_with_weights_only(tmp_path, monkeypatch):
    from hardbatch_experiments import tu

    folder = tmp_path / "data" / "tu" / "TOY"
    folder.mkdir(parents=True)
    (folder / "TOY_A.txt").write_text("1, 2\n2, 3\n4, 5\n")
    (folder / "TOY_graph_indicator.txt").write_text("1\n1\n1\n2\n2\n")
    (folder / "TOY_graph_labels.txt").write_text("1\n-1\n")
    first = tu.load_tu("TOY", tmp_path / "data", cache_dir=tmp_path / "cache")
    (cache,) = (tmp_path / "cache").rglob("processed-*.pt")
    torch.load(cache, weights_only=True)
    monkeypatch.setattr(tu, "read_tu_raw", lambda *a: pytest.fail("not read from the cache"))
    again = tu.load_tu("TOY", tmp_path / "data", cache_dir=tmp_path / "cache")
    assert torch.equal(again.edge_index, first.edge_index) and again.label_values == [-1, 1]


# -- the checksum, as a property --------------------------------------------------------------

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=8),
    st.floats(allow_nan=False),
    st.lists(st.integers(-1000, 1000), min_size=1, max_size=12).map(torch.tensor),
    st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=12).map(
        lambda v: torch.tensor(v, dtype=torch.float32)))
states = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(min_size=1, max_size=6), states, min_size=1, max_size=5),
       st.randoms(use_true_random=False))
def test_checksum_survives_save_and_load_and_catches_any_changed_value(state, rnd):
    import io

    sealed = seal(state)
    buf = io.BytesIO()
    torch.save(sealed, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert verify(loaded, "state")
    tensors = [t for t in _walk(loaded) if isinstance(t, torch.Tensor) and t.numel()]
    if tensors:  # one changed element of one tensor
        t = rnd.choice(tensors).view(-1)
        t.view(torch.uint8)[rnd.randrange(t.numel() * t.element_size())] ^= 1
        with pytest.raises(ValueError, match="state is corrupted"):
            verify(loaded, "state")


def test_a_checksum_written_on_a_little_endian_machine_verifies_on_a_big_endian_one(
        monkeypatch):
    """The same values give the same SHA-256 whatever the machine's byte order: a big-endian
    machine holds each number's bytes reversed (numpy's byteswap: the independent reference,
    complex numbers part by part), and plan files' arrays come back from Parquet as '>i8'."""
    import hardbatch._integrity as integrity

    values = {"i32": np.array([1, -2, 70000], np.int32), "f64": np.array([0.5, -3.25]),
              "c64": np.array([1 + 2j, -3.5j], np.complex64), "u8": np.array([1, 255], np.uint8)}
    state = {"step": 7, "arrays": {k: torch.from_numpy(v.copy()) for k, v in values.items()}}
    sealed = seal(state)
    as_big_endian_machine = {  # same values: bytes in a big-endian machine's order
        "step": 7, "arrays": {k: torch.from_numpy(v.byteswap()) for k, v in values.items()},
        integrity.INTEGRITY_KEY: sealed[integrity.INTEGRITY_KEY]}
    monkeypatch.setattr(integrity, "_BIG_ENDIAN", True)
    assert verify(as_big_endian_machine, "state")
    as_big_endian_machine["arrays"]["f64"][1] = -3.0  # still catches a changed value
    with pytest.raises(ValueError, match="state is corrupted"):
        verify(as_big_endian_machine, "state")
    monkeypatch.setattr(integrity, "_BIG_ENDIAN", False)
    rows = np.arange(6, dtype=np.int64)
    assert digest(rows.astype(">i8")) == digest(rows)
    assert digest(np.float64(1.5).astype(">f8")) == digest(np.float64(1.5))
    assert digest(rows.astype(">i8")) != digest(rows.astype(np.int32))


def _walk(obj):
    yield obj
    children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    for child in children:
        yield from _walk(child)


def test_fault_campaign_quick_mode_passes(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "campaign.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "fault_campaign.py"), "--quick",
                          "--json", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert report["failed"] == 0 and report["checkpoint"]["data_detected"] == 10
