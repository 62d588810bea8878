"""op_profiles.py: the cost model against operator times measured on A100 and H100.

In-sample: the shipped factors were fitted on every file of their GPU. Held
out: refit with one file left out, test on it (what a new model shape sees)."""
import pytest

from minillm.sim import op_profiles
from minillm.sim.op_profiles import (error_summary, held_out_errors, linear_op_errors,
                                     load_gpu_op_profile, profile_paths)

PROFILE_FILES = profile_paths()


def test_profile_files_are_found():
    assert len(PROFILE_FILES) == 7, op_profiles.profile_dir()


def test_profile_dir_follows_the_environment_at_call_time(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_PROFILE_DIR", str(tmp_path))
    assert op_profiles.profile_dir() == tmp_path
    with pytest.raises(ValueError, match="holds no gpu-op-profile CSV"):
        profile_paths()


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.name)
def test_linear_ops_match_the_measured_gpu_profile_in_sample(path):
    """Median |error| <= 8% and p90 <= 20% over qkv, o, gate_up, down and the whole MLP."""
    median, p90 = error_summary(linear_op_errors(path))
    assert median <= 0.08, f"{path.name}: median |error| {median:.3f}"
    assert p90 <= 0.20, f"{path.name}: p90 |error| {p90:.3f}"


def test_held_out_errors_stay_close_to_in_sample():
    """Each file, predicted by factors fitted without it: median <= 10%, p90 <= 25%,
    and no file more than 3 points (median) worse than in-sample."""
    results = held_out_errors()
    assert sorted(results) == sorted(p.name for p in PROFILE_FILES)
    for name, r in results.items():
        assert name not in r["fitted_on"]
        (in_median, _), (median, p90) = r["in_sample"], r["held_out"]
        assert median <= 0.10, f"{name}: held-out median |error| {median:.3f}"
        assert p90 <= 0.25, f"{name}: held-out p90 |error| {p90:.3f}"
        assert median - in_median <= 0.03, f"{name}: held out {median:.3f} vs in-sample {in_median:.3f}"


def test_held_out_needs_another_file_of_the_same_gpu():
    h100_only = [p for p in PROFILE_FILES if p.name.startswith("h100")][:1]
    with pytest.raises(ValueError, match="only h100 file"):
        held_out_errors(h100_only, trials=1)


def test_profile_loader_reads_the_shape():
    prof = load_gpu_op_profile(op_profiles.profile_dir() / "a100_Meta-Llama-3-8B.csv")
    assert prof.hardware == "A100-80GB"
    assert (prof.cfg.hidden_size, prof.cfg.num_kv_heads, prof.cfg.intermediate_size) == (4096, 8, 14336)
    assert max(prof.num_tokens) == 32768
    assert prof.every(4).num_tokens == prof.num_tokens[::4]


def test_bad_profile_name_and_op_are_named():
    with pytest.raises(ValueError, match="path='tpu_x.csv'"):
        load_gpu_op_profile("tpu_x.csv")
    with pytest.raises(ValueError, match="'attention'"):
        linear_op_errors(PROFILE_FILES[0], ops=("attention",))
