"""Runs one KTIR function in ktir-cpu, as its run.py does, and also writes the per-core counters.

    python scripts/ktir-run.py KTIR_CPU_DIR KERNEL.mlir FUNC OUTDIR name=file.npy ...

Every array argument is written back as OUTDIR/<name>.npy; OUTDIR/latency.json holds ktir-cpu's
latency estimate (`kernel_cycles` of the slowest core, `bottleneck`, `kernel_time_us`) and, per
core in grid order, the bytes it moved between device memory and LX (`dram_bytes`), over the
ring (`comm_bytes`) and its matmul flops (`matmul_flops`), for `moek ktir-io --compare` to hold
against our simulator's counters. Exit 1 with the interpreter's message on any error (unknown
op, LX overflow, shape). Used by scripts/ktir-crosscheck; the interpreter stays outside the repo.
"""
import json
import os
import sys


def main() -> int:
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    ktir, src, func, outdir, *args = sys.argv[1:]
    sys.path.insert(0, os.path.join(ktir, "src"))
    import numpy as np
    from ktir_cpu import HardwareConfig, KTIRInterpreter

    kw = {}
    for a in args:
        k, v = a.split("=", 1)
        kw[k] = np.load(v) if v.endswith(".npy") else int(v)
    try:
        it = KTIRInterpreter(latency_config=HardwareConfig())
        it.load(src)
        outs = it.execute_function(func, **kw)
    except Exception as e:  # the interpreter's own errors, reported as they are
        print(f"ktir-cpu: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    os.makedirs(outdir, exist_ok=True)
    for k, v in outs.items():
        np.save(os.path.join(outdir, k + ".npy"), v)
    r = it.get_latency_report()
    cores = [
        {
            "dram_bytes": c.dram_bytes,
            "comm_bytes": c.comm_bytes,
            "matmul_flops": c.flops_by_category.get("compute_matmul", 0.0),
        }
        for _, c in sorted(r.counters.items())
    ]
    with open(os.path.join(outdir, "latency.json"), "w") as f:
        json.dump(
            {
                "kernel_cycles": max(c.total_cycles for c in r.counters.values()),
                "bottleneck": r.bottleneck,
                "kernel_time_us": r.kernel_time_us,
                "cores": cores,
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
