"""Our cost model and ktir-cpu's latency estimate side by side on `moek tune`'s Spyre candidates.

    python3 scripts/ktir-rank.py KTIR_CPU_DIR --dims T=1,R=8,E=128,H=2816,F=704 [--pick N] [--out FILE]
    python3 scripts/ktir-rank.py KTIR_CPU_DIR --dims DIMS --lx-only SECONDS [--out FILE]
    python3 scripts/ktir-rank.py --report FILE...

The first form ranks every legal schedule of expert_ffn at DIMS (f16, spyre) by our cost model
(`moek tune --target spyre`), picks N of them evenly spaced over that ranking (best and worst
included), and runs each one's KTIR (`moek emit --specs`) in ktir-cpu on inputs moek draws
(`moek ktir-io`), holding its output to the f64 reference as the crosscheck does. One JSON line
per candidate goes to FILE as it finishes (schedule, our modeled ms, ktir-cpu's us, pass). The
second form runs every candidate KTIR renders, each for at most SECONDS, and records whether
the interpreter's LX cap refused it (a persistent loop's trips are alike, so a plan that has run
a few trips without overflowing will not overflow later). The third form prints the table and the rank correlations (Spearman's rho, Kendall's tau-b) of the
two models over the lines of each FILE (one op and size a file). Neither model is a measurement:
ktir-cpu's constants are uncalibrated (docs/ktir.md), so this compares rankings, not truths.
Needs a release build of moek; the interpreter stays outside the repository.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MOEK = os.path.join("target", "release", "moek")


def sh(*args, **kw):
    return subprocess.run(args, check=True, text=True, capture_output=True, **kw).stdout


def spec_text(name, dims, schedule):
    d = ", ".join(f"{k} = {v}" for k, v in (p.split("=") for p in dims.split(",")))
    lines = "".join(f"    {entry};\n" for entry in schedule.split("; "))
    return f"pub {name} = expert_ffn {{\n    dims: {d};\n    dtypes: f16;\n    targets: spyre;\n{lines}}}\n"


def rank(args):
    py = sh("bash", os.path.join(args.ktir, "setup.sh")).strip().splitlines()[-1]
    tuned = json.loads(sh(MOEK, "tune", "--op", "expert_ffn", "--dims", args.dims, "--dtype", "f16",
                          "--target", "spyre", "--format", "json", "--simulate", "0"))
    # The candidates KTIR can render (a refusal is counted by reason, never dropped unseen).
    renderable, refused = [], {}
    with tempfile.TemporaryDirectory() as work:
        for i, r in enumerate(tuned["ranked"]):
            specs = os.path.join(work, f"{i}.rs")
            with open(specs, "w") as f:
                f.write(spec_text(f"candidate_{i}", args.dims, r["schedule"]))
            emit = subprocess.run([MOEK, "emit", f"candidate_{i}", "--specs", specs, "--backend",
                                   "spyre", "--format", "ktir"], text=True, capture_output=True)
            if emit.returncode == 0:
                renderable.append((i, r))
            else:
                why = re.sub(r"\d+", "N", emit.stderr.split("program: ")[-1].strip())
                refused[why] = refused.get(why, 0) + 1
    print(f"{args.dims}: {len(tuned['ranked'])} legal schedules, {len(renderable)} rendered as KTIR",
          flush=True)
    for why, count in refused.items():
        print(f"  not rendered {count:>4}: {why}", flush=True)
    n = len(renderable) if args.lx_only else min(args.pick, len(renderable))
    picks = sorted({round(k * (len(renderable) - 1) / max(n - 1, 1)) for k in range(n)})
    print(f"running our ranks {[renderable[k][0] for k in picks]} in ktir-cpu", flush=True)
    for k in picks:
        i, r = renderable[k]
        name = f"candidate_{i}"
        with tempfile.TemporaryDirectory() as work:
            specs = os.path.join(work, "spec.rs")
            with open(specs, "w") as f:
                f.write(spec_text(name, args.dims, r["schedule"]))
            program = os.path.join(work, "k.mlir")
            with open(program, "w") as f:
                f.write(sh(MOEK, "emit", name, "--specs", specs, "--backend", "spyre", "--format", "ktir"))
            io = sh(MOEK, "ktir-io", name, "--specs", specs, "--dir", os.path.join(work, "in")).split()
            out = os.path.join(work, "out")
            start = time.time()
            line = {"dims": args.dims, "rank": i, "schedule": r["schedule"], "ours_ms": r["figure"]}
            try:
                ran = subprocess.run([py, "scripts/ktir-run.py", args.ktir, program, name, out, *io],
                                     text=True, capture_output=True, timeout=args.lx_only)
            except subprocess.TimeoutExpired:
                line.update(lx="no overflow", ran_s=args.lx_only)
                ran = None
            wall = time.time() - start
            line["wall_s"] = round(wall)
            if ran is None:
                pass
            elif "LX scratchpad overflow" in ran.stderr:
                line.update(lx="overflow", ktir_us=None, passed=False, error=ran.stderr.strip()[-200:])
            elif args.lx_only and ran.returncode == 0:
                line.update(lx="no overflow", ran_s=round(wall))
            elif ran.returncode != 0:
                line.update(ktir_us=None, passed=False, error=ran.stderr.strip()[-300:])
            else:
                cmp = subprocess.run([MOEK, "ktir-io", name, "--specs", specs, "--dir",
                                      os.path.join(work, "in"), "--compare", out],
                                     text=True, capture_output=True)
                latency = json.load(open(os.path.join(out, "latency.json")))
                line.update(ktir_us=latency["kernel_time_us"], passed=cmp.returncode == 0)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")


def ranks(xs):
    """Average ranks (ties share the mean of their positions)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def pearson(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a) ** 0.5
    vb = sum((y - mb) ** 2 for y in b) ** 0.5
    return float("nan") if va == 0 or vb == 0 else cov / (va * vb)


