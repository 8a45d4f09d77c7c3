"""Which inference batch sizes keep a GPU busy: one policy step per batch size, as served.

``python -m bench.gpu_inference [--repeats 30] [--rows 8,32,...]`` builds the default doom_basic
policy on the GPU as an inference worker does (``prepare_for_inference``) and times
``Policy.step`` on pinned host rows, the whole round trip an inference worker pays (upload,
normalizer, conv encoder in bfloat16 autocast, GRU and heads in float32, results back to the
host in one sync), at each batch size: the median milliseconds per pass and the rows served per
second, eagerly and replayed from CUDA graphs (``cuda_graphs``), the two timed in turn.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from sfbus_components.datapath.settings import DataPathParams, build_policy

DEFAULT_ROWS = "8,16,32,64,128,256,512,1024,2048,4096"
MODES = ("eager", "CUDA graphs")


def time_steps(rows: int, repeats: int) -> dict[str, float]:
    """Median seconds of one ``Policy.step`` over ``rows`` host rows on the GPU, per mode."""
    policies = {mode: build_policy(DataPathParams()).prepare_for_inference(
        device=torch.device("cuda"), cuda_graphs=mode == "CUDA graphs") for mode in MODES}
    shape = policies["eager"].obs_normalizer.stats["obs"].shape
    obs = {"obs": torch.randint(0, 256, (rows, *shape), dtype=torch.uint8).pin_memory()}
    rnn = torch.zeros(rows, policies["eager"].model.state_size).pin_memory()
    generator = torch.Generator("cuda").manual_seed(0)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with torch.inference_mode():
        for i in range(repeats + 3):  # three warm-ups: cuDNN picks its kernels, graphs capture
            for mode, policy in policies.items():
                start = time.perf_counter()
                policy.step(obs, rnn, generator=generator)  # ends in a sync
                if i >= 3:
                    times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(t) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Print ms per pass and rows per second at each batch size."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_inference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30, help="timed passes per batch size")
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated batch sizes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; default doom_basic "
          f"policy, median of {args.repeats}\n\n| rows | ms per pass, eager | rows/s, eager "
          "| ms per pass, CUDA graphs | rows/s, CUDA graphs |\n"
          "| ---: | ---: | ---: | ---: | ---: |")
    for rows in (int(r) for r in args.rows.split(",")):
        seconds = time_steps(rows, args.repeats)
        cells = " | ".join(f"{seconds[mode] * 1e3:.2f} | {rows / seconds[mode]:,.0f}"
                           for mode in MODES)
        print(f"| {rows} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
