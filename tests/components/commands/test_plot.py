"""``sfbus plot``: PNG figures from runs' progress.jsonl, resumed runs, bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from sfbus.cli import main
from sfbus_components.commands.plot import FIGURES, read_progress

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_progress(run_dir: Path, records: list[dict], tail: str = "") -> Path:
    """A run directory holding ``records`` as progress.jsonl (plus raw ``tail`` text)."""
    run_dir.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (run_dir / "progress.jsonl").write_text(lines + tail)
    return run_dir


def record(i: int, policies: int, reward_scale: float = 1.0) -> dict:
    """The stats actor's i-th report (every 2 s, 1000 frames each)."""
    return {"time": 2.0 * i, "env_frames": 1000 * i, "fps": {"10s": 500.0, "60s": 480.0},
            "policies": {str(p): {"episodes": i, "reward": reward_scale * i + p, "length": 9.0,
                                  "version": i, "lag": 1.0 + p, "policy_loss": 0.1}
                         for p in range(policies)}}


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header; fails if the file is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_two_runs_side_by_side(tmp_path, capsys):
    first = write_progress(tmp_path / "run_a", [record(i, 1) for i in range(1, 20)],
                           tail='{"time": 40.0, "env_fr')  # killed mid-write
    second = write_progress(tmp_path / "run_b", [record(i, 2, 2.0) for i in range(1, 10)])
    assert main(["plot", str(first), str(second)]) == 0
    out, err = capsys.readouterr()
    assert "skipped 1 unreadable line" in err
    for name in FIGURES:
        path = first / f"{name}.png"
        assert str(path) in out
        width, height = png_size(path)
        assert width >= 400 and height >= 300

    out_dir = tmp_path / "figures" / "new"
    assert main(["plot", str(second), "--out", str(out_dir)]) == 0
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(f"{n}.png" for n in FIGURES)


def test_a_resumed_run_continues_its_time_and_frames(tmp_path):
    records = [record(i, 1) for i in (1, 2, 3)] + [record(i, 1) for i in (1, 2)]
    run = read_progress(write_progress(tmp_path / "run", records))
    assert run.time == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert run.frames == [1000, 2000, 3000, 4000, 5000]
    assert run.series("0", "reward", "frames") == (run.frames, [1.0, 2.0, 3.0, 1.0, 2.0])
    assert run.fps == [500.0] * 5


def test_records_before_any_episode_and_an_empty_run_still_plot(tmp_path, capsys):
    run = write_progress(tmp_path / "early", [{"time": 2.0, "env_frames": 0, "fps": {},
                                                "policies": {}}])
    assert main(["plot", str(run)]) == 0
    for name in FIGURES:
        png_size(run / f"{name}.png")


@pytest.mark.parametrize("make", ["missing", "no_progress"])
def test_bad_run_dir_is_one_error_line_and_exit_2(tmp_path, capsys, make):
    run = tmp_path / "run"
    if make == "no_progress":
        run.mkdir()
    assert main(["plot", str(run)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and out == ""


def test_unusable_out_and_a_damaged_sweep_record_are_one_error_line(tmp_path, capsys):
    run = write_progress(tmp_path / "run", [record(i, 1) for i in range(3)])
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    cases = [  # each was a traceback with exit 1
        ((str(run), "--out", str(a_file)), f"--out {a_file}: cannot write the figures there"),
        ((str(run), "--out", str(a_file / "x")),
         f"--out {a_file / 'x'}: cannot write the figures there"),
    ]
    for damaged in ("garbage", '{"runs": 5}', '{"runs": [{"dir": "x"}]}', "[]"):
        cases.append(((str(sweep),), f"{sweep / 'sweep.json'}: not a sweep record of "
                                     "`sfbus sweep` (unreadable or damaged)\n"))
        (sweep / "sweep.json").write_text(damaged)
        for args, message in cases:
            assert main(["plot", *args]) == 2, (args, damaged)
            out, err = capsys.readouterr()
            assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
            assert out == ""
    assert not list(run.glob("*.png")) and a_file.read_text() == "x"


def test_a_record_whose_policy_is_not_a_mapping_is_skipped(tmp_path, capsys):
    run = write_progress(tmp_path / "run", [
        record(1, 1), {"time": 3.0, "env_frames": 1500, "policies": {"0": 7}},
        {"time": 4.0, "env_frames": 1600, "policies": {"0": {"reward": "high", "lag": 3.0}}}])
    assert main(["plot", str(run)]) == 0  # was: TypeError traceback
    assert "skipped 1 unreadable line(s)" in capsys.readouterr().err
    progress = read_progress(run)
    assert progress.series("0", "reward", "frames") == ([1000], [1.0])  # "high" is no number
    assert progress.series("0", "lag", "frames") == ([1000, 1600], [1.0, 3.0])