def kendall_b(a, b):
    conc = disc = ta = tb = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ta += 1
            elif db == 0:
                tb += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + ta) * (conc + disc + tb)) ** 0.5
    return float("nan") if denom == 0 else (conc - disc) / denom


def correlations(rows):
    ours = [r["ours_ms"] for r in rows]
    theirs = [r["ktir_us"] for r in rows]
    return pearson(ranks(ours), ranks(theirs)), kendall_b(ours, theirs)


def report(files):
    for path in files:
        rows = [json.loads(l) for l in open(path) if l.strip()]
        done = [r for r in rows if r.get("ktir_us") is not None]
        print(f"{path}: {rows[0]['dims'] if rows else ''}")
        print("| rank | schedule | ours (ms) | ktir-cpu (us) | numerics | wall (s) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            sched = re.sub(r"; requires: [a-z_, ]+", "", r["schedule"].replace("select: ", ""))
            if r.get("ktir_us") is not None:
                k, ok = f"{r['ktir_us']:.0f}", "pass" if r["passed"] else "FAIL"
            elif r.get("lx") == "no overflow":
                k, ok = f"no LX overflow in {r['ran_s']:.0f} s", "not compared"
            else:
                k, ok = "stopped: " + r.get("error", "").split(": ", 1)[-1], "FAIL"
            print(f"| {r['rank']} | {sched} | {r['ours_ms']:.3f} | {k} | {ok} | {r['wall_s']} |")
        if len(done) >= 2:
            rho, tau = correlations(done)
            spread = max(r["ours_ms"] for r in done) / min(r["ours_ms"] for r in done) - 1
            print(f"{len(done)} candidates run: Spearman rho {rho:.3f}, Kendall tau-b {tau:.3f} "
                  f"(our model's figures spread {spread:.2%})\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ktir", nargs="?")
    ap.add_argument("--dims")
    ap.add_argument("--pick", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--lx-only", type=float)
    ap.add_argument("--report", nargs="+")
    args = ap.parse_args()
    if args.report:
        report(args.report)
    elif args.ktir and args.dims:
        args.ktir = os.path.abspath(args.ktir)
        rank(args)
    else:
        ap.error("give KTIR_CPU_DIR and --dims, or --report FILE...")


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
