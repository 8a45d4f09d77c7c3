"""Table 1's rows as the paper prints them: env frames/s and the share of pure simulation, the
ratio to Sample Factory, and the goals this machine is held to."""

import argparse

from bench import paper_table
from bench.throughput_topologies import Window


def _window(rate: float) -> Window:
    return Window(frames=int(rate * 10), seconds=10.0, cpu={}, rss=0, pss=0)


RESULTS = {"atari_breakout": {"sim": _window(8000), "sf_train": _window(2000),
                              "train": _window(5000)},
           "doom_benchmark": {"sim": _window(20000), "train": _window(9000)}}


def test_rows_give_frames_and_the_share_of_pure_simulation() -> None:
    lines = paper_table.table(RESULTS).splitlines()
    assert lines[2] == "| Pure simulation | 8,000 (100.0%) | 20,000 (100.0%) |"
    assert lines[3] == "| Sample Factory 2.1.1 APPO | 2,000 (25.0%) |  |"
    assert lines[4] == "| sfbus | 5,000 (62.5%) | 9,000 (45.0%) |"
    assert lines[5] == "| sfbus / Sample Factory | 2.50x |  |"
    assert "135,893 (74.8%)" in lines[6] and "146,551 (45.4%)" in lines[6]


def test_goals_follow_the_machine(monkeypatch) -> None:
    monkeypatch.setattr(paper_table, "fast_bf16", lambda: False)
    assert paper_table.goals(RESULTS, gpu=False) == (
        "- Atari Breakout (84x84x4): 2.50x Sample Factory (goal on an AVX2-only CPU: 2x)")
    monkeypatch.setattr(paper_table, "fast_bf16", lambda: True)
    assert "goal on a CPU with fast bfloat16: 2.5x" in paper_table.goals(RESULTS, gpu=False)
    assert paper_table.goals(RESULTS, gpu=True) == (
        "- Atari Breakout (84x84x4): 62.5% of pure simulation (goal 80%), 2.50x Sample Factory "
        "(goal 1.5x)")


def test_an_emulated_avx2_machine_is_held_to_the_avx2_goal(monkeypatch) -> None:
    monkeypatch.setattr(paper_table, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert paper_table.fast_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not paper_table.fast_bf16()


def test_the_method_names_the_topology_that_trained() -> None:
    args = argparse.Namespace(workers=16, envs=16, seconds=30.0, warmup=8.0, gpu=True)
    text = paper_table.about(args)
    assert "`sfbus run topologies/doom_basic_gpu.yaml`" in text
    assert "--device=gpu" in text and "{" not in text
